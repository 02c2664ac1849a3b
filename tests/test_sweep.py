"""`dynspec sweep` end to end: emulated arms started by the orchestration code as real
subprocesses on loopback, failures injected by killing and interrupting real processes."""

from __future__ import annotations

import csv
import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from dynspec.live.config import ConfigError, load_config, parse_config
from dynspec.results import RESULT_COLUMNS, read_table
from dynspec.live.sweep import SweepError, level_seed, run_sweep

ROOT = Path(__file__).resolve().parents[1]
CI_TINY = ROOT / "configs" / "ci-tiny.yaml"



def rows_of(run_dir: Path) -> list[dict]:
    with (run_dir / "results.csv").open(newline="") as f:
        return list(csv.DictReader(f))


def by_key(rows):
    return {(r["arm"], int(r["concurrency"]), int(r["repeat"])): r for r in rows}


def cfg_file(tmp_path: Path, **changes) -> Path:
    data = yaml.safe_load(CI_TINY.read_text())
    data.update(changes)
    p = tmp_path / "cfg.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def cli(*args, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dynspec", "sweep", *args], capture_output=True, text=True,
                          timeout=kw.pop("timeout", 180), cwd=ROOT, **kw)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except (ProcessLookupError, FileNotFoundError):
        return False


def test_full_two_arm_sweep_with_emulated_servers(tmp_path):
    runs = tmp_path / "runs"
    p = cli("--config", str(CI_TINY), "--run-id", "tiny", "--runs-dir", str(runs), "--no-progress")
    assert p.returncode == 0, p.stderr
    run = runs / "tiny"
    assert f"{run}: 4 rows, complete" in p.stdout.splitlines()

    # The layout the pipeline reads.
    for rel in ("config.yaml", "run.json", "environment.json", "results.csv", "sweep.log", "logs/baseline.log",
                "logs/eagle3.log"):
        assert (run / rel).is_file(), rel
    assert load_config(run / "config.yaml") == load_config(CI_TINY)
    info = json.loads((run / "run.json").read_text())
    assert info["status"] == "complete" and info["backend"] == "emulate" and info["profile"] == "seed-blackwell"
    assert set(info["servers"]) == {"baseline", "eagle3"}
    assert all(s["exit_code"] is not None and not alive(s["pid"]) for s in info["servers"].values())
    env = json.loads((run / "environment.json").read_text())
    assert "gpu" in env and "packages" in env
    if not env["gpu"]["available"]:
        assert env["gpu"]["note"].startswith("no GPU")

    df = read_table(run / "results.csv")
    assert list(df.columns) == RESULT_COLUMNS
    assert sorted(zip(df.arm, df.concurrency)) == [("baseline", 1), ("baseline", 4), ("eagle3", 1), ("eagle3", 4)]
    assert (df.completed == 8).all() and (df.failed == 0).all() and (df.error == "").all()
    assert (df.total_output_tokens == 8 * 16).all() and (df.total_input_tokens == 8 * 64).all()
    assert (df.output_throughput > 0).all() and (df.run_id == "tiny").all() and (df.backend == "emulate").all()
    # every level a closed loop of more requests than clients: a steady window, shorter than the level
    assert (df.steady_output_throughput > 0).all() and (df.steady_s < df.duration_s).all()
    base, eagle = df[df.arm == "baseline"], df[df.arm == "eagle3"]
    assert set(base.policy) == {"none"} and set(eagle.policy) == {"always"}
    # Counters scraped around each level: the eagle3 emulator speculates every step, baseline never.
    assert (eagle.spec_step_fraction == 1.0).all() and (base.spec_step_fraction == 0.0).all()
    assert (eagle.accept_length > 1.0).all() and base.accept_length.isna().all()
    for arm, c in zip(df.arm, df.concurrency):
        lines = (run / "requests" / f"{arm}_c{c}_r0.jsonl").read_text().splitlines()
        assert len(lines) == 8 and json.loads(lines[0])["output_tokens"] == 16
        scrape = json.loads((run / "scrapes" / f"{arm}_c{c}_r0.json").read_text())
        assert scrape["accept_counters_reset"] is True and scrape["after"]["server_info"]["internal_states"][0]["dynspec"]
    assert "dynspec emulate: ready" in (run / "logs" / "eagle3.log").read_text()  # the server's log, teed

    # It ends with a table of what it measured and the next command.
    assert re.search(r"^output tok/s\narm\s+baseline\s+eagle3\nlevel\s*\nC=1\s+[\d.]+\s+[\d.]+\nC=4", p.stdout, re.M), \
        p.stdout
    assert p.stdout.rstrip().endswith(f"next: dynspec report {run}")
    # The same run again without --resume is refused; with --resume there is nothing to do.
    p = cli("--config", str(CI_TINY), "--run-id", "tiny", "--runs-dir", str(runs), "--no-progress")
    assert p.returncode == 2 and "run folder exists; pass --resume" in p.stderr
    before = (run / "results.csv").read_bytes()
    p = cli("--config", str(CI_TINY), "--run-id", "tiny", "--runs-dir", str(runs), "--no-progress", "--resume")
    assert p.returncode == 0, p.stderr
    assert (run / "results.csv").read_bytes() == before


