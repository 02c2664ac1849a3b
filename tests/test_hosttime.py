"""dynspec.realsglang.hosttime: host seconds per SGLang function, on synthetic classes (no SGLang)."""

from __future__ import annotations

import json
import sys
import time

import pytest

from dynspec.realsglang import compat, hosttime


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


@pytest.mark.parametrize("version", ["0.5.9", "0.5.23"])
def test_a_module_imported_later_is_wrapped_after_compats_hooks(tmp_path, monkeypatch, fresh_totals, version):
    """install() for a module not yet imported: the wrappers go on when it runs, after compat's own
    post-import hooks on it (a hook that replaced the method first must be timed, not bypassed),
    in a process of either SGLang version."""
    name = "dynspec_hosttime_probe"
    (tmp_path / f"{name}.py").write_text("class Loop:\n    def run_batch(self):\n        return 'upstream'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(hosttime.TIMED, name, ["Loop.run_batch"])
    monkeypatch.setattr(compat, "_HOOKS", {name: []})

    @compat.after_import(name, version=version)
    def replace(mod):
        mod.Loop.run_batch = lambda self: "compat"

    import torch

    for mod in ("cuda", "cpu"):  # install() times Event.synchronize too: restored after the test
        event = getattr(getattr(torch, mod, None), "Event", None)
        if event is not None and "synchronize" in event.__dict__:
            monkeypatch.setattr(event, "synchronize", event.__dict__["synchronize"])
    had_finder = compat._FINDER in sys.meta_path
    compat.install()
    monkeypatch.setattr(compat, "_VERSION", version)  # the version this process serves
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


def test_a_module_level_function_is_timed_where_its_callers_look_it_up(tmp_path, monkeypatch, fresh_totals):
    name = "dynspec_hosttime_functions"
    (tmp_path / f"{name}.py").write_text("def kv_only(x):\n    return x + 1\n\n"
                                         "def step(x):\n    return kv_only(x) * 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(hosttime.TIMED, name, ["kv_only", "absent"])
    sys.modules.pop(name, None)
    try:
        mod = __import__(name)
        hosttime._wrap_module(mod)
        assert [mod.step(1), mod.step(2)] == [4, 6]
        assert hosttime.snapshot()["kv_only"][0] == 2 and "absent" not in hosttime.snapshot()
    finally:
        sys.modules.pop(name, None)


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
