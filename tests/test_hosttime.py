"""dynspec.realsglang.hosttime: host seconds per SGLang function, and benchmarks/gpu_time_split.py:
a live level's time split by SGLang's device timer.  Both on synthetic inputs (no SGLang)."""

from __future__ import annotations

import gzip
import importlib.util
import json
import sys
import time
from pathlib import Path

import pytest

from dynspec.realsglang import compat, hosttime

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def fresh_totals(monkeypatch):
    monkeypatch.setattr(hosttime, "_totals", {})


def test_a_wrapped_method_counts_calls_and_seconds_and_keeps_its_kind(fresh_totals):
    class Worker:
        def step(self, x):
            time.sleep(0.01)
            return x + 1

        @classmethod
        def make(cls):
            return cls()

        @staticmethod
        def fails():
            raise ValueError("kept")

    assert hosttime.wrap(Worker, "step", "Worker.step")
    assert hosttime.wrap(Worker, "make", "Worker.make") and hosttime.wrap(Worker, "fails", "Worker.fails")
    assert not hosttime.wrap(Worker, "absent", "Worker.absent")  # a version without it: skipped
    w = Worker.make()
    assert isinstance(w, Worker) and w.step(1) == 2 and w.step(2) == 3
    with pytest.raises(ValueError, match="kept"):
        Worker.fails()  # an exception passes through, and the call still counts
    snap = hosttime.snapshot()
    assert snap["Worker.step"][0] == 2 and 0.02 <= snap["Worker.step"][1] < 1.0
    assert snap["Worker.make"][0] == 1 and snap["Worker.fails"][0] == 1
    assert "Worker.absent" not in snap
    # Each 10 ms call lands in the (3, 10] or (10, 30] ms bucket, never in a short one.
    step_bins = snap["Worker.step"][2]
    assert sum(step_bins) == 2 and sum(step_bins[4:6]) == 2


def test_the_device_timers_reports_become_gpu_time_per_forward_mode(fresh_totals):
    """SGLang's device timer calls increment_gpu_execution_seconds(t=..., category=...) once per
    forward: each lands in "gpu <category>" with its duration bucket, and still reaches SGLang."""
    seen = []

    class Collector:
        def increment_gpu_execution_seconds(self, category, t, dp_cooperation_info):
            seen.append((category, t))

    module = type(sys)("fake_collector")
    module.SchedulerMetricsCollector = Collector
    module.__name__ = hosttime.GPU_REPORTER[0]
    hosttime._wrap_module(module)
    c = Collector()
    c.increment_gpu_execution_seconds(t=0.012, category="forward_decode", dp_cooperation_info=None)
    c.increment_gpu_execution_seconds(t=0.150, category="forward_extend", dp_cooperation_info=None)
    c.increment_gpu_execution_seconds("forward_decode", 0.002, None)
    assert seen == [("forward_decode", 0.012), ("forward_extend", 0.150), ("forward_decode", 0.002)]
    snap = hosttime.snapshot()
    calls, seconds, bins = snap["gpu forward_decode"]
    assert calls == 2 and seconds == pytest.approx(0.014)
    assert bins[3] == 1 and bins[5] == 1  # 2 ms in (1, 3], 12 ms in (10, 30]
    assert snap["gpu forward_extend"][2][-1] == 1  # 150 ms: longer than the last edge


