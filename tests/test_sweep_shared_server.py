"""Arms that share one patched server: the sweep writes each arm's policy into the server's
DYNSPEC_POLICY_CONTROL file before its level (real emulator processes on loopback, which honour
the file as a patched server does)."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from dynspec.live.config import ConfigError, parse_config
from dynspec.live.server_info import dynspec_state
from dynspec.live.sweep import run_sweep
from test_sweep import CI_TINY, alive, rows_of


def _emu(arm: str) -> str:
    return (f"{sys.executable} -m dynspec emulate --profile seed-blackwell --arm {arm} --host {{host}} "
            f"--port {{port}} --time-scale 20")


def _data(arms: list[dict], **changes) -> dict:
    data = yaml.safe_load(CI_TINY.read_text())
    data.update(backend="live", model="/models/target", concurrency=[1, 8], num_prompts=8, warmup_requests=0,
                warm_servers=False, repeats=2, driver="dynspec", schedule="interleaved",
                timeouts={"startup_s": 30, "level_s": 30, "request_s": 30, "shutdown_grace_s": 5}, arms=arms)
    data.update(changes)
    return data


SHARED = [{"name": "plain", "launch": _emu("baseline")},
          {"name": "gp", "sim_arm": "dynamic", "launch": _emu("dynamic")},
          {"name": "nev", "sim_arm": "policy:never", "shares": "gp"},
          {"name": "alw", "sim_arm": "policy:always", "shares": "gp"}]


def test_arms_sharing_a_server_run_their_own_policies_on_it_in_abba_order(tmp_path):
    res = run_sweep(parse_config(_data(SHARED)), run_id="s", runs_dir=tmp_path, progress=False)
    assert not res.failed and res.rows == 16
    rows = rows_of(tmp_path / "s")
    assert all(r["error"] == "" and r["completed"] == "8" for r in rows)
    order = [(r["arm"], int(r["concurrency"]), int(r["repeat"])) for r in rows]
    assert order[:4] == [("plain", 1, 0), ("gp", 1, 0), ("nev", 1, 0), ("alw", 1, 0)]
    assert order[8:12] == [("alw", 1, 1), ("nev", 1, 1), ("gp", 1, 1), ("plain", 1, 1)]
    # each row carries the policy the shared server reported, and did what that policy does
    policy = {r["arm"]: {x["policy"] for x in rows if x["arm"] == r["arm"]} for r in rows}
    assert policy == {"plain": {"none"}, "gp": {"goodput"}, "nev": {"never"}, "alw": {"always"}}
    frac = {(r["arm"], int(r["concurrency"]), int(r["repeat"])): float(r["spec_step_fraction"]) for r in rows
            if r["arm"] != "plain"}
    assert all(v == 0.0 for (a, _, _), v in frac.items() if a == "nev")
    assert all(v == 1.0 for (a, _, _), v in frac.items() if a == "alw")
    # one process for the three arms: two servers started, the control file left with the last spec
    info = json.loads((tmp_path / "s" / "run.json").read_text())
    assert set(info["servers"]) == {"plain", "gp"}
    assert all(not alive(s["pid"]) for s in info["servers"].values())
    control = Path(info["servers"]["gp"]["env"]["DYNSPEC_POLICY_CONTROL"])
    assert control == tmp_path / "s" / "control" / "gp.policy" and control.read_text() == "goodput\n"
    # swapped only where the policy changed: the first arm of a round after the last of the one before
    # (alw, alw) and gp right after the server started keep theirs
    last = json.loads((tmp_path / "s" / "scrapes" / "gp_c8_r1.json").read_text())["after"]["server_info"]
    assert dynspec_state(last)["policy_swaps"] == 10


def test_a_shared_server_that_does_not_start_fails_every_arm_on_it(tmp_path):
    arms = [{"name": "plain", "launch": _emu("baseline")},
            {"name": "gp", "sim_arm": "dynamic",
             "launch": f"{sys.executable} -c 'raise SystemExit(3)' --port {{port}}"},
            {"name": "nev", "sim_arm": "policy:never", "shares": "gp"}]
    res = run_sweep(parse_config(_data(arms, repeats=1)), run_id="f", runs_dir=tmp_path, progress=False)
    assert res.failed and res.rows == 6
    rows = {(r["arm"], int(r["concurrency"])): r for r in rows_of(tmp_path / "f")}
    assert all(rows[("plain", c)]["error"] == "" for c in (1, 8))
    assert all(rows[("gp", c)]["error"].startswith("server not started: arm gp") for c in (1, 8))
    assert all(rows[("nev", c)]["error"] == "server not started: the server of arm gp did not start"
               for c in (1, 8))


@pytest.mark.parametrize("change, message", [
    ({"shares": "nobody"}, "name another arm of this config"),
    ({"shares": "nev"}, "name another arm of this config"),
    ({"shares": "plain"}, "must be a patched server"),
    ({"launch": _emu("baseline")}, "leave out its launch and env"),
    ({"sim_arm": "baseline"}, "states no policy for a patched server"),
])
def test_a_sharing_arm_that_cannot_share_is_one_clear_error(change, message):
    arms = [dict(a) for a in SHARED[:3]]
    arms[2].update(change)
    with pytest.raises(ConfigError, match=message):
        parse_config(_data(arms))
    with pytest.raises(ConfigError, match="needs schedule: interleaved"):
        parse_config(_data(SHARED, schedule="sequential"))


def test_a_shared_server_that_dies_fails_the_rest_of_every_arm_on_it_once(tmp_path):
    """Killed once its first level is measured: that arm's and its sharers' remaining levels are
    failed rows, each once; the plain server's levels go on."""
    run = tmp_path / "d"
    killed = {}

    def killer():
        t0 = time.monotonic()
        while time.monotonic() - t0 < 60 and not killed:
            time.sleep(0.02)
            rows = rows_of(run) if (run / "results.csv").exists() else []
            if any(r["arm"] == "gp" for r in rows):
                pid = json.loads((run / "run.json").read_text())["servers"]["gp"]["pid"]
                os.kill(pid, signal.SIGKILL)
                killed["pid"] = pid

    t = threading.Thread(target=killer)
    t.start()
    res = run_sweep(parse_config(_data(SHARED)), run_id="d", runs_dir=tmp_path, progress=False)
    t.join()
    assert killed and res.failed and res.rows == 16
    rows = rows_of(run)
    keys = [(r["arm"], r["concurrency"], r["repeat"]) for r in rows]
    assert len(set(keys)) == 16  # every level once
    by = {k: r for k, r in zip(keys, rows)}
    assert by[("gp", "1", "0")]["error"] == ""
    assert all(by[("plain", c, r)]["error"] == "" for c in ("1", "8") for r in ("0", "1"))
    failed = [k for k in keys if k[0] != "plain" and k != ("gp", "1", "0")]
    assert len(failed) == 11 and all(by[k]["error"] for k in failed)
    assert "server exited with code -9" in by[("nev", "1", "0")]["error"]


