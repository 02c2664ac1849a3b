"""Host-sync census: the call sites in an SGLang process that would stall its CPU behind the GPU.

On a GPU, `Tensor.item()`, `.tolist()`, `.cpu()`, `bool(t)`, `nonzero` and `Event.synchronize()`
wait for the kernels queued before them; a scheduler that makes such a call between launching
step k and preparing step k+1 loses the overlap a plain server has.  On a CPU nothing waits,
but the calls happen at the same places: counted per call site in a plain server and in the
patched server with speculation off, per decode step, the difference is what the patch (and
spec v2 around it) adds.  Which of them are real syncs on a GPU depends on where the tensor
lives (`seq_lens_cpu.tolist()` is free there too): the census lists candidates, a profile on
the GPU decides.

Enabled by DYNSPEC_SYNC_CENSUS=<folder> in a server started by dynspec.realsglang: every
process writes <folder>/<pid>.json ({"site": count}) about once a second while counts change.
`experiments/h200-real-sglang/sync_census.py` runs both arms and prints the difference.
"""

from __future__ import annotations

import atexit
import collections
import functools
import json
import os
import sys
import threading
from pathlib import Path
from types import FrameType

_counts: collections.Counter = collections.Counter()
_lock = threading.Lock()
_TORCH = os.sep + "torch" + os.sep
_HERE = os.path.abspath(__file__)


def _site(kind: str) -> str:
    """`kind` at the first frame outside torch and this module: 'file.py:line func kind'."""
    f: FrameType | None = sys._getframe(2)
    while f is not None and (_TORCH in f.f_code.co_filename or f.f_code.co_filename == _HERE):
        f = f.f_back
    if f is None:
        return f"? {kind}"
    path = f.f_code.co_filename
    for marker in (os.sep + "sglang" + os.sep, os.sep + "dynspec" + os.sep):
        if marker in path:
            path = path[path.rindex(marker) + 1:]
            break
    return f"{path}:{f.f_lineno} {f.f_code.co_name} {kind}"


def _counted(kind: str, fn, *, on_device_only: bool = False):
    """Count every call; with on_device_only, only calls on a tensor that lives on a GPU (on a
    GPU machine `seq_lens_cpu.tolist()` waits for nothing and is left out)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if not on_device_only or getattr(args[0], "is_cuda", False):
            site = _site(kind)
            with _lock:
                _counts[site] += 1
        return fn(*args, **kwargs)
    return wrapper


def _to_cpu(fn, *, on_device_only: bool = False):
    """Tensor.to counts only when it moves to the CPU (the device argument says so), and with
    on_device_only only from a tensor on a GPU."""
    @functools.wraps(fn)
    def wrapper(self, *args, **kwargs):
        dev = kwargs.get("device", args[0] if args else None)
        if str(dev) == "cpu" and (not on_device_only or self.is_cuda):
            site = _site("to(cpu)")
            with _lock:
                _counts[site] += 1
        return fn(self, *args, **kwargs)
    return wrapper


def write_counts(folder: str | os.PathLike, snapshot, thread_name: str = "dynspec-sync-census") -> None:
    """Write snapshot() to <folder>/<pid>.json ({"argv", "counts"}) about once a second while it
    changes, and at exit; read() sums what every process wrote."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{os.getpid()}.json"
    last = None

    def flush():
        nonlocal last
        snap = snapshot()
        if snap != last:
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"argv": sys.argv[:3], "counts": snap}))
            os.replace(tmp, path)
            last = snap

    def loop():
        while True:
            threading.Event().wait(1.0)
            flush()

    threading.Thread(target=loop, name=thread_name, daemon=True).start()
    atexit.register(flush)


def _snapshot() -> dict:
    with _lock:
        return dict(_counts)


def install(folder: str | os.PathLike) -> None:
    import torch

    T = torch.Tensor
    gpu = torch.cuda.is_available()  # then only tensors on the GPU count: residency is known
    for name in ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "nonzero"):
        setattr(T, name, _counted(name, getattr(T, name), on_device_only=gpu))
    T.to = _to_cpu(T.to, on_device_only=gpu)  # type: ignore[method-assign]  # counting torch's own method
    torch.nonzero = _counted("torch.nonzero", torch.nonzero, on_device_only=gpu)
    for mod in ("cuda", "cpu"):
        event = getattr(getattr(torch, mod, None), "Event", None)
        if event is not None and hasattr(event, "synchronize"):
            try:
                event.synchronize = _counted(f"{mod}.Event.synchronize", event.synchronize)
            except TypeError:  # a C type that refuses new attributes: not counted, said so
                _counts[f"(not counted: {mod}.Event.synchronize)"] = 0
    write_counts(folder, _snapshot)


def read(folder: str | os.PathLike) -> collections.Counter:
    """Every process's counts in a census folder, summed by call site."""
    total: collections.Counter = collections.Counter()
    for f in Path(folder).glob("*.json"):
        try:
            total.update(json.loads(f.read_text())["counts"])
        except (OSError, ValueError, KeyError):
            continue  # a process that never wrote whole
    return total
