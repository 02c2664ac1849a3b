"""The timing loops of `dynspec calibrate`: every step piece at every (context, batch size), and a prefill.

Each piece is captured in a CUDA graph (SGLang replays graphs for decode) and timed with CUDA
events, the median of N replays after warm-up; on CPU, wall-clock times of eager calls.  The
result is the raw timings (a JSON-able dict) that `profile_writer.build_profile` turns into a profile.
"""

from __future__ import annotations

import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from dynspec.calibrate.config import CHUNK_TOKENS, DTYPES, STEP_KINDS, CalibrateConfig, CalibrateError, import_torch

if TYPE_CHECKING:
    from dynspec.calibrate.random_model import StepSet


def time_ms(fn: Callable[[], None], *, repeats: int, warmup: int, device, graphs: bool) -> tuple[list[float], str]:
    """Milliseconds per call of fn, one value per repeat, and how it ran ("cuda-graph", "eager", "cpu")."""
    from dynspec.calibrate.random_model import fused_attention_only

    torch = import_torch()
    if device.type != "cuda":
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1000.0)
        return times, "cpu"
    run, how, graph = fn, "eager", None
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), fused_attention_only():
        for _ in range(2):  # graph capture needs the kernels' first-call work done
            fn()
    torch.cuda.current_stream().wait_stream(side)
    if graphs:
        try:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph), fused_attention_only():
                fn()
            run, how = graph.replay, "cuda-graph"
        except RuntimeError as exc:  # time it eagerly rather than lose the point; the raw JSON says so
            graph, how = None, f"eager (graph capture failed: {str(exc).splitlines()[0][:200]})"
    with fused_attention_only():
        for _ in range(warmup):
            run()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
        for s, e in zip(starts, ends):
            s.record()
            run()
            e.record()
        torch.cuda.synchronize()
    del graph
    return [s.elapsed_time(e) for s, e in zip(starts, ends)], how


def _environment(device) -> dict:
    torch = import_torch()
    env = {"torch": torch.__version__, "python": platform.python_version()}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(gpu=torch.cuda.get_device_name(device), cuda=torch.version.cuda,
                   sm_count=props.multi_processor_count, memory_gib=round(props.total_memory / 2**30, 1))
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20, check=False)
            env["driver"] = out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
        except (OSError, subprocess.SubprocessError):
            env["driver"] = None
    else:
        env.update(cpu=platform.processor() or platform.machine(), threads=torch.get_num_threads())
    return env


def fitting_batch(cfg: CalibrateConfig, context: int, free_bytes: int) -> int:
    """The largest batch size whose KV caches (target and draft, contiguous) and step activations
    fit in free_bytes at this context, keeping 4 GiB spare for CUDA graphs and the allocator."""
    dims, elem = cfg.dims, DTYPES[cfg.dtype]
    per_token = dims.kv_bytes_per_token(dims.layers + cfg.draft_layers, elem)
    tokens = max(cfg.forward_tokens[-1], cfg.verify_tokens)
    # Per request: its cache, plus the largest activations (logits and a float copy, the MLP's).
    per_request = per_token * _max_len(cfg, context) + tokens * (dims.vocab * (elem + 4) + 4 * dims.intermediate * elem)
    fits = [bs for bs in cfg.batch_sizes if bs * per_request + 4 * 2**30 <= free_bytes]
    return fits[-1] if fits else 0


def _max_len(cfg: CalibrateConfig, context: int) -> int:
    # Steps write at context..: q tokens, the verify's num_steps+1, the draft chain's after them.
    return context + max(cfg.forward_tokens[-1], cfg.verify_tokens, cfg.catch_up_window) + cfg.verify_tokens


def _step_pieces(cfg: CalibrateConfig, steps: StepSet) -> list[tuple[str, Callable[[], None] | None, bool]]:
    """(kind, function, graphed) for every timing at one point; None: nothing to time."""
    pieces = [("plain", steps.plain, True), ("draft", steps.draft_chain if cfg.num_steps > 1 else None, True),
              ("verify", steps.verify, True), ("extend", steps.extend, True), ("extend_eager", steps.extend, False),
              ("catchup", steps.catchup, True), ("resume", steps.resume, True)]
    return pieces + [(f"forward_q{q}", steps.forward_fn(q), True) for q in cfg.forward_tokens if q > 1]


def _time_point(cfg: CalibrateConfig, steps: StepSet, device, graphs: bool, bar) -> dict:
    """Every piece at one (context, batch size): {kind: {"ms": [...], "how": ...}}."""
    row: dict = {}
    for kind, fn, graphed in _step_pieces(cfg, steps):
        if fn is None:
            row[kind] = {"ms": [0.0], "how": "none (num_steps 1: no draft forward)"}
        else:
            ms, how = time_ms(fn, repeats=cfg.repeats, warmup=cfg.warmup, device=device, graphs=graphs and graphed)
            if kind == "catchup":  # one call is a whole window of plain steps
                ms = [m / cfg.catch_up_window for m in ms]
            row[kind] = {"ms": ms, "how": how}
        bar.update()
    med = {k: statistics.median(v["ms"]) for k, v in row.items()}
    bar.write(f"context {steps.ctx} bs {steps.bs:4d}: plain {med['plain']:8.3f}  draft {med['draft']:8.3f}  "
              f"verify {med['verify']:8.3f}  extend {med['extend']:8.3f} (eager {med['extend_eager']:8.3f})  "
              f"catchup {med['catchup']:8.3f}  resume {med['resume']:8.3f} ms", file=sys.stderr)
    return row


