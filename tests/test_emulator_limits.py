"""The emulator under hostile clients: an unparseable request answers SGLang's JSON error,
slow sockets neither exhaust its file handles nor stop /health, and a connection that never
finishes its headers is closed."""

from __future__ import annotations

import json
import os
import resource
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def start_emulator(tmp_path: Path, *, prelude: str = "", files: int | None = None):
    code = (f"{prelude}\nimport sys\nfrom dynspec.cli import main\n"
            "sys.exit(main(['emulate', '--profile', 'seed-blackwell', '--arm', 'baseline', '--port', '0']))")

    def limit():  # the emulator's file handles, soft and hard: it cannot raise them
        if files is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (files, files))

    err = (tmp_path / "emulator.err").open("wb")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=err, text=True, cwd=ROOT,
                            preexec_fn=limit, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    line = proc.stdout.readline()
    assert "ready on" in line, (tmp_path / "emulator.err").read_text()
    return proc, int(line.split("http://127.0.0.1:")[1].split()[0])


def stop(proc) -> None:
    proc.terminate()
    proc.wait(20)
    proc.stdout.close()


def health(port: int, timeout: float = 5.0) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=timeout) as r:
        return r.status


def test_an_8kb_url_and_a_broken_header_answer_sglangs_json_error(tmp_path):
    """Refused by the HTTP parser, they used to get aiohttp's plain text and a logged traceback."""
    proc, port = start_emulator(tmp_path)
    try:
        for raw in (b"GET /" + b"a" * 8192 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
                    b"GET /health HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n"):
            with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                s.sendall(raw)
                answer = b""
                while chunk := s.recv(65536):
                    answer += chunk
            head, _, body = answer.partition(b"\r\n\r\n")
            assert head.split(b" ")[1] == b"400", head
            assert b"application/json" in head, head
            assert json.loads(body)["error"]["message"].startswith("400 Bad Request: ")
        assert health(port) == 200
    finally:
        stop(proc)
    assert "Traceback" not in (tmp_path / "emulator.err").read_text()


def test_slow_sockets_beyond_the_file_limit_leave_health_answering_and_the_log_short(tmp_path):
    """Half-sent requests used to hold every file handle: accept() failed, /health with it, and
    the log grew by a traceback per attempt."""
    files, slow = 256, 600
    proc, port = start_emulator(tmp_path, files=files)
    socks = []
    try:
        for _ in range(slow):
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ")  # never finished
            socks.append(s)
        assert health(port, timeout=5) == 200
        # A request under way is never cut to make room.
        with urllib.request.urlopen(urllib.request.Request(
                f"http://127.0.0.1:{port}/generate", data=json.dumps(
                    {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 8}}).encode(),
                headers={"Content-Type": "application/json"}), timeout=20) as r:
            assert json.loads(r.read())["meta_info"]["completion_tokens"] == 8
    finally:
        for s in socks:
            s.close()
        stop(proc)
    assert (tmp_path / "emulator.err").stat().st_size < 20_000


def test_a_connection_that_never_finishes_its_headers_is_closed(tmp_path):
    prelude = "import dynspec.sim.emulator.limits as limits\nlimits.HEADER_TIMEOUT_S = 1.0"
    proc, port = start_emulator(tmp_path, prelude=prelude)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
            t0 = time.monotonic()
            try:
                assert s.recv(1024) == b""  # closed by the server
            except ConnectionResetError:
                pass
            assert time.monotonic() - t0 < 5
    finally:
        stop(proc)