def test_a_module_imported_later_is_wrapped_after_compats_hooks(tmp_path, monkeypatch, fresh_totals):
    """install() for a module not yet imported: the wrappers go on when it runs, after compat's own
    post-import hooks on it (a hook that replaced the method first must be timed, not bypassed)."""
    name = "dynspec_hosttime_probe"
    (tmp_path / f"{name}.py").write_text("class Loop:\n    def run_batch(self):\n        return 'upstream'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(hosttime.TIMED, name, ["Loop.run_batch"])
    monkeypatch.setattr(compat, "_HOOKS", {name: []})

    @compat.after_import(name)
    def replace(mod):
        mod.Loop.run_batch = lambda self: "compat"

    import torch

    for mod in ("cuda", "cpu"):  # install() times Event.synchronize too: restored after the test
        event = getattr(getattr(torch, mod, None), "Event", None)
        if event is not None and "synchronize" in event.__dict__:
            monkeypatch.setattr(event, "synchronize", event.__dict__["synchronize"])
    had_finder = compat._FINDER in sys.meta_path
    compat.install()
    written = []
    monkeypatch.setattr(hosttime, "write_counts", lambda folder, snap, thread_name: written.append(folder))
    sys.modules.pop(name, None)
    try:
        hosttime.install(tmp_path / "times")
        mod = __import__(name)
        assert mod.Loop().run_batch() == "compat"
        assert hosttime.snapshot()["Loop.run_batch"][0] == 1
        assert written == [tmp_path / "times"]
    finally:
        sys.modules.pop(name, None)
        if not had_finder:
            sys.meta_path.remove(compat._FINDER)


def test_read_sums_every_process_and_skips_a_torn_file(tmp_path):
    n = len(hosttime.BUCKETS_MS) + 1
    one = [0] * n
    one[2] = 2
    (tmp_path / "1.json").write_text(json.dumps({"counts": {"A.f": [2, 0.5, one], "B.g": [1, 0.25, [1] + [0] * (n - 1)]}}))
    (tmp_path / "2.json").write_text(json.dumps({"counts": {"A.f": [3, 1.0]}}))  # written before the buckets
    (tmp_path / "3.json").write_text('{"counts": {"A.f": [1,')  # a process that never wrote whole
    (tmp_path / "4.json").write_text(json.dumps({"counts": {"B.g": [1, 1.0, [1]], "A.f": [9, 9.0]}}))  # bad: all of it skipped
    total = hosttime.read(tmp_path)
    assert total["A.f"] == (5, 1.5, tuple(one)) and total["B.g"] == (1, 0.25, (1,) + (0,) * (n - 1))


def _split_module():
    spec = importlib.util.spec_from_file_location("gpu_time_split", ROOT / "benchmarks" / "gpu_time_split.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


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
    gts = _split_module()
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


def test_a_run_without_the_device_timer_is_refused_in_one_line(tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    (run / "scrapes").mkdir(parents=True)
    (run / "results.csv").write_text("arm,policy,concurrency,repeat,output_throughput,duration_s\n"
                                     "plain,none,1,0,100.0,10.0\n")
    _scrape(run / "scrapes" / "plain_c1_r0.json.gz", (0.0, 1.0), None)
    gts = _split_module()
    monkeypatch.setattr(sys, "argv", ["gpu_time_split.py", str(run)])
    assert gts.main() == 2
    err = capsys.readouterr().err.strip()
    assert "SGLANG_ENABLE_METRICS_DEVICE_TIMER=1" in err and "\n" not in err


def _wave_module():
    spec = importlib.util.spec_from_file_location("wave_split", ROOT / "benchmarks" / "wave_split.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_closed_loop_level_splits_into_waves_and_parts_of_a_request(tmp_path, capsys, monkeypatch):
    """benchmarks/wave_split.py on made-up records: three waves of two requests, 10 ms steps, one
    20 ms pause; the never kind's requests start their first token 5 ms later."""
    (tmp_path / "requests").mkdir()
    for name, late in (("plain_c2_r0", 0.0), ("dynspec-never_c2_r0", 0.005)):
        lines = []
        for wave in range(3):
            for k in range(2):
                start = wave * 1.0 + 0.001 * k
                itls = [0.03, 0.01, 0.02, 0.01]  # first gap, step, pause, step
                ttft = 0.1 + late + 0.05 * k
                lines.append(json.dumps({"start": start, "ttft": ttft, "itls": itls,
                                         "end": start + ttft + sum(itls)}))
        with gzip.open(tmp_path / "requests" / f"{name}.jsonl.gz", "wt") as f:
            f.write("\n".join(lines) + "\n")
    ws = _wave_module()
    recs = ws.read_requests(tmp_path / "requests" / "plain_c2_r0.jsonl.gz")
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
    ws = _wave_module()
    monkeypatch.setattr(sys, "argv", ["wave_split.py", str(tmp_path)])
    assert ws.main() == 2
    assert "no per-request records" in capsys.readouterr().err
