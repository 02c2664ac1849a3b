"""Host time per scheduler function: where an SGLang server's CPU spends a step.

A server whose GPU step is short, or whose step is followed by bookkeeping (requests that
finish, a prefill to merge), runs as fast as its scheduler's CPU: the GPU waits for the next
launch.  A torch profiler trace shows those waits but, recording every Python call, slows the
CPU several times over, so it cannot say how long the host work takes without it.  This wraps
a fixed list of SGLang's scheduler and worker methods (and `Event.synchronize`, the host's
waits for the GPU) with a perf_counter each: calls and seconds per function, inclusive, at
about a microsecond per call.

Enabled by DYNSPEC_HOST_TIMES=<folder> in a server started by dynspec.realsglang: the wrappers
go on as each SGLang module is imported (compat's post-import hooks), and every process writes <folder>/<pid>.json
({"Class.method": [calls, seconds]}) about once a second.  `benchmarks/sync_census.py
--host-times` runs a plain and a patched server under the same load and prints both.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time

from dynspec.realsglang import compat
from dynspec.realsglang.census import write_counts

# module -> the methods timed in it ("Class.method"); what is missing in a version is skipped.
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
        "EAGLEWorkerV2._dynspec_kv_only_prefill", "EAGLEWorkerV2._dynspec_flush_draft_kv"],
    "sglang.srt.model_executor.forward_batch_info": ["ForwardBatch.init_new"],
    "sglang.srt.model_executor.cuda_graph_runner": ["CudaGraphRunner.replay"],
}

_totals: dict[str, list] = {}
_lock = threading.Lock()


def _timed(name: str, fn):
    slot = _totals.setdefault(name, [0, 0.0])

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            dt = time.perf_counter() - t0
            with _lock:
                slot[0] += 1
                slot[1] += dt
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
        cls_name, attr = dotted.split(".")
        cls = getattr(module, cls_name, None)
        if cls is not None:
            wrap(cls, attr, dotted)


def snapshot() -> dict:
    with _lock:
        return {k: list(v) for k, v in _totals.items() if v[0]}


def install(folder: str | os.PathLike) -> None:
    import torch

    for mod in ("cuda", "cpu"):
        event = getattr(getattr(torch, mod, None), "Event", None)
        if event is not None and hasattr(event, "synchronize"):
            try:
                wrap(event, "synchronize", f"{mod}.Event.synchronize")
            except TypeError:  # a C type that refuses new attributes: not timed
                pass
    for name in TIMED:  # after compat's own hooks on the same modules (sitecustomize ran those first)
        if name in sys.modules:
            _wrap_module(sys.modules[name])
        else:
            compat.after_import(name)(_wrap_module)
    write_counts(folder, snapshot, thread_name="dynspec-host-times")


def read(folder: str | os.PathLike) -> dict[str, tuple[int, float]]:
    """Every process's (calls, seconds) in a folder, summed by function."""
    import json
    from pathlib import Path

    total: dict[str, tuple[int, float]] = {}
    for f in Path(folder).glob("*.json"):
        try:
            counts = json.loads(f.read_text())["counts"]
            for name, (calls, seconds) in counts.items():
                c, s = total.get(name, (0, 0.0))
                total[name] = (c + int(calls), s + float(seconds))
        except (OSError, ValueError, KeyError, TypeError):
            continue  # a process that never wrote whole
    return total
