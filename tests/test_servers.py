"""Server orchestration with real subprocesses on loopback: start, health, scrape, stop."""

from __future__ import annotations

import math
import os
import sys
import textwrap
import time

import pytest

from dynspec.live.servers import (ArmServer, ServerError, Snapshot, emulator_argv, fill_placeholders, free_port,
                             level_counters, parse_prometheus)

PY = sys.executable


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purposes.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_dead(pid: int, timeout: float = 5.0) -> bool:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return False


# A minimal HTTP server: /health answers 200 after `ready_after` seconds; it forks a
# grandchild (as SGLang forks its scheduler processes) and writes the grandchild's pid.
HTTP_SERVER = textwrap.dedent("""
    import http.server, os, signal, subprocess, sys, time
    port, ready_after, pidfile, ignore_term = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3], sys.argv[4] == "1"
    if ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    open(pidfile, "w").write(str(child.pid))
    t0 = time.monotonic()
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            ok = time.monotonic() - t0 >= ready_after
            body = b"ok" if ok else b"loading"
            if self.path == "/metrics":
                body = b"# HELP x\\ndynspec_steps_speculative_total 7\\nsglang:num_running_reqs{tp=\\"0\\"} 3\\n"
            self.send_response(200 if ok else 503)
            self.end_headers()
            self.wfile.write(body)
        def log_message(self, *a):
            print("request", self.path, flush=True)
    print("serving on", port, flush=True)
    http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
""")


def http_server(tmp_path, *, ready_after=0.0, ignore_term=False, **kw) -> ArmServer:
    script = tmp_path / "srv.py"
    script.write_text(HTTP_SERVER)
    port = free_port()
    argv = [PY, str(script), str(port), str(ready_after), str(tmp_path / "child.pid"), "1" if ignore_term else "0"]
    return ArmServer("fake", argv, port=port, log_path=tmp_path / "logs" / "fake.log", **kw)


def test_start_health_scrape_stop_reaches_the_whole_process_group(tmp_path):
    srv = http_server(tmp_path, ready_after=0.5, env={"DYNSPEC_TEST_VAR": "hello"}, startup_timeout=20)
    srv.start()
    try:
        waited = srv.wait_healthy()
        assert waited >= 0.4 and srv.alive()
        snap = srv.scrape()
        assert snap.metrics["dynspec_steps_speculative_total"] == 7
        assert snap.running == 3
        assert "/get_server_info" not in snap.error or snap.server_info is None
        grandchild = int((tmp_path / "child.pid").read_text())
        assert alive(grandchild)
    finally:
        code = srv.stop()
    assert code is not None and not srv.alive()
    assert wait_dead(grandchild), "the server's own child outlived stop()"
    log = (tmp_path / "logs" / "fake.log").read_text()
    assert "# dynspec command: " in log and "serving on" in log and "request /health" in log
    assert '"DYNSPEC_TEST_VAR": "hello"' in log


def test_sigkill_after_grace_when_sigterm_is_ignored(tmp_path):
    srv = http_server(tmp_path, ignore_term=True, shutdown_grace=0.5, startup_timeout=20)
    srv.start()
    srv.wait_healthy()
    t0 = time.monotonic()
    code = srv.stop()
    assert code == -9 and 0.4 <= time.monotonic() - t0 < 5


def test_never_healthy_times_out(tmp_path):
    srv = http_server(tmp_path, ready_after=60, startup_timeout=1.0)
    srv.start()
    try:
        with pytest.raises(ServerError, match=r"arm fake: not healthy after 1s"):
            srv.wait_healthy()
    finally:
        srv.stop()


def test_server_that_exits_is_reported_with_its_log(tmp_path):
    srv = ArmServer("dies", [PY, "-c", "print('CUDA out of memory'); raise SystemExit(3)"], port=free_port(),
                    log_path=tmp_path / "dies.log", startup_timeout=20)
    srv.start()
    with pytest.raises(ServerError, match=r"arm dies: server exited with code 3 before becoming healthy "
                                          r"\(log: CUDA out of memory\)"):
        srv.wait_healthy()
    srv.stop()


def test_missing_program_is_a_clear_error(tmp_path):
    srv = ArmServer("x", ["/nonexistent/python", "-m", "sglang.launch_server"], port=free_port(),
                    log_path=tmp_path / "x.log")
    with pytest.raises(ServerError, match=r"arm x: cannot start '/nonexistent/python'"):
        srv.start()


