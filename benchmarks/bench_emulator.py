"""Emulator benchmarks: streaming capacity, and agreement with the simulator.

Targets:
  capacity   at C=128, with a time-scale so high that the server is the limit, the
             emulator streams at least 20k tokens/s on one core;
  agreement  at time-scale 1 its measured output throughput agrees with `dynspec sim`
             on the same profile within 5% at every concurrency.

The emulator runs as `dynspec emulate` in its own process (one asyncio thread, so at
most one core).  Agreement loads it with dynspec's own closed-loop client (dynspec.live.bench),
as a sweep does; capacity with a leaner client that does not parse events, so that on
this 2-core machine the server, not the client, is the bottleneck.

    .venv/bin/python benchmarks/bench_emulator.py capacity [--concurrency 128] [--api generate|openai]
    .venv/bin/python benchmarks/bench_emulator.py agreement [--profile seed-blackwell] [--arm baseline]
        [--concurrency 1,2,4,8,16,32,64,128] [--output-len 64]

Exit status 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
from contextlib import contextmanager

from dynspec.live.bench import random_prompts, run_level
from dynspec.sim.profile import load_profile
from dynspec.results import summarize
from dynspec.sim.run import simulate_level

CAPACITY_TARGET = 20_000.0
AGREEMENT_TARGET = 0.05


@contextmanager
def emulator(profile: str, arm: str, time_scale: float, seed: int = 0):
    """A `dynspec emulate` process on a free loopback port; yields (base_url, pid)."""
    cmd = [sys.executable, "-m", "dynspec", "emulate", "--profile", profile, "--arm", arm, "--port", "0",
           "--time-scale", repr(time_scale), "--seed", str(seed)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = proc.stdout.readline()
        m = re.search(r"ready on (http://\S+)", line)
        if not m:
            raise RuntimeError(f"emulator did not start: {line.strip()} {proc.stdout.read()[:500]}")
        yield m.group(1), proc.pid
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc (Linux)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


_TOKENS = re.compile(rb'"completion_tokens":\s*(\d+)')


async def _lean_worker(host: str, port: int, path: str, bodies, counts: list[int]) -> None:
    """Closed-loop requests on one keep-alive connection, reading the chunked stream in bulk.

    A load generator light enough that the server, not the client, is the bottleneck: it
    does not parse events, only finds the last completion_tokens of each response.
    """
    import asyncio

    reader, writer = await asyncio.open_connection(host, port)
    try:
        for body in bodies:
            writer.write(b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (path.encode(), host.encode(), len(body), body))
            head = await reader.readuntil(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(f"server answered {head.splitlines()[0]!r}")
            tail = b""
            while True:
                size = int((await reader.readline()).split(b";")[0], 16)
                if size == 0:
                    await reader.readline()
                    break
                tail = (tail + await reader.readexactly(size + 2))[-4096:]
            counts.append(int(_TOKENS.findall(tail)[-1]))
    finally:
        writer.close()


def lean_level(url: str, api: str, n: int, c: int, input_len: int, output_len: int) -> tuple[int, float]:
    """n streamed requests at concurrency c with the lean client; (tokens, wall seconds)."""
    import asyncio
    import json
    from urllib.parse import urlsplit

    u = urlsplit(url)
    ids = list(range(1000, 1000 + input_len))
    if api == "generate":
        path, body = "/generate", {"input_ids": ids, "stream": True,
                                   "sampling_params": {"max_new_tokens": output_len, "ignore_eos": True}}
    else:
        path, body = "/v1/completions", {"prompt": ids, "max_tokens": output_len, "stream": True,
                                         "ignore_eos": True, "stream_options": {"include_usage": True,
                                                                                 "continuous_usage_stats": True}}
    raw = json.dumps(body).encode()
    per = [n // c + (i < n % c) for i in range(c)]

    async def level() -> tuple[int, float]:
        counts: list[int] = []
        t0 = time.perf_counter()
        await asyncio.gather(*(_lean_worker(u.hostname, u.port, path, [raw] * k, counts) for k in per if k))
        return sum(counts), time.perf_counter() - t0

    return asyncio.run(level())


def capacity(args) -> int:
    c = args.concurrency
    n = args.num_prompts or 4 * c
    with emulator(args.profile, args.arm, args.time_scale) as (url, pid):
        lean_level(url, args.api, c, c, args.input_len, 8)  # warm-up: connections, text tables
        cpu0 = cpu_seconds(pid)
        tokens, wall = lean_level(url, args.api, n, c, args.input_len, args.output_len)
        cpu = cpu_seconds(pid) - cpu0
    tps = tokens / wall
    ok = tps >= CAPACITY_TARGET and tokens == n * args.output_len
    print(f"capacity: profile {args.profile}, arm {args.arm}, api {args.api}, C={c}, "
          f"{n} requests x {args.output_len} tokens, time-scale {args.time_scale:g}")
    print(f"  streamed {tokens} tokens in {wall:.2f} s: {tps:,.0f} tokens/s; server CPU {cpu:.2f} s "
          f"({100 * cpu / wall:.0f}% of one core, {tokens / cpu:,.0f} tokens per CPU-second)")
    print(f"{'PASS' if ok else 'FAIL'}: >= {CAPACITY_TARGET:,.0f} streamed tokens/s at C={c}")
    return 0 if ok else 1


def agreement(args) -> int:
    profile = load_profile(args.profile)
    levels = [int(x) for x in args.concurrency.split(",")]
    ok = True
    print(f"agreement: profile {args.profile}, arm {args.arm}, time-scale {args.time_scale:g}, "
          f"{args.input_len} in / {args.output_len} out")
    print(f"{'C':>5s} {'prompts':>7s} {'sim tok/s':>10s} {'emulated':>10s} {'diff':>7s}")
    for c in levels:
        n = args.num_prompts or max(2 * c, 8)
        sim, _ = simulate_level(profile, args.arm, c, num_prompts=n, input_len=args.input_len,
                                output_len=args.output_len, seed=args.seed)
        # A fresh server per level, as the simulator starts each level from scratch.
        with emulator(args.profile, args.arm, args.time_scale, args.seed) as (url, _pid):
            res = run_level(url, random_prompts(n, args.input_len, args.output_len, seed=args.seed), c)
        emu = summarize(res.requests)
        # Virtual seconds run time_scale times faster on the wall clock.
        emu_tps = emu["output_throughput"] / args.time_scale
        diff = emu_tps / sim["output_throughput"] - 1.0
        good = abs(diff) <= AGREEMENT_TARGET and emu["failed"] == 0
        ok &= good
        print(f"{c:5d} {n:7d} {sim['output_throughput']:10.1f} {emu_tps:10.1f} {100 * diff:+6.2f}%"
              + ("" if good else "  !"))
    print(f"{'PASS' if ok else 'FAIL'}: emulated within {AGREEMENT_TARGET:.0%} of simulated at every level")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    c = sub.add_parser("capacity")
    c.add_argument("--profile", default="seed-blackwell")
    c.add_argument("--arm", default="baseline")
    c.add_argument("--api", default="generate", choices=["generate", "openai"])
    c.add_argument("--concurrency", type=int, default=128)
    c.add_argument("--num-prompts", type=int, default=None, help="default 4*C")
    c.add_argument("--input-len", type=int, default=128)
    c.add_argument("--output-len", type=int, default=256)
    c.add_argument("--time-scale", type=float, default=1e6)
    c.set_defaults(func=capacity)
    a = sub.add_parser("agreement")
    a.add_argument("--profile", default="seed-blackwell")
    a.add_argument("--arm", default="baseline")
    a.add_argument("--concurrency", default="1,2,4,8,16,32,64,128")
    a.add_argument("--num-prompts", type=int, default=None, help="default max(2*C, 8)")
    a.add_argument("--input-len", type=int, default=1024)
    a.add_argument("--output-len", type=int, default=64)
    a.add_argument("--time-scale", type=float, default=1.0)
    a.add_argument("--seed", type=int, default=0)
    a.set_defaults(func=agreement)
    args = ap.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
