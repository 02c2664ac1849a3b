"""Host time per scheduler function: where an SGLang server's CPU spends a step.

A server whose GPU step is short, or whose step is followed by bookkeeping (requests that
finish, a prefill to merge), runs as fast as its scheduler's CPU: the GPU waits for the next
launch.  A torch profiler trace shows those waits but, recording every Python call, slows the
CPU several times over, so it cannot say how long the host work takes without it.  This wraps
a fixed list of SGLang's scheduler and worker methods (and `Event.synchronize`, the host's
waits for the GPU) with a perf_counter each: calls, seconds and a histogram of call durations per
function, inclusive, at about a microsecond per call.  With SGLang's device timer on
(SGLANG_ENABLE_METRICS_DEVICE_TIMER=1, --enable-metrics) each forward's GPU time is recorded the
same way, as "gpu forward_<mode>": a few long steps are told apart from many slightly longer ones.

Enabled by DYNSPEC_HOST_TIMES=<folder> in a server started by dynspec.realsglang: the wrappers
go on as each SGLang module is imported (compat's post-import hooks), and every process writes <folder>/<pid>.json
({"Class.method": [calls, seconds, [calls per duration bucket]]}) about once a second.  `experiments/h200-real-sglang/sync_census.py
--host-times` runs a plain and a patched server under the same load and prints both.
"""

from __future__ import annotations

import bisect
import functools
import os
import sys
import threading
import time

from dynspec.realsglang import compat
from dynspec.realsglang.census import write_counts

# module -> the methods timed in it ("Class.method", or "function" for a module-level one); what is
# missing in a version is skipped.
TIMED = {
    "sglang.srt.managers.scheduler": [
        "Scheduler.recv_requests", "Scheduler.process_input_requests", "Scheduler.get_next_batch_to_run",
        "Scheduler.update_running_batch", "Scheduler.get_new_batch_prefill", "Scheduler.run_batch",
        "Scheduler.process_batch_result", "Scheduler.launch_batch_sample_if_needed"],
    "sglang.srt.managers.scheduler_output_processor_mixin": [
        "SchedulerOutputProcessorMixin.process_batch_result_decode",
        "SchedulerOutputProcessorMixin.process_batch_result_prefill",
        "SchedulerOutputProcessorMixin._resolve_spec_overlap_token_ids",
        "SchedulerOutputProcessorMixin.stream_output"],
    "sglang.srt.managers.schedule_batch": [
        "ScheduleBatch.prepare_for_decode", "ScheduleBatch.prepare_for_extend", "ScheduleBatch.merge_batch",
        "ScheduleBatch.filter_batch", "ScheduleBatch.get_model_worker_batch"],
    "sglang.srt.speculative.eagle_info_v2": ["EagleDraftInputV2Mixin.prepare_for_decode"],
    "sglang.srt.managers.overlap_utils": [
        "FutureMap.resolve_future", "FutureMap.store_to_map", "FutureMap.store_to_map_for_new_batch"],
    "sglang.srt.managers.tp_worker": ["TpModelWorker.forward_batch_generation"],
    "sglang.srt.speculative.eagle_worker_v2": [
        "EAGLEWorkerV2.forward_batch_generation", "EAGLEWorkerV2._dynspec_plain_step",
        "EAGLEWorkerV2._dynspec_kv_only_prefill", "EAGLEWorkerV2._dynspec_flush_draft_kv",
        # 0.5.23: dynspec's plain step and resume, upstream's verify and draft extend
        "EAGLEWorkerV2._dynspec_plain_decode", "EAGLEWorkerV2._dynspec_resume", "EAGLEWorkerV2.verify",
        "EagleDraftWorker._draft_extend_for_decode", "_dynspec_draft_kv_only"],
    "sglang.srt.managers.scheduler_components.batch_result_processor": [  # 0.5.23
        "SchedulerBatchResultProcessor.process_batch_result_decode"],
    "sglang.srt.model_executor.model_runner": ["ModelRunner.forward", "ModelRunner.sample"],
    "sglang.srt.model_executor.forward_batch_info": ["ForwardBatch.init_new"],
    "sglang.srt.model_executor.cuda_graph_runner": ["CudaGraphRunner.replay"],
}