def test_fill_placeholders_leaves_other_arguments_untouched():
    argv = ["python", "-m", "sglang.launch_server", "--model-path", "{model}", "--port", "{port}",
            "--nnodes", "2", "--node-rank", "1", "--dist-init-addr", "10.0.0.1:5000", "--json", "{\"a\": 1}"]
    out = fill_placeholders(argv, {"model": "/m", "port": "31000", "draft_model": "/d", "host": "h"})
    assert out == ["python", "-m", "sglang.launch_server", "--model-path", "/m", "--port", "31000",
                   "--nnodes", "2", "--node-rank", "1", "--dist-init-addr", "10.0.0.1:5000", "--json", "{\"a\": 1}"]


def test_parse_prometheus_sums_label_sets():
    text = ('# TYPE a counter\na_total 1\na_total{x="1"} 2.5\nsglang:num_running_reqs{tp_rank="0",m="a b"} 4\n'
            'bad line here\nspaced{l="}"} 1e3\n')
    m = parse_prometheus(text)
    assert m["a_total"] == 3.5 and m["sglang:num_running_reqs"] == 4 and m["spaced"] == 1000


def test_parse_prometheus_keeps_each_category_of_gpu_time():
    # SGLang's device timer: GPU seconds per forward mode, one series per category (and TP rank).
    text = ('sglang:gpu_execution_seconds_total{model_name="m",tp_rank="0",category="forward_extend"} 2.5\n'
            'sglang:gpu_execution_seconds_total{model_name="m",tp_rank="1",category="forward_extend"} 0.5\n'
            'sglang:gpu_execution_seconds_total{model_name="m",tp_rank="0",category="forward_decode"} 7\n')
    m = parse_prometheus(text)
    assert m["sglang:gpu_execution_seconds_total"] == 10
    assert m["sglang:gpu_execution_seconds_total{forward_extend}"] == 3
    assert m["sglang:gpu_execution_seconds_total{forward_decode}"] == 7
    assert not any("{" in k for k in parse_prometheus('a{x="1"} 1\n'))  # other labels: summed only


def test_level_counters_from_snapshots():
    def snap(spec, plain, sw, acc=None, via="info"):
        info = {"internal_states": [{"avg_spec_accept_length": acc}] if acc else [{}]}
        metrics = {}
        if via == "info":  # where the patched SGLang reports them
            info["internal_states"][0]["dynspec"] = {"policy": "goodput", "steps_spec": spec, "steps_plain": plain,
                                                     "switches": sw}
        else:
            metrics = {"dynspec_steps_speculative_total": spec, "dynspec_steps_plain_total": plain,
                       "dynspec_switches_total": sw}
        return Snapshot(0.0, info, metrics)

    for via in ("info", "metrics"):
        c = level_counters(snap(10, 5, 1, via=via), snap(40, 65, 4, acc=2.5, via=via), accept_reset=True)
        assert c == {"accept_length": 2.5, "spec_step_fraction": 30 / 90, "switches": 3}
    plain = level_counters(Snapshot(0.0, {}), Snapshot(0.0, {}), accept_reset=False)
    assert all(math.isnan(v) for v in plain.values())
    # Disaggregated servers: bench_serving reads the decode server's view; so do we.
    assert Snapshot(0.0, {"decode": [{"internal_states": [{"avg_spec_accept_length": 3.1}]}]}).accept_length == 3.1


# With the emulator ----------------------------------------------------------------------

def test_emulator_as_an_arm_server(tmp_path):
    port = free_port()
    srv = ArmServer("emu", emulator_argv("seed-blackwell", "dynamic", "127.0.0.1", port, 0.05, 0),
                    port=port, log_path=tmp_path / "emu.log", startup_timeout=60, shutdown_grace=10)
    with srv:
        srv.wait_healthy()
        snap = srv.scrape()
        assert snap.error == "", snap.error
        block = snap.server_info["internal_states"][0]["dynspec"]
        assert block["policy"].startswith("goodput") and block["mode"] in ("spec", "plain")
        assert snap.counter("steps_spec") == block["steps_spec"]
        assert "dynspec_steps_plain_total" in snap.metrics
        pid = srv.proc.pid
    assert not srv.alive() and srv.returncode is not None and wait_dead(pid)


def test_quiet_ports_are_free_distinct_and_outside_the_ephemeral_range(monkeypatch):
    import random
    import socket

    from dynspec.live import servers

    ports = [servers.quiet_port() for _ in range(20)]
    assert len(set(ports)) == 20 and all(20000 <= p < 32000 for p in ports)
    # A port in use is skipped; one handed out before is never handed out again.
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    taken = busy.getsockname()[1]
    picks = iter([taken, ports[0], 25001, 25002])
    monkeypatch.setattr(random, "randrange", lambda lo, hi: next(picks))
    try:
        got = servers.quiet_port()
    finally:
        busy.close()
    assert got in (25001, 25002) and got not in ports
