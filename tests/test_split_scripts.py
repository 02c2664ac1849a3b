"""experiments/h200-llama8b-price/gpu_time_split.py (a live level's time split by SGLang's device timer) and
experiments/h200-llama8b-price/wave_split.py (a closed-loop level split by request and by wave), on made-up runs."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pytest
from benchmark_scripts import load



def _scrape(path: Path, extend: tuple[float, float], decode: tuple[float, float] | None) -> None:
    def metrics(i):
        m = {"sglang:gpu_execution_seconds_total": 0.0}
        if decode is not None:
            m["sglang:gpu_execution_seconds_total{forward_extend}"] = extend[i]
            m["sglang:gpu_execution_seconds_total{forward_decode}"] = decode[i]
        return m
    with gzip.open(path, "wt") as f:
        json.dump({"before": {"metrics": metrics(0)}, "after": {"metrics": metrics(1)}}, f)


def test_a_level_splits_into_prefill_decode_and_idle(tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    (run / "scrapes").mkdir(parents=True)
    (run / "results.csv").write_text(
        "arm,policy,concurrency,repeat,output_throughput,duration_s\n"
        "plain,none,64,0,100.0,10.0\n"
        "never,never,64,0,98.0,10.2\n"
        "old,never,64,1,97.0,10.3\n")
    _scrape(run / "scrapes" / "plain_c64_r0.json.gz", (1.0, 3.0), (5.0, 12.0))  # 2 s prefill, 7 s decode
    _scrape(run / "scrapes" / "never_c64_r0.json.gz", (0.0, 2.5), (0.0, 7.1))
    _scrape(run / "scrapes" / "old_c64_r1.json.gz", (0.0, 1.0), None)  # no device timer: left out
    gts = load("gpu_time_split")
    df = gts.split(run)
    assert list(df.arm) == ["plain", "never"]
    plain, never = df.iloc[0], df.iloc[1]
    assert (plain.prefill_s, plain.decode_s, plain.idle_s) == pytest.approx((2.0, 7.0, 1.0))
    assert (never.prefill_s, never.decode_s, never.idle_s) == pytest.approx((2.5, 7.1, 0.6))
    monkeypatch.setattr(sys, "argv", ["gpu_time_split.py", str(run)])
    assert gts.main() == 0
    out = capsys.readouterr().out
    assert "C=64 never - none: wall_s +0.200  prefill_s +0.500  decode_s +0.100  idle_s -0.400" in out
    assert "tok/s ratio 0.9800" in out


def test_servers_of_one_policy_are_told_apart_by_their_kind(tmp_path, capsys, monkeypatch):
    """Unpatched EAGLE-3 and the patched server told `always` both have policy `always` in the
    results; the run's config.yaml says which kind each arm is (its sim_arm), and a repeated
    server (eagle3-2) pools with its kind.  Pooled by the policy column, all four were one kind."""
    run = tmp_path / "run"
    (run / "scrapes").mkdir(parents=True)
    (run / "config.yaml").write_text(
        "arms:\n- {name: eagle3, sim_arm: eagle3}\n- {name: dynspec-always, sim_arm: 'policy:always'}\n"
        "- {name: eagle3-2, sim_arm: eagle3}\n")
    (run / "results.csv").write_text(
        "arm,policy,concurrency,repeat,output_throughput,duration_s\n"
        "eagle3,always,64,0,100.0,10.0\n"
        "dynspec-always,always,64,0,104.0,9.6\n"
        "eagle3-2,always,64,0,102.0,9.8\n")
    for arm in ("eagle3", "dynspec-always", "eagle3-2"):
        _scrape(run / "scrapes" / f"{arm}_c64_r0.json.gz", (0.0, 2.0), (0.0, 7.0))
    gts = load("gpu_time_split")
    assert list(gts.split(run).kind) == ["eagle3", "policy:always", "eagle3"]
    monkeypatch.setattr(sys, "argv", ["gpu_time_split.py", str(run)])
    assert gts.main() == 0
    out = capsys.readouterr().out
    # eagle3's two levels: wall 9.9 s, 101 tok/s; always: 9.6 s, 104
    assert "C=64 policy:always - eagle3: wall_s -0.300  prefill_s +0.000  decode_s +0.000  idle_s -0.300" in out
    assert f"tok/s ratio {104 / 101:.4f}" in out


def test_a_run_without_the_device_timer_is_refused_in_one_line(tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    (run / "scrapes").mkdir(parents=True)
    (run / "results.csv").write_text("arm,policy,concurrency,repeat,output_throughput,duration_s\n"
                                     "plain,none,1,0,100.0,10.0\n")
    _scrape(run / "scrapes" / "plain_c1_r0.json.gz", (0.0, 1.0), None)
    gts = load("gpu_time_split")
    monkeypatch.setattr(sys, "argv", ["gpu_time_split.py", str(run)])
    assert gts.main() == 2
    err = capsys.readouterr().err.strip()
    assert "SGLANG_ENABLE_METRICS_DEVICE_TIMER=1" in err and "\n" not in err


def _waves_of_requests(run: Path, levels) -> None:
    """Per-request records of each (level name, lateness): three waves of two requests."""
    (run / "requests").mkdir()
    for name, late in levels:
        lines = []
        for wave in range(3):
            for k in range(2):
                start = wave * 1.0 + 0.001 * k
                itls = [0.03, 0.01, 0.02, 0.01]  # first gap, step, pause, step
                ttft = 0.1 + late + 0.05 * k
                lines.append(json.dumps({"start": start, "ttft": ttft, "itls": itls,
                                         "end": start + ttft + sum(itls)}))
        with gzip.open(run / "requests" / f"{name}.jsonl.gz", "wt") as f:
            f.write("\n".join(lines) + "\n")


def test_waves_are_pooled_by_the_kind_the_runs_config_gives_each_arm(tmp_path, capsys, monkeypatch):
    """With a config.yaml, a level's kind is its arm's sim_arm; the arm is the longest one whose
    name prefixes the level's (an arm named `a_b` is not `a`)."""
    (tmp_path / "config.yaml").write_text("arms:\n- {name: a, sim_arm: eagle3}\n- {name: a_b, sim_arm: 'policy:always'}\n")
    _waves_of_requests(tmp_path, (("a_c2_r0", 0.0), ("a_b_c2_r0", 0.005)))
    out = tmp_path / "waves.csv"
    monkeypatch.setattr(sys, "argv", ["wave_split.py", str(tmp_path), "--out", str(out)])
    assert load("wave_split").main() == 0
    rows = [dict(zip(out.read_text().splitlines()[0].split(","), r.split(","))) for r in out.read_text().splitlines()[1:]]
    assert {(r["level"], r["kind"]) for r in rows} == {("a_c2_r0", "eagle3"), ("a_b_c2_r0", "policy:always")}