def test_each_server_is_warmed_at_every_concurrency_before_any_level(tmp_path):
    """A fresh server's first level at a concurrency pays for kernels compiled on first use: the
    sweep first sends each server an unmeasured burst at every concurrency its arms have left.
    A server whose policies take turns is warmed under never and always (both modes' shapes),
    never under goodput, which would learn bursts of short requests as the workload; a resumed
    run warms only what is left."""
    res = run_sweep(parse_config(_data(SHARED, warm_servers=True, repeats=1)), run_id="w", runs_dir=tmp_path,
                    progress=False)
    assert not res.failed and res.rows == 8
    log = (tmp_path / "w" / "sweep.log").read_text()
    warmed = [line.split("INFO ")[1].split(" (")[0] for line in log.splitlines() if "warmed at" in line]
    assert warmed == ["arm plain: server warmed at C=1", "arm plain: server warmed at C=8"] + [
        f"server gp: warmed at C={c} under {spec}" for spec in ("never", "always") for c in (1, 8)]
    assert all("(8 of 8 requests answered)" in line or "(1 of 1 requests answered)" in line
               for line in log.splitlines() if "warmed at" in line)
    first_level = log.index("plain_c1_r0")
    assert log.rindex("warmed at") < first_level  # every burst before the first measured level
    rows = rows_of(tmp_path / "w")
    assert all(r["completed"] == "8" for r in rows)  # the bursts are not counted in any level
    # the server ran the bursts under never, then always: goodput (its launch policy) was swapped
    # out before it decided a step, and its first level starts from nothing the bursts taught
    before = json.loads((tmp_path / "w" / "scrapes" / "gp_c1_r0.json").read_text())["before"]["server_info"]
    assert (dynspec_state(before)["policy"], dynspec_state(before)["policy_swaps"]) == ("always", 2)
    # a resumed run with one level left warms that level's server at that concurrency only
    path = tmp_path / "w" / "results.csv"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:-1]))
    res = run_sweep(parse_config(_data(SHARED, warm_servers=True, repeats=1)), run_id="w", runs_dir=tmp_path,
                    resume=True, progress=False)
    log2 = (tmp_path / "w" / "sweep.log").read_text()[len(log):]
    last = lines[-1].split(",")
    again = [line.split("INFO ")[1].split(" (")[0] for line in log2.splitlines() if "warmed at" in line]
    if last[1] == "plain":
        assert again == [f"arm plain: server warmed at C={last[5]}"]
    else:
        assert again == [f"server gp: warmed at C={last[5]} under {s}" for s in ("never", "always")]