def test_server_killed_mid_level_keeps_measured_rows_and_moves_on(tmp_path):
    cfg = load_config(cfg_file(tmp_path, num_prompts=24, output_len=64, emulate={"time_scale": 10.0},
                               arms=[{"name": "victim", "sim_arm": "baseline"},
                                     {"name": "next", "sim_arm": "baseline"}]))
    runs = tmp_path / "runs"
    run = runs / "kill"
    killed = {}

    def killer():
        # Once the first level's row is on disk and the server holds the second level's
        # requests (it says so on /metrics), kill it: mid-level, for sure.
        from dynspec.live.servers import parse_prometheus

        t0 = time.monotonic()
        while time.monotonic() - t0 < 60:
            time.sleep(0.02)
            if not ((run / "results.csv").exists() and len(rows_of(run)) >= 1):
                continue
            server = json.loads((run / "run.json").read_text())["servers"]["victim"]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{server['port']}/metrics", timeout=2) as r:
                    running = parse_prometheus(r.read().decode())["sglang:num_running_reqs"]
            except OSError:
                continue
            if running >= 3:
                os.kill(server["pid"], signal.SIGKILL)
                killed["pid"] = server["pid"]
                return

    t = threading.Thread(target=killer)
    t.start()
    result = run_sweep(cfg, run_id="kill", runs_dir=runs, progress=False)
    t.join()
    assert killed, "the killer never fired"
    assert result.failed and result.rows == 4
    rows = by_key(rows_of(run))
    first, second = rows[("victim", 1, 0)], rows[("victim", 4, 0)]
    assert first["error"] == "" and int(first["completed"]) == 24  # measured before the kill: kept
    assert "server exited with code -9" in second["error"]
    assert int(second["completed"]) < 24
    assert all(rows[("next", c, 0)]["error"] == "" and int(rows[("next", c, 0)]["completed"]) == 24 for c in (1, 4))
    info = json.loads((run / "run.json").read_text())
    assert info["status"] == "failed" and info["servers"]["victim"]["exit_code"] == -9
    assert "ERROR victim_c4_r0: server exited with code -9" in (run / "sweep.log").read_text()

    # --resume measures the failed level again; the failed row is kept in failures.csv.
    result = run_sweep(cfg, run_id="kill", runs_dir=runs, progress=False, resume=True)
    assert not result.failed and result.rows == 4
    rows2 = by_key(rows_of(run))
    assert rows2[("victim", 1, 0)] == first
    assert rows2[("victim", 4, 0)]["error"] == "" and int(rows2[("victim", 4, 0)]["completed"]) == 24
    with (run / "failures.csv").open(newline="") as f:
        failures = list(csv.DictReader(f))
    assert [(r["arm"], r["concurrency"]) for r in failures] == [("victim", "4")]
    assert failures[0]["error"] == second["error"]
    assert (run / "requests" / "victim_c4_r0.attempt1.jsonl").exists()
    assert json.loads((run / "run.json").read_text())["status"] == "complete"


def test_resume_after_interruption(tmp_path):
    # Slow enough (time scale 2: about 6 s of levels after the first row) that the Ctrl-C lands
    # mid-sweep even when this machine is busy and the poll below wakes late.
    cfg = cfg_file(tmp_path, num_prompts=16, output_len=32, emulate={"time_scale": 2.0})
    runs = tmp_path / "runs"
    run = runs / "intr"
    # A shell without job control starts background jobs with SIGINT ignored, and an ignored
    # signal stays ignored across exec: had the test run inherited that (CI run as `... &`), the
    # sweep would never see the Ctrl-C.  A handled signal is reset to the default on exec.
    old_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        proc = subprocess.Popen([sys.executable, "-m", "dynspec", "sweep", "--config", str(cfg), "--run-id",
                                 "intr", "--runs-dir", str(runs), "--no-progress"], cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    finally:
        signal.signal(signal.SIGINT, old_int)
    try:
        t0 = time.monotonic()
        while not ((run / "results.csv").exists() and len(rows_of(run)) >= 1):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() - t0 < 60
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)  # Ctrl-C mid-sweep
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "interrupted; continue with --resume" in err
    kept = rows_of(run)
    assert 1 <= len(kept) < 4 and all(r["error"] == "" for r in kept)
    info = json.loads((run / "run.json").read_text())
    assert info["status"] == "interrupted"
    assert not any(alive(s["pid"]) for s in info["servers"].values() if "pid" in s), "a server outlived the sweep"

    # Resume with a config that changes what rows mean: refused, naming the key.
    data = yaml.safe_load(Path(cfg).read_text())
    data["output_len"] = 24
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(data))
    p = cli("--config", str(bad), "--run-id", "intr", "--runs-dir", str(runs), "--resume", "--no-progress")
    assert p.returncode == 2 and "config changed what the measured rows mean (output_len)" in p.stderr

    p = cli("--config", str(cfg), "--run-id", "intr", "--runs-dir", str(runs), "--resume", "--no-progress")
    assert p.returncode == 0, p.stderr
    rows = rows_of(run)
    assert len(rows) == 4 and all(r["error"] == "" for r in rows)
    assert rows[: len(kept)] == kept  # what was measured before the interruption is untouched
    info = json.loads((run / "run.json").read_text())
    assert info["status"] == "complete" and [s["status"] for s in info["sessions"]] == ["interrupted", "complete"]
    assert (run / "environment.json").is_file() and (run / "environment.session2.json").is_file()