def test_a_closed_loop_level_splits_into_waves_and_parts_of_a_request(tmp_path, capsys, monkeypatch):
    """experiments/h200-llama8b-price/wave_split.py on made-up records: three waves of two requests, 10 ms steps, one
    20 ms pause; the never kind's requests start their first token 5 ms later."""
    _waves_of_requests(tmp_path, (("plain_c2_r0", 0.0), ("dynspec-never_c2_r0", 0.005)))
    ws = load("wave_split")
    recs = ws.streamed(tmp_path / "requests" / "plain_c2_r0.jsonl.gz")  # gzipped, as committed runs keep them
    assert [len(w) for w in ws.waves(recs, 0.15)] == [2, 2, 2]
    part = ws.split_level(recs, 0.015)
    assert part["ttft_ms"] == pytest.approx(125) and part["first_gap_ms"] == pytest.approx(30)
    assert part["steady_ms"] == pytest.approx(20) and part["pause_ms"] == pytest.approx(20)
    assert part["step_ms"] == pytest.approx(10)
    out = tmp_path / "waves.csv"
    monkeypatch.setattr(sys, "argv", ["wave_split.py", str(tmp_path), "--out", str(out)])
    assert ws.main() == 0
    rows = out.read_text().splitlines()
    assert len(rows) == 1 + 2  # the middle wave of each level (first and last are ramps)
    assert "never" in capsys.readouterr().out
    by_kind = {w["kind"]: w for w in (dict(zip(rows[0].split(","), r.split(","))) for r in rows[1:])}
    # From the wave's first send: first token 100 ms (plain) or 105 (never); the last request,
    # sent 1 ms later with a 150 (155) ms first token, ends 70 ms after it.
    assert float(by_kind["plain"]["first_token_ms"]) == pytest.approx(100)
    assert float(by_kind["plain"]["end_ms"]) == pytest.approx(221)
    assert float(by_kind["never"]["first_token_ms"]) == pytest.approx(105)
    assert float(by_kind["never"]["last_first_token_ms"]) == pytest.approx(156)


def test_a_run_without_request_records_is_refused_in_one_line(tmp_path, capsys, monkeypatch):
    ws = load("wave_split")
    monkeypatch.setattr(sys, "argv", ["wave_split.py", str(tmp_path)])
    assert ws.main() == 2
    assert "no per-request records" in capsys.readouterr().err


def _info(**dynspec) -> dict:
    return {"internal_states": [{"dynspec": dynspec}]} if dynspec else {"internal_states": [{}]}


def test_lockstep_read_gives_each_level_its_own_counters(tmp_path, capsys):
    """Counters in /get_server_info run over the server's life; a level's are after minus before,
    speculative steps included (a probe that split a closed loop shows beside its extra forwards).
    A plain server's scrapes carry no dynspec block and give no row."""
    run = tmp_path / "run"
    (run / "scrapes").mkdir(parents=True)

    def scrape(name, before, after):  # gzipped as the committed runs keep them, or as a sweep writes them
        opener = gzip.open if name.endswith(".gz") else open
        with opener(run / "scrapes" / name, "wt") as f:
            json.dump({"before": {"server_info": before}, "after": {"server_info": after}}, f)

    life = {"prompts_prefilled": 4, "prefills": 4, "steps": 137, "steps_spec": 6}
    after0 = {"prompts_prefilled": 84, "prefills": 24, "steps": 1417, "steps_spec": 6,
              "prefill_estimates": {"lockstep": True, "requests_per_prefill": 4.2}}
    after1 = {"prompts_prefilled": 164, "prefills": 53, "steps": 2747, "steps_spec": 7}
    scrape("goodput_c8_r0.json.gz", _info(**life), _info(**after0))
    scrape("goodput_c8_r1.json", _info(**after0), _info(**after1))
    scrape("plain_c8_r0.json.gz", _info(), _info())
    lr = load("lockstep_read")
    rows = lr.rows(run)
    assert [(r["arm"], r["repeat"]) for r in rows] == [("goodput", 0), ("goodput", 1)]
    assert {k: rows[0][k] for k in lr.COUNTERS} == {"prompts_prefilled": 80, "prefills": 20, "steps": 1280, "steps_spec": 0}
    assert {k: rows[1][k] for k in lr.COUNTERS} == {"prompts_prefilled": 80, "prefills": 29, "steps": 1330, "steps_spec": 1}
    assert rows[0]["lockstep"] is True and rows[0]["requests_per_prefill"] == 4.2
    assert lr.main([str(run)]) == 0
    assert "steps_spec" in capsys.readouterr().out
    assert lr.main([str(tmp_path)]) == 2  # no scrapes/: not a live run