# SGLang's device timer reports each forward's GPU seconds here (category="forward_<mode>").
GPU_REPORTER = ("sglang.srt.metrics.collector", "SchedulerMetricsCollector", "increment_gpu_execution_seconds")
# Upper edges (ms) of the duration buckets; the last bucket is everything longer.
BUCKETS_MS = (0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0)

_totals: dict[str, list] = {}
_lock = threading.Lock()


def _slot(name: str) -> list:
    return _totals.setdefault(name, [0, 0.0, [0] * (len(BUCKETS_MS) + 1)])


def _record(slot: list, seconds: float) -> None:
    with _lock:
        slot[0] += 1
        slot[1] += seconds
        slot[2][bisect.bisect_left(BUCKETS_MS, seconds * 1000.0)] += 1


def _timed(name: str, fn):
    slot = _slot(name)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            _record(slot, time.perf_counter() - t0)
    return wrapper


def _gpu_seconds(fn):
    """The device timer's reporter, recording each forward's GPU time under its mode first."""
    @functools.wraps(fn)
    def wrapper(self, *args, **kwargs):
        category = kwargs.get("category", args[0] if args else "?")
        seconds = kwargs.get("t", args[1] if len(args) > 1 else 0.0)
        _record(_slot(f"gpu {category}"), float(seconds))
        return fn(self, *args, **kwargs)
    return wrapper


def wrap(owner, attr: str, name: str) -> bool:
    """Time owner.attr (a function on a class) as `name`; False where it does not exist."""
    raw = owner.__dict__.get(attr)
    if raw is None:
        return False
    if isinstance(raw, (staticmethod, classmethod)):
        setattr(owner, attr, type(raw)(_timed(name, raw.__func__)))
    else:
        setattr(owner, attr, _timed(name, raw))
    return True


def _wrap_module(module) -> None:
    for dotted in TIMED.get(module.__name__, ()):
        if "." not in dotted:  # a module-level function, looked up as a global by its callers
            wrap(module, dotted, dotted)
            continue
        cls_name, attr = dotted.split(".")
        cls = getattr(module, cls_name, None)
        if cls is not None:
            wrap(cls, attr, dotted)
    if module.__name__ == GPU_REPORTER[0]:
        cls = getattr(module, GPU_REPORTER[1], None)
        if cls is not None and GPU_REPORTER[2] in cls.__dict__:
            setattr(cls, GPU_REPORTER[2], _gpu_seconds(cls.__dict__[GPU_REPORTER[2]]))


def snapshot() -> dict:
    with _lock:
        return {k: [v[0], v[1], list(v[2])] for k, v in _totals.items() if v[0]}


def install(folder: str | os.PathLike) -> None:
    import torch

    for mod in ("cuda", "cpu"):
        event = getattr(getattr(torch, mod, None), "Event", None)
        if event is not None and hasattr(event, "synchronize"):
            try:
                wrap(event, "synchronize", f"{mod}.Event.synchronize")
            except TypeError:  # a C type that refuses new attributes: not timed
                pass
    for name in (*TIMED, GPU_REPORTER[0]):  # after compat's own hooks (sitecustomize ran those first)
        if name in sys.modules:
            _wrap_module(sys.modules[name])
        else:
            compat.after_import(name, version=compat.served_version())(_wrap_module)
    write_counts(folder, snapshot, thread_name="dynspec-host-times")


def read(folder: str | os.PathLike) -> dict[str, tuple[int, float, tuple[int, ...]]]:
    """Every process's (calls, seconds, calls per duration bucket) in a folder, summed by function."""
    import json
    from pathlib import Path

    empty = (0,) * (len(BUCKETS_MS) + 1)
    total: dict[str, tuple[int, float, tuple[int, ...]]] = {}
    for f in Path(folder).glob("*.json"):
        try:
            counts = json.loads(f.read_text())["counts"]
            merged = dict(total)
            for name, (calls, seconds, *hist) in counts.items():
                bins = tuple(int(b) for b in hist[0]) if hist else empty
                if len(bins) != len(empty):
                    raise ValueError(f"{name}: {len(bins)} buckets")
                c, s, b = merged.get(name, (0, 0.0, empty))
                merged[name] = (c + int(calls), s + float(seconds), tuple(x + y for x, y in zip(b, bins)))
        except (OSError, ValueError, KeyError, TypeError):
            continue  # a process that never wrote whole
        total = merged
    return total