def test_live_backend_server_that_never_gets_healthy_and_a_level_timeout(tmp_path):
    # The live path with real command lines: one arm's server dies at start, one is an emulator
    # started from its launch line, one is so slow that its level times out.
    emu = (f"{sys.executable} -m dynspec emulate --profile seed-blackwell --arm baseline --host {{host}} "
           f"--port {{port}} --time-scale {{ts}}")
    data = yaml.safe_load(CI_TINY.read_text())
    # driver dynspec: these fakes are not SGLang (the bench_serving driver is tested in test_drivers.py)
    data.update(backend="live", model="/models/target", concurrency=[1, 4], num_prompts=6, warmup_requests=0,
                driver="dynspec", timeouts={"startup_s": 30, "level_s": 1.5, "request_s": 30, "shutdown_grace_s": 5},
                arms=[{"name": "broken", "launch": f"{sys.executable} -c 'raise SystemExit(4)' --port {{port}}"},
                      {"name": "slow", "launch": emu.replace("{ts}", "0.05")},
                      {"name": "ok", "launch": emu.replace("{ts}", "20"), "api": "openai"}])
    cfg = parse_config(data)
    res = run_sweep(cfg, run_id="live", runs_dir=tmp_path, progress=False)
    assert res.failed and res.rows == 6
    rows = by_key(rows_of(tmp_path / "live"))
    for c in (1, 4):
        assert rows[("broken", c, 0)]["error"].startswith("server not started: arm broken: server exited with "
                                                          "code 4 before becoming healthy")
        assert rows[("broken", c, 0)]["completed"] == "0"
        assert rows[("slow", c, 0)]["error"].startswith("level timed out after 1.5s")
        assert rows[("ok", c, 0)]["error"] == "" and rows[("ok", c, 0)]["completed"] == "6"
        assert rows[("ok", c, 0)]["backend"] == "live" and rows[("ok", c, 0)]["policy"] == "none"
    log = (tmp_path / "live" / "logs" / "ok.log").read_text()
    assert "--port" in log and "/models/target" not in log


def test_an_interleaved_schedule_keeps_every_server_up_and_measures_the_arms_in_abba_order(tmp_path):
    # Real emulator processes from live launch lines; one arm's server dies at start and only its
    # own levels fail.  Sequentially run, arm b would start only after arm a's levels and stop.
    emu = (f"{sys.executable} -m dynspec emulate --profile seed-blackwell --arm baseline --host {{host}} "
           f"--port {{port}} --time-scale 20")
    data = yaml.safe_load(CI_TINY.read_text())
    data.update(backend="live", model="/models/target", concurrency=[1, 2], num_prompts=4, warmup_requests=0,
                repeats=2, driver="dynspec", schedule="interleaved",
                timeouts={"startup_s": 30, "level_s": 30, "request_s": 30, "shutdown_grace_s": 5},
                arms=[{"name": "a", "launch": emu},
                      {"name": "broken", "launch": f"{sys.executable} -c 'raise SystemExit(4)' --port {{port}}"},
                      {"name": "b", "launch": emu}])
    res = run_sweep(parse_config(data), run_id="i", runs_dir=tmp_path, progress=False)
    assert res.failed and res.rows == 12
    rows = rows_of(tmp_path / "i")
    broken = [r for r in rows if r["arm"] == "broken"]
    assert len(broken) == 4 and all(r["error"].startswith("server not started: arm broken") for r in broken)
    measured = [(r["arm"], int(r["concurrency"]), int(r["repeat"])) for r in rows if r["arm"] != "broken"]
    assert measured == [("a", 1, 0), ("b", 1, 0), ("a", 2, 0), ("b", 2, 0),
                        ("b", 1, 1), ("a", 1, 1), ("b", 2, 1), ("a", 2, 1)]
    assert all(r["error"] == "" and r["completed"] == "4" for r in rows if r["arm"] != "broken")
    log = (tmp_path / "i" / "sweep.log").read_text()
    assert log.index("arm b: healthy") < log.index("a_c1_r0:") < log.index("arm a: server stopped")
    info = json.loads((tmp_path / "i" / "run.json").read_text())
    assert all(not alive(info["servers"][n]["pid"]) for n in ("a", "b"))