def run_calibration(cfg: CalibrateConfig, log: Callable[[str], None] = lambda m: None,
                    command: str | None = None) -> dict:
    """Time every step piece at every (context, batch size), and a prefill; return the raw timings.
    command: the command line invoked (default: one rebuilt from cfg, every setting explicit)."""
    from tqdm import tqdm

    from dynspec.calibrate.random_model import DraftHead, StepSet, TargetModel, check_attention

    torch = import_torch()
    device = torch.device(cfg.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise CalibrateError("no CUDA device: torch.cuda.is_available() is False (use --device cpu)")
    dtype = getattr(torch, cfg.dtype)
    dims, t = cfg.dims, cfg.verify_tokens
    graphs = cfg.cuda_graphs and device.type == "cuda"
    t_start = time.perf_counter()
    raw: dict = {"config": {**cfg.model_dump(mode="json"), "raw_out": str(cfg.raw_path)},
                 "command": command or cfg.command(), "environment": _environment(device),
                 "steps": {}, "skipped": {}, "prefill": {}}
    with torch.inference_mode():
        target = TargetModel(dims, dtype, device, max(_max_len(cfg, cfg.contexts[-1]), cfg.input_len), seed=cfg.seed)
        draft = DraftHead(target, cfg.draft_vocab, seed=cfg.seed + 1, layers=cfg.draft_layers)
        gen = torch.Generator(device=device).manual_seed(cfg.seed + 3)
        errors = check_attention(dims, dtype, device, cfg.contexts[0], sorted({t, *cfg.forward_tokens}),
                                 seed=cfg.seed + 4)
        raw["attention_check_rel_err"] = errors
        log("attention self-check (rel. error vs float32 reference): "
            + ", ".join(f"{n} quer{'y' if n == 1 else 'ies'} {e:.1e}" for n, e in errors.items()))
        if not all(e < 3e-2 for e in errors.values()):  # bf16 gave 2.2e-3 on an H200; more is a wrong result
            raise CalibrateError(f"attention self-check failed: relative errors {errors}")
        n_pieces = len(STEP_KINDS) + len(cfg.forward_tokens) - 1  # the step pieces, forward at q > 1
        bar = tqdm(total=len(cfg.contexts) * len(cfg.batch_sizes) * n_pieces, desc="calibrate", unit="point",
                   disable=None, file=sys.stderr)
        for ctx in cfg.contexts:
            # What fits is decided now, with the previous context's caches freed.
            top = fitting_batch(cfg, ctx, torch.cuda.mem_get_info(device)[0]) if device.type == "cuda" \
                else cfg.batch_sizes[-1]
            sizes = [bs for bs in cfg.batch_sizes if bs <= top]
            skipped = [bs for bs in cfg.batch_sizes if bs > top]
            if len(sizes) < 2:
                raise CalibrateError(f"context {ctx}: the KV cache of fewer than two of the batch sizes fits in "
                                     f"this GPU's free memory")
            if skipped:
                raw["skipped"][ctx] = skipped
                bar.total -= len(skipped) * n_pieces
                bar.refresh()
                log(f"context {ctx}: batch sizes {','.join(map(str, skipped))} do not fit in this GPU's memory "
                    f"(contiguous KV cache); the profile extends the last measured segment beyond {top}")
            max_len = _max_len(cfg, ctx)
            tcache = target.new_cache(sizes[-1], max_len)
            dcache = draft.new_cache(sizes[-1], max_len)
            tcache.fill_random(gen)
            dcache.fill_random(gen)
            if device.type == "cuda":  # bring the clocks up before the first timed point
                warm = StepSet(target, draft, tcache, dcache, sizes[-1], ctx, cfg.num_steps,
                               catch_up_window=cfg.catch_up_window)
                t_warm = time.perf_counter()
                while time.perf_counter() - t_warm < 3.0:
                    warm.plain()
                    torch.cuda.synchronize()
                del warm
            raw["steps"][ctx] = {bs: _time_point(cfg, StepSet(target, draft, tcache, dcache, bs, ctx, cfg.num_steps,
                                                              seed=cfg.seed + 2, max_q=cfg.forward_tokens[-1],
                                                              catch_up_window=cfg.catch_up_window),
                                                 device, graphs, bar)
                                 for bs in sizes}
            del tcache, dcache  # nothing else may hold a view of them, or the next context will not fit
            if device.type == "cuda":
                torch.cuda.empty_cache()
        bar.close()
        ks = prefill_prompts(cfg)
        pcache = target.new_cache(ks[-1], cfg.input_len)
        for k in ks:
            prompts = torch.randint(0, dims.vocab, (k, cfg.input_len), generator=gen, device=device)
            cache_k = pcache.batch(k)

            def prefill(prompts=prompts, cache_k=cache_k):
                h, _ = target.forward(prompts, cache_k, 0)
                target.logits(h[:, -1:]).argmax(-1)  # logits of each prompt's last token only, as servers do

            # Eager, as servers run prefill; every point is GPU-bound (a short prompt alone would
            # time the CPU's kernel launches instead).
            ms, how = time_ms(prefill, repeats=cfg.repeats, warmup=cfg.warmup, device=device, graphs=False)
            raw["prefill"][k * cfg.input_len] = {"prompts": k, "ms": ms, "how": how}
            log(f"prefill {k} x {cfg.input_len} tokens: {statistics.median(ms):8.3f} ms")
    raw["elapsed_s"] = round(time.perf_counter() - t_start, 1)
    return raw


def prefill_prompts(cfg: CalibrateConfig) -> list[int]:
    """How many prompts of input_len tokens to prefill in one forward: 1, 2, 4, ... up to one chunk."""
    most = min(cfg.batch_sizes[-1], max(1, CHUNK_TOKENS // cfg.input_len))
    return [k for k in (2 ** i for i in range(16)) if k <= most]
