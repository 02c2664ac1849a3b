"""experiments/h200-real-sglang/trace_gaps.py: where a decode step's GPU idle time and host waits come from, read
from a torch profiler trace.  A synthetic trace of two steps with known gaps and waits."""

from __future__ import annotations

import gzip
import json

import pytest
from benchmark_scripts import load



def X(cat, name, ts, dur, corr=None, tid=1):
    e = {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": tid}
    if corr is not None:
        e["args"] = {"correlation": corr}
    return e


def two_steps() -> list[dict]:
    """Per 1000 us step: a 300 us GEMM launched from the scheduler, then a 100 us host wait in
    the plain step, then a 50 us norm launched from the plain step after a 380 us GPU gap."""
    ev = []
    for s in range(2):
        b = s * 1000
        ev += [X("python_function", "sglang/srt/managers/scheduler.py(10): run_batch", b, 900),
               X("python_function", "sglang/srt/speculative/eagle_worker_v2.py(5): _dynspec_plain_step", b + 600, 250),
               X("cuda_runtime", "cudaLaunchKernel", b + 20, 5, corr=10 * s + 1),
               X("kernel", "gemm", b + 30, 300, corr=10 * s + 1),
               X("cuda_runtime", "cudaStreamSynchronize", b + 610, 100),
               X("cuda_runtime", "cudaLaunchKernel", b + 705, 5, corr=10 * s + 2),
               X("kernel", "norm", b + 710, 50, corr=10 * s + 2)]
    return ev


def test_gaps_are_charged_to_the_frame_that_launched_the_kernel_ending_them(tmp_path):
    tg = load("trace_gaps")
    path = tmp_path / "x.trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": two_steps()}, f)
    s = tg.analyse(tg.load(tmp_path), steps=2)  # a folder: its largest trace
    assert s["busy_ms"] == pytest.approx(0.35) and s["span_ms"] == pytest.approx(0.865)
    # Step 0's norm waits 380 us after the GEMM: launched from the plain step, so charged there;
    # step 1's GEMM starts 270 us after step 0's norm: launched from run_batch.
    assert s["idle_by_site"] == {"speculative/eagle_worker_v2.py(5): _dynspec_plain_step": pytest.approx(0.38),
                                 "managers/scheduler.py(10): run_batch": pytest.approx(0.135)}
    assert s["waits_by_site"] == {
        "cudaStreamSynchronize @ speculative/eagle_worker_v2.py(5): _dynspec_plain_step": pytest.approx(0.1)}
    assert s["kernels"] == {"gemm": pytest.approx(0.3), "norm": pytest.approx(0.05)}
    # GPU time by launching site: the GEMMs are run_batch's, the norms the plain step's.
    assert s["gpu_by_site"] == {"managers/scheduler.py(10): run_batch": pytest.approx(0.3),
                                "speculative/eagle_worker_v2.py(5): _dynspec_plain_step": pytest.approx(0.05)}
    # Three gaps, 380, 380 and 270 us, all between 0.1 and 1 ms; the longest first, each with its site.
    assert s["idle_by_gap_size"] == {"< 0.1 ms": 0.0, "0.1-1 ms": pytest.approx(0.515), "1-10 ms": 0.0,
                                     ">= 10 ms": 0.0}
    assert list(s["longest_gaps_ms"].values()) == pytest.approx([0.38, 0.38, 0.27])
    assert list(s["longest_gaps_ms"])[2] == " 3. managers/scheduler.py(10): run_batch"


def test_gpu_time_is_summed_per_named_span_at_any_depth():
    tg = load("trace_gaps")
    ev = two_steps()
    s = tg.analyse(ev, steps=2, spans=["_dynspec_plain_step", "run_batch", "absent"])
    # the norm is launched inside the plain step (itself inside run_batch); the GEMM in run_batch only
    assert s["gpu_by_span"] == {"_dynspec_plain_step": pytest.approx(0.05), "run_batch": pytest.approx(0.35),
                                "absent": 0.0}


def test_a_trace_without_gpu_events_is_refused_in_one_line():
    tg = load("trace_gaps")
    with pytest.raises(SystemExit, match="no GPU events"):
        tg.analyse([X("cpu_op", "aten::add", 0, 5)], steps=1)