def test_sim_backend_writes_the_same_run_folder(tmp_path):
    from dynspec.sim.profile import load_profile
    from dynspec.sim.run import simulate_level

    cfg = load_config(CI_TINY)
    res = run_sweep(cfg, backend="sim", run_id="s", runs_dir=tmp_path, progress=False)
    assert not res.failed and res.rows == 4
    df = read_table(tmp_path / "s" / "results.csv")
    assert set(df.backend) == {"sim"} and (df.error == "").all()
    want, _ = simulate_level(load_profile("seed-blackwell"), "eagle3", 4, num_prompts=8, input_len=64,
                             output_len=16, seed=level_seed(0, 4, 0))
    got = df[(df.arm == "eagle3") & (df.concurrency == 4)].iloc[0]
    assert math.isclose(got.output_throughput, want["output_throughput"], rel_tol=1e-9)
    assert (tmp_path / "s" / "requests" / "eagle3_c4_r0.jsonl").is_file()
    assert json.loads((tmp_path / "s" / "run.json").read_text())["backend"] == "sim"


def test_sweep_refuses_what_it_cannot_run(tmp_path):
    seed = ROOT / "configs" / "seed-blackwell.yaml"
    p = cli("--config", str(seed), "--runs-dir", str(tmp_path), "--no-progress")
    assert p.returncode == 2
    assert p.stderr.strip() == f"dynspec sweep: {seed}: model: fill in the target model's path (got '/path/to/target-model')"
    assert not any(tmp_path.iterdir()), "a refused sweep must leave nothing behind"
    p = cli("--config", str(tmp_path / "missing.yaml"))
    assert p.returncode == 2 and "missing.yaml: no such config file" in p.stderr
    with pytest.raises(SweepError, match="--resume needs the --run-id"):
        run_sweep(load_config(CI_TINY), resume=True, runs_dir=tmp_path)
    with pytest.raises(SweepError, match="nothing to resume"):
        run_sweep(load_config(CI_TINY), resume=True, run_id="nope", runs_dir=tmp_path)
    with pytest.raises(SweepError, match="run id 'a/b'"):
        run_sweep(load_config(CI_TINY), run_id="a/b", runs_dir=tmp_path)
    with pytest.raises(ConfigError):
        run_sweep(load_config(seed), backend="live", runs_dir=tmp_path)


FAKE_SMI = """#!/bin/sh
case "$*" in
  *--query-gpu*) printf '0, NVIDIA RTX PRO 6000 Blackwell Server Edition, 97887, 580.95.05, 00000000:17:00.0\\n'
                 printf '1, NVIDIA RTX PRO 6000 Blackwell Server Edition, 97887, 580.95.05, 00000000:18:00.0\\n' ;;
  "topo -m") printf '\\tGPU0\\tGPU1\\nGPU0\\t X \\tNODE\\n' ;;
  "") printf '| NVIDIA-SMI 580.95.05   Driver Version: 580.95.05   CUDA Version: 13.0 |\\n' ;;
  *) exit 1 ;;
esac
"""


def test_environment_reads_nvidia_smi_and_says_no_gpu_plainly(tmp_path, monkeypatch):
    from dynspec.environment import collect_environment, gpu_info

    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi at all
    assert gpu_info() == {"available": False, "note": "no GPU: nvidia-smi not found on this machine"}
    smi = tmp_path / "nvidia-smi"
    smi.write_text(FAKE_SMI)
    smi.chmod(0o755)
    info = gpu_info()
    assert info["available"] and info["count"] == 2 and info["driver"] == "580.95.05"
    assert info["cuda_driver_version"] == "13.0" and info["gpus"][1]["pci_bus_id"] == "00000000:18:00.0"
    assert info["gpus"][0]["name"] == "NVIDIA RTX PRO 6000 Blackwell Server Edition"
    assert "NODE" in info["topology"]
    env = collect_environment(probe_torch=False)
    assert env["packages"]["dynspec"] and env["gpu"]["count"] == 2 and env["torch_cuda"] is None


# A misbehaving server, damaged run files -----------------------------------------------

NOT_HTTP = ("import socket,sys; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
            "s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen()\n"
            "while True:\n c, _ = s.accept(); c.recv(4096); c.sendall(b'garbage, not HTTP\\r\\n\\r\\n'); c.close()")


def test_a_server_answering_health_with_non_http_is_a_failure_row_and_the_sweep_goes_on(tmp_path):
    data = yaml.safe_load(CI_TINY.read_text())
    data.update(backend="live", model="/models/target", concurrency=[1], warmup_requests=0, driver="dynspec",
                timeouts={"startup_s": 1.5, "level_s": 5, "request_s": 5, "shutdown_grace_s": 2},
                arms=[{"name": "garbage", "launch": [sys.executable, "-c", NOT_HTTP, "{port}", "--port", "{port}"]},
                      {"name": "later", "launch": [sys.executable, "-c", NOT_HTTP, "{port}", "--port", "{port}"]}])
    res = run_sweep(parse_config(data), run_id="g", runs_dir=tmp_path, progress=False)
    rows = by_key(rows_of(tmp_path / "g"))
    assert res.failed and set(rows) == {("garbage", 1, 0), ("later", 1, 0)}
    assert all(r["error"].startswith("server not started") for r in rows.values())


