"""Many slow sockets against the emulator: each sends half a request's headers and never the rest.
The emulator keeps answering /health and serving a request while they stay open.

One emulator (seed-blackwell, baseline) on its own file limit; `--clients` processes open the
sockets between them (one process cannot hold more than its own file limit), then this process
times /health and one /generate, then everything is closed.

    .venv/bin/python benchmarks/slow_sockets.py [--sockets 20000] [--clients 2]

Prints the sockets held, /health's status and latency, the request's tokens and the emulator's
log size; exit status 1 when /health or the request failed.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def hold(port: int, n: int, ready, release) -> None:
    """Open n slow sockets, report how many, keep them until told."""
    socks = []
    try:
        for _ in range(n):
            s = socket.create_connection(("127.0.0.1", port), timeout=30)
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ")  # never finished
            socks.append(s)
    except OSError as exc:
        print(f"client stopped at {len(socks)} sockets: {exc}", file=sys.stderr)
    ready.put(len(socks))
    release.wait()
    for s in socks:
        s.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sockets", type=int, default=20_000)
    ap.add_argument("--clients", type=int, default=2)
    args = ap.parse_args()
    if args.sockets < 1 or args.clients < 1:
        ap.error("--sockets and --clients must be at least 1")
    log = Path(os.environ.get("TMPDIR", "/tmp")) / f"slow-sockets-emulator-{os.getpid()}.err"
    code = ("import sys\nfrom dynspec.cli import main\n"
            "sys.exit(main(['emulate', '--profile', 'seed-blackwell', '--arm', 'baseline', '--port', '0']))")
    with log.open("wb") as err:
        emu = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=err, text=True, cwd=ROOT)
    assert emu.stdout is not None
    line = emu.stdout.readline()
    if "ready on" not in line:
        print(f"slow_sockets: the emulator did not start: {log.read_text()[-500:]}", file=sys.stderr)
        return 1
    port = int(line.split("http://127.0.0.1:")[1].split()[0])
    ready, release = mp.Queue(), mp.Event()
    share = [args.sockets // args.clients + (i < args.sockets % args.clients) for i in range(args.clients)]
    procs = [mp.Process(target=hold, args=(port, n, ready, release)) for n in share]
    t0 = time.monotonic()
    for p in procs:
        p.start()
    held = sum(ready.get(timeout=600) for _ in procs)
    opened_s = time.monotonic() - t0
    ok = True
    try:
        t1 = time.monotonic()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as r:
            status = r.status
        health_s = time.monotonic() - t1
        body = json.dumps({"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 8}}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/generate", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            tokens = json.loads(r.read())["meta_info"]["completion_tokens"]
    except OSError as exc:
        print(f"slow_sockets: with {held} slow sockets open: {exc}", file=sys.stderr)
        status, health_s, tokens, ok = None, None, None, False
    finally:
        release.set()
        for p in procs:
            p.join(60)
        emu.terminate()
        emu.wait(30)
    print(f"slow sockets held: {held} of {args.sockets} (opened in {opened_s:.1f} s by {args.clients} clients)")
    if ok:
        print(f"/health: {status} in {health_s:.3f} s; /generate: {tokens} tokens")
    print(f"emulator log: {log.stat().st_size} bytes ({log})")
    return 0 if ok and status == 200 and tokens == 8 else 1


if __name__ == "__main__":
    sys.exit(main())