def test_a_failure_while_measuring_a_level_is_a_row_and_the_sweep_goes_on(tmp_path, monkeypatch):
    from dynspec.live import sweep

    calls = []

    def boom(self, arm, c, r):
        calls.append((arm.name, c))
        raise ConnectionResetError("scrape went wrong")

    monkeypatch.setattr(sweep._Sweep, "server_level", boom)
    cfg = parse_config({**yaml.safe_load(CI_TINY.read_text()), "concurrency": [1, 4]})
    res = run_sweep(cfg, backend="emulate", run_id="e", runs_dir=tmp_path, progress=False)
    rows = by_key(rows_of(tmp_path / "e"))
    assert res.failed and len(calls) == 4 and len(rows) == 4
    assert all("ConnectionResetError: scrape went wrong" in r["error"] for r in rows.values())


def _damage(run: Path, what: str) -> Path:
    results = run / "results.csv"
    if what == "garbage row":
        with results.open("a") as f:
            f.write("x,y,z\n")
        return results
    if what == "bad concurrency":
        text = results.read_text().splitlines()
        text[1] = text[1].replace(",1,inf,0,", ",one,inf,0,", 1)
        results.write_text("\n".join(text) + "\n")
        return results
    if what == "bad header":
        results.write_text("a,b,c\n" + results.read_text().split("\n", 1)[1])
        return results
    if what == "binary results":
        results.write_bytes(bytes(range(256)) * 8)
        return results
    if what == "results a folder":
        results.unlink()
        results.mkdir()
        return results
    if what == "corrupt run.json":
        (run / "run.json").write_text("{oops")
        return run / "run.json"
    if what == "list run.json":
        (run / "run.json").write_text("[1, 2]")
        return run / "run.json"
    if what == "corrupt config.yaml":
        (run / "config.yaml").write_text("arms: [unclosed\n")
        return run / "config.yaml"
    if what == "list config.yaml":
        (run / "config.yaml").write_text("- 1\n")
        return run / "config.yaml"
    raise AssertionError(what)


@pytest.mark.parametrize("what", ["garbage row", "bad concurrency", "bad header", "binary results",
                                  "results a folder", "corrupt run.json", "list run.json", "corrupt config.yaml",
                                  "list config.yaml"])
def test_resume_refuses_damaged_run_files_in_one_line_naming_the_file(tmp_path, capsys, what):
    from dynspec.cli import main

    run_sweep(load_config(CI_TINY), backend="sim", run_id="s", runs_dir=tmp_path, progress=False)
    bad = _damage(tmp_path / "s", what)
    before = {p: (p.read_bytes() if p.is_file() else None) for p in (tmp_path / "s").rglob("*")}
    code = main(["sweep", "--config", str(CI_TINY), "--backend", "sim", "--run-id", "s", "--resume",
                 "--runs-dir", str(tmp_path), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and str(bad) in err, err
    assert {p: (p.read_bytes() if p.is_file() else None) for p in (tmp_path / "s").rglob("*")} == before


def test_a_results_file_missing_only_its_final_newline_keeps_its_last_row(tmp_path):
    run_sweep(load_config(CI_TINY), backend="sim", run_id="s", runs_dir=tmp_path, progress=False)
    results = tmp_path / "s" / "results.csv"
    full = rows_of(tmp_path / "s")
    results.write_text(results.read_text().rstrip("\n"))
    res = run_sweep(load_config(CI_TINY), backend="sim", run_id="s", resume=True, runs_dir=tmp_path, progress=False)
    assert rows_of(tmp_path / "s") == full and res.rows == len(full)
    assert json.loads((tmp_path / "s" / "run.json").read_text())["sessions"][-1]["rows"] == 0  # nothing re-measured


@pytest.mark.parametrize("link", ["config.yaml.tmp", "run.json.tmp", "logs/baseline.log", "requests/x.jsonl"])
def test_resume_refuses_a_run_folder_holding_a_link(tmp_path, capsys, link):
    from dynspec.cli import main

    run_sweep(load_config(CI_TINY), backend="sim", run_id="s", runs_dir=tmp_path, progress=False)
    outside = tmp_path / "outside.txt"
    outside.write_text("keep\n")
    (tmp_path / "s" / link).parent.mkdir(exist_ok=True)
    (tmp_path / "s" / link).symlink_to(outside)
    code = main(["sweep", "--config", str(CI_TINY), "--backend", "sim", "--run-id", "s", "--resume",
                 "--runs-dir", str(tmp_path), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and "symbolic link" in err and err.count("\n") == 1, err
    assert outside.read_text() == "keep\n"


def test_a_server_log_that_is_a_link_is_not_written_through(tmp_path):
    from dynspec.live.servers import ArmServer

    outside = tmp_path / "outside.txt"
    outside.write_text("keep\n")
    (tmp_path / "a.log").symlink_to(outside)
    server = ArmServer("a", [sys.executable, "-c", "pass"], port=1, log_path=tmp_path / "a.log")
    with pytest.raises(OSError):
        server.start()
    assert outside.read_text() == "keep\n" and server.proc is None


def test_an_unresolvable_host_is_a_failure_row_per_level_not_a_crash(tmp_path):
    cfg = parse_config({**yaml.safe_load(CI_TINY.read_text()), "host": "no-such-host.invalid"})
    res = run_sweep(cfg, backend="emulate", run_id="h", runs_dir=tmp_path, progress=False)
    rows = by_key(rows_of(tmp_path / "h"))
    assert res.failed and len(rows) == 4
    assert all(r["error"].startswith("server not started: gaierror") for r in rows.values()), rows


def test_a_bad_prompt_file_is_refused_before_any_server_starts(tmp_path, capsys):
    from dynspec.cli import main

    for name, data in (("deep.json", b"[" * 100_000 + b"]" * 100_000), ("latin1.json", b'[{"a": "\xe9"}]')):
        (tmp_path / name).write_bytes(data)
        cfg = cfg_file(tmp_path, prompts={"source": "sharegpt", "path": name})
        code = main(["sweep", "--config", str(cfg), "--run-id", "p", "--runs-dir", str(tmp_path / "runs"),
                     "--no-progress"])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and name in err, err
        assert not (tmp_path / "runs").exists()


DYING_SERVER = '''
import http.server, os, sys, threading, time
port = int(sys.argv[1])
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def do_GET(self):
        body = b"{}" if self.path != "/metrics" else b""
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def do_POST(self):
        # Close every connection, then die a second later: the requests fail before the exit.
        self.close_connection = True
        self.connection.close()
        threading.Thread(target=lambda: (time.sleep(1.0), os._exit(3)), daemon=True).start()
http.server.ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
'''


def test_a_crash_is_reported_as_the_crash_even_when_the_exit_lags_the_closed_sockets(tmp_path):
    (tmp_path / "dying.py").write_text(DYING_SERVER)
    cfg = load_config(cfg_file(tmp_path, backend="live", model="/m", concurrency=[1], num_prompts=2,
                               warmup_requests=0, driver="dynspec",
                               arms=[{"name": "dying", "launch": f"{{python}} {tmp_path / 'dying.py'} {{port}}"}]))
    result = run_sweep(cfg, run_id="dying", runs_dir=tmp_path / "runs", progress=False)
    assert result.failed
    (row,) = rows_of(tmp_path / "runs/dying")
    assert row["error"].startswith("server exited with code 3 during the level"), row["error"]


def test_an_emulated_run_writes_the_profiles_clock_whatever_its_time_scale(tmp_path):
    """Time scale is not part of the answer: the same levels at time scale 1 and 3 give the same
    throughputs and latencies (within what a real-time emulator's jitter allows: its steps are 3x
    shorter, so the machine's own delays weigh 3x more), on the profile's clock; before, the
    scaled run read 3x faster, far outside the tolerance."""
    rows = {}
    for scale in (1.0, 3.0):
        cfg = load_config(cfg_file(tmp_path, name=f"ts{int(scale)}", num_prompts=8, output_len=24,
                                   concurrency=[2], emulate={"time_scale": scale},
                                   arms=[{"name": "baseline", "sim_arm": "baseline"}]))
        res = run_sweep(cfg, run_id=f"ts{int(scale)}", runs_dir=tmp_path / "runs", progress=False)
        assert not res.failed
        info = json.loads((res.run_dir / "run.json").read_text())
        assert info["clock"] == "profile"
        rows[scale] = rows_of(res.run_dir)[0]
    for col in ("output_throughput", "median_tpot_ms", "median_e2e_ms"):
        a, b = float(rows[1.0][col]), float(rows[3.0][col])
        assert b == pytest.approx(a, rel=0.3), (col, a, b)


def test_an_old_wall_clock_emulated_run_is_refused_by_fit_and_tune_and_not_drawn_beside_the_seed(tmp_path):
    from dynspec.analysis import report
    from dynspec.analysis import run_fit
    from dynspec.analysis import tune
    from dynspec.results import wall_clock_problem

    cfg = load_config(cfg_file(tmp_path, num_prompts=8, output_len=16, concurrency=[1, 2],
                               emulate={"time_scale": 10.0}))
    res = run_sweep(cfg, run_id="old", runs_dir=tmp_path / "runs", progress=False)
    assert wall_clock_problem(res.run_dir) == ""
    info = json.loads((res.run_dir / "run.json").read_text())
    del info["clock"]  # as a run from before the change wrote it
    (res.run_dir / "run.json").write_text(json.dumps(info))
    problem = wall_clock_problem(res.run_dir)
    assert "wall clock of an emulator 10x faster" in problem and "\n" not in problem
    with pytest.raises(run_fit.FitError, match="wall clock"):
        run_fit.spec_from_run(res.run_dir)
    with pytest.raises(tune.TuneError, match="wall clock"):
        tune.load_levels(tune.TuneConfig(results=res.run_dir / "results.csv"))
    run = report.load_run(res.run_dir)
    assert report.reference_for(run, report.load_reference()) is None
    assert dict(report.status_box(run))["Clock"] == problem
    # Resuming it would mix clocks in one table: refused.
    with pytest.raises(SweepError, match="start a new run"):
        run_sweep(cfg, run_id="old", runs_dir=tmp_path / "runs", progress=False, resume=True)


HOLDER = """
import sys, time
from pathlib import Path
from dynspec.io.lock import held, lock_file
with held(lock_file(sys.argv[1], Path(sys.argv[2])), "busy {pid}", RuntimeError):
    print("holding", flush=True)
    time.sleep(30)
"""


def test_a_run_id_another_command_is_measuring_is_refused_in_one_line(tmp_path):
    """A second --resume of a run under way used to measure the same levels again (duplicate rows)."""
    run = run_sweep(load_config(CI_TINY), backend="sim", run_id="r", runs_dir=tmp_path, progress=False)
    assert run.rows == 4
    before = {p: p.read_bytes() for p in (tmp_path / "r").rglob("*") if p.is_file()}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, "run", str(tmp_path / "r")], stdout=subprocess.PIPE,
                              text=True, env=env)
    try:
        assert holder.stdout.readline().strip() == "holding"
        p = cli("--config", str(CI_TINY), "--backend", "sim", "--run-id", "r", "--resume", "--runs-dir", str(tmp_path),
                "--no-progress")
        assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
        assert f"run r is being measured by another dynspec command (pid {holder.pid})" in p.stderr
        assert {q: q.read_bytes() for q in (tmp_path / "r").rglob("*") if q.is_file()} == before
    finally:
        holder.kill()
        holder.wait(10)
        holder.stdout.close()
    # the holder gone, its lock went with it
    p = cli("--config", str(CI_TINY), "--backend", "sim", "--run-id", "r", "--resume", "--runs-dir", str(tmp_path),
            "--no-progress")
    assert p.returncode == 0, p.stderr


def test_a_load_that_moves_is_one_level_at_its_peak_in_the_sim_and_the_emulator(tmp_path):
    from dynspec.live.config import bench_serving_problem

    data = yaml.safe_load(CI_TINY.read_text())
    for key in ("concurrency", "num_prompts"):
        data.pop(key)
    data["load_phases"] = [{"concurrency": 1, "requests": 3}, {"concurrency": 6, "requests": 12},
                           {"concurrency": 1, "requests": 3}]
    cfg = parse_config(data)
    assert cfg.prompt_caps() == [1] * 3 + [6] * 12 + [1] * 3 and cfg.prompts_for(6) == 18
    assert "load_phases" in bench_serving_problem(cfg)
    for backend in ("sim", "emulate"):
        res = run_sweep(cfg, backend=backend, run_id=backend, runs_dir=tmp_path, progress=False)
        assert not res.failed and res.rows == 2, backend
        rows = rows_of(tmp_path / backend)
        assert {int(r["concurrency"]) for r in rows} == {6} and {int(r["completed"]) for r in rows} == {18}
    # the same requests at a steady 6 take less time than with two phases of one at a time
    steady = simulate_at(cfg.model_copy(update={"load_phases": None, "concurrency": [6], "num_prompts": 18}))
    moving = read_table(tmp_path / "sim" / "results.csv").set_index("arm")["duration_s"]
    assert all(moving[arm] > steady[arm] for arm in steady), (moving, steady)
    bad = [({"concurrency": [4]}, "load_phases is the run's only level"),
           ({"request_rates": [2.0]}, "load_phases is the run's only level"),
           ({"load_phases": [{"concurrency": 4, "requests": 8}]}, "load_phases"),
           ({"load_phases": [{"concurrency": 0, "requests": 8}, {"concurrency": 2, "requests": 1}]}, "concurrency")]
    for change, msg in bad:
        with pytest.raises(ConfigError, match=msg):
            parse_config({**data, **change})


def simulate_at(cfg) -> "dict[str, float]":
    from dynspec.sim.profile import load_profile
    from dynspec.sim.run import simulate_level

    return {a.name: simulate_level(load_profile(cfg.profile), a.sim_arm, 6, num_prompts=18, input_len=cfg.input_len,
                                   output_len=cfg.output_len, seed=level_seed(cfg.seed, 6, 0))[0]["duration_s"]
            for a in cfg.arms}


def test_a_hung_server_fails_its_remaining_levels_within_the_health_timeout(tmp_path, monkeypatch):
    """A stopped (SIGSTOP) server used to cost each remaining level every request's full timeout."""
    from dynspec.live import sweep_runner

    cfg = load_config(cfg_file(tmp_path, concurrency=[1, 2, 4], num_prompts=6, warmup_requests=0,
                               emulate={"time_scale": 20.0},
                               timeouts={"startup_s": 60, "level_s": 60, "request_s": 60, "health_s": 1},
                               arms=[{"name": "hung", "sim_arm": "baseline"}, {"name": "next", "sim_arm": "baseline"}]))
    stopped = {}
    append = sweep_runner._Sweep.append

    def append_then_stop(self, arm, level, repeat, policy, metrics):
        append(self, arm, level, repeat, policy, metrics)
        if arm.name == "hung" and not stopped:  # the first level measured, then the server hangs
            stopped["pid"] = self.servers["hung"].proc.pid
            os.kill(stopped["pid"], signal.SIGSTOP)

    monkeypatch.setattr(sweep_runner._Sweep, "append", append_then_stop)
    t0 = time.monotonic()
    res = run_sweep(cfg, run_id="hung", runs_dir=tmp_path, progress=False)
    took = time.monotonic() - t0
    rows = by_key(rows_of(tmp_path / "hung"))
    assert res.failed and res.rows == 6
    assert rows[("hung", 1, 0)]["error"] == ""
    for c in (2, 4):
        assert rows[("hung", c, 0)]["error"] == ("server not answering /health before this level: "
                                                 "no answer within 1s")
        assert rows[("next", c, 0)]["error"] == ""
    assert took < 40, f"{took:.0f}s: the hung server's levels waited out their request timeouts"
    assert not alive(stopped["pid"])  # stopped, then terminated: not left behind


def test_a_full_disk_stops_the_sweep_in_one_line_and_run_json_says_why(tmp_path, monkeypatch, capsys):
    """A full disk used to print chained "Logging error" tracebacks and leave run.json "running"."""
    import logging

    from dynspec import results

    real_open = results.open_append
    writes = []

    def open_append(path):  # the first row lands; from then on the disk is full (/dev/full: ENOSPC)
        writes.append(path)
        if len(writes) == 1:
            return real_open(path)
        for h in logging.getLogger("dynspec.live.sweep").handlers:  # the log file fills up too
            if isinstance(h, logging.FileHandler) and h.stream is not None:
                full = os.open("/dev/full", os.O_WRONLY)
                os.dup2(full, h.stream.fileno())
                os.close(full)
        return open("/dev/full", "ab", buffering=0)

    monkeypatch.setattr(results, "open_append", open_append)
    from dynspec.cli import main

    code = main(["sweep", "--config", str(CI_TINY), "--backend", "sim", "--run-id", "full", "--runs-dir",
                 str(tmp_path), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and "Logging error" not in err, err
    assert err.count("\n") == 1, err
    assert err.startswith("dynspec sweep: disk full writing ")
    assert "No space left on device" in err and "--resume --run-id full" in err
    info = json.loads((tmp_path / "full" / "run.json").read_text())
    assert info["status"] == "failed" and info["reason"].startswith("disk full writing ")
    assert len(rows_of(tmp_path / "full")) == 1  # the row written before the disk filled is kept


def test_resume_removes_the_temporary_files_a_killed_sweep_left(tmp_path):
    """A sweep killed between an atomic write's temporary file and its rename left .tmp files for good."""
    run_sweep(load_config(CI_TINY), backend="sim", run_id="t", runs_dir=tmp_path, progress=False)
    stale = [tmp_path / "t" / ".run.json.a1b2c3d4.tmp", tmp_path / "t" / "requests" / ".baseline_c1_r0.jsonl.k_9x2mQz.tmp"]
    kept = [tmp_path / "t" / "notes.tmp", tmp_path / "t" / ".hidden.tmp"]
    for p in stale + kept:
        p.write_text("half")
    run_sweep(load_config(CI_TINY), backend="sim", run_id="t", runs_dir=tmp_path, progress=False, resume=True)
    assert [p for p in stale if p.exists()] == []
    assert all(p.read_text() == "half" for p in kept)


def test_an_emulator_that_falls_behind_its_profile_is_marked_in_the_results_and_the_report(tmp_path):
    """A busy machine's emulator ran slower than its profile and the report reversed its verdict
    without a word; now the lag is a column and the report's status box names the levels."""
    from dynspec.analysis.report import load_run, status_box

    # 10,000x faster than the profile: no machine keeps that pace, so every level lags; outputs
    # long enough that the emulator's own stepping, not the client's round trips, fills a level
    # (16 tokens a request passed 2% of a level only narrowly on a busy machine).
    cfg = load_config(cfg_file(tmp_path, concurrency=[4], num_prompts=8, output_len=256,
                               emulate={"time_scale": 10_000.0}))
    run_sweep(cfg, run_id="lag", runs_dir=tmp_path, progress=False)
    rows = rows_of(tmp_path / "lag")
    assert rows and all(float(r["emulator_lag_s"]) > 0.02 * float(r["duration_s"]) for r in rows), \
        [(r["emulator_lag_s"], r["duration_s"]) for r in rows]
    assert "fell" in (tmp_path / "lag" / "sweep.log").read_text()
    box = dict(status_box(load_run(tmp_path / "lag")))
    assert box["Lag"].startswith("The emulator fell behind its profile by more than 2% of the level on 2 level(s)")

    run_sweep(load_config(CI_TINY), backend="sim", run_id="sim", runs_dir=tmp_path, progress=False)
    assert "Lag" not in dict(status_box(load_run(tmp_path / "sim")))  # a simulated run never lags
