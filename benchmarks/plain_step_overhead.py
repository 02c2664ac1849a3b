"""A switching server's plain step over a plain server's, per batch size.

A server that can switch back to speculating pays, on each plain step, the plain server's step
plus the draft catch-up that keeps its EAGLE-3 draft current.  Before 2026-11-30 that was a full
draft-extend over num_draft_tokens tokens per request (graphed, or eager as on 0.5.9's
flashinfer); with it, the KV-only catch-up of the step's one token, written a window of steps
at a time (catchup_ms, per step; "w=1" is every step on its own), and a resume (a 1-token draft
forward) once per switch to speculating.  Printed per batch size: (plain + catch-up) / plain,
old and new, and the resume as a share of a plain step.  A batch
where the new ratio exceeds --limit (default 1.015, the goal) is flagged with "!" and
the exit status is 1.

    # from a calibrated profile (device time, measured by `dynspec calibrate`)
    PYTHONPATH=src python benchmarks/plain_step_overhead.py --profile src/dynspec/sim/profiles/h200-llama8b.yaml
    # or timing the pieces here, with calibrate's random-weight model and timer
    PYTHONPATH=src python benchmarks/plain_step_overhead.py --measure --shape llama-3.1-8b --context 1024
    PYTHONPATH=src python benchmarks/plain_step_overhead.py --measure --shape tiny --device cpu --dtype float32 \\
        --batch-sizes 1,2,4 --context 24
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

LIMIT = 1.015


def tables_from_profile(path: str) -> tuple[str, list[dict]]:
    """(what was measured, [{context_len, batch_size, plain_ms, extend_ms, ...}]) from a profile."""
    from dynspec.sim.profile import load_profile

    p = load_profile(path)
    return (f"profile {p.name} ({p.provenance.kind}: {p.hardware or 'unknown hardware'})",
            [t.model_dump() for t in p.steps])


def tables_by_timing(args) -> tuple[str, list[dict]]:
    """The same columns, timed here: calibrate's model, StepSet pieces and timer."""
    import torch

    from dynspec.calibrate.config import CalibrateConfig, parse_ints
    from dynspec.calibrate.model_shapes import resolve_shape
    from dynspec.calibrate.timing import _max_len, fitting_batch, time_ms
    from dynspec.calibrate.random_model import DraftHead, StepSet, TargetModel

    cfg = CalibrateConfig(shape=args.shape, name="overhead", out=Path("overhead.yaml"),
                          batch_sizes=parse_ints(args.batch_sizes, "--batch-sizes"),
                          contexts=parse_ints(args.context, "--context"), tokens_per_request=(1,),
                          repeats=args.repeats, warmup=args.warmup, dtype=args.dtype, device=args.device,
                          draft_vocab=min(32000, resolve_shape(args.shape).vocab),
                          catch_up_window=args.catch_up_window)
    device, dtype = torch.device(cfg.device), getattr(torch, cfg.dtype)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("plain_step_overhead: no CUDA device (use --device cpu)")
    graphs = device.type == "cuda" and not args.no_cuda_graphs
    kinds = {"plain_ms": ("plain", True), "extend_ms": ("extend", True), "extend_eager_ms": ("extend", False),
             "catchup_step_ms": ("catchup_step", True), "catchup_ms": ("catchup", True),
             "resume_ms": ("resume", True)}
    tables = []
    with torch.inference_mode():
        target = TargetModel(cfg.dims, dtype, device, _max_len(cfg, cfg.contexts[-1]), seed=cfg.seed)
        draft = DraftHead(target, cfg.draft_vocab, seed=cfg.seed + 1)
        gen = torch.Generator(device=device).manual_seed(cfg.seed + 3)
        for ctx in cfg.contexts:
            top = fitting_batch(cfg, ctx, torch.cuda.mem_get_info(device)[0]) if device.type == "cuda" \
                else cfg.batch_sizes[-1]
            sizes = [b for b in cfg.batch_sizes if b <= top]
            tcache, dcache = target.new_cache(sizes[-1], _max_len(cfg, ctx)), draft.new_cache(sizes[-1], _max_len(cfg, ctx))
            tcache.fill_random(gen)
            dcache.fill_random(gen)
            table: dict = {"context_len": ctx, "batch_size": sizes, **{k: [] for k in kinds}}
            for bs in sizes:
                steps = StepSet(target, draft, tcache, dcache, bs, ctx, cfg.num_steps, seed=cfg.seed + 2,
                                catch_up_window=cfg.catch_up_window)
                steps.catchup_step = lambda s=steps: s.draft.catch_up(s.tok1, s.aux1, s.dcache, s.ctx)
                for key, (piece, graphed) in kinds.items():
                    ms, _ = time_ms(getattr(steps, piece), repeats=cfg.repeats, warmup=cfg.warmup,
                                    device=device, graphs=graphs and graphed)
                    per = cfg.catch_up_window if key == "catchup_ms" else 1  # a window of steps per call
                    table[key].append(statistics.median(ms) / per)
            tables.append(table)
            del tcache, dcache
    how = "CUDA graphs" if graphs else ("eager" if device.type == "cuda" else "CPU wall clock")
    return (f"timed here: {cfg.shape_name} shapes, {cfg.dtype}, {device}, {how}, median of {cfg.repeats}, "
            f"catch-up window {cfg.catch_up_window}"), tables


def overhead_rows(table: dict) -> list[dict]:
    """Per batch size: the switching server's plain step over the plain server's, old and new."""
    rows = []
    for i, bs in enumerate(table["batch_size"]):
        plain = table["plain_ms"][i]

        def ratio(key, i=i, plain=plain):
            col = table.get(key)
            return None if col is None else (plain + col[i]) / plain
        resume = table.get("resume_ms")
        rows.append({"bs": bs, "plain_ms": plain, "old": ratio("extend_ms"), "old_eager": ratio("extend_eager_ms"),
                     "step": ratio("catchup_step_ms"), "new": ratio("catchup_ms"),
                     "resume": None if resume is None else resume[i] / plain})
    return rows


def report(what: str, tables: list[dict], limit: float) -> tuple[str, bool]:
    """The printed comparison, and whether every new ratio is within the limit."""
    def cell(x, width=9):
        return f"{'n/a':>{width}s}" if x is None else f"{x:{width}.4f}"
    lines = [f"plain step of a switching server / plain server's plain step ({what})",
             "old: + the full draft-extend (graphed; eager as 0.5.9 on flashinfer); w=1: + the KV-only catch-up "
             "every step; new: + the KV-only catch-up per step of its window; "
             f"resume: once per switch, / plain step; '!': new above {limit}"]
    ok = True
    for t in tables:
        lines.append(f"context {t.get('context_len') or '?'}:")
        lines.append(f"{'bs':>5s} {'plain ms':>9s} {'old':>9s} {'old eager':>9s} {'w=1':>9s} {'new':>9s} "
                     f"{'resume':>9s}")
        for r in overhead_rows(t):
            flag = r["new"] is not None and r["new"] > limit
            ok &= not flag
            lines.append(f"{r['bs']:5d} {r['plain_ms']:9.3f} {cell(r['old'])} {cell(r['old_eager'])} "
                         f"{cell(r['step'])} {cell(r['new'])} {cell(r['resume'])}" + (" !" if flag else ""))
    if all(t.get("catchup_ms") is None for t in tables):
        lines.append("no catchup_ms: this profile predates the KV-only catch-up (calibrate it again)")
    else:
        lines.append(f"{'PASS' if ok else 'FAIL'}: new <= {limit} at every batch size")
    return "\n".join(lines), ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--profile", help="a calibrated profile (name or path)")
    src.add_argument("--measure", action="store_true", help="time the pieces here instead")
    ap.add_argument("--limit", type=float, default=LIMIT)
    ap.add_argument("--shape", default="llama-3.1-8b", help="with --measure: model shapes (calibrate's --shape)")
    ap.add_argument("--context", default="1024", help="with --measure: comma-separated context lengths")
    ap.add_argument("--batch-sizes", default="1,2,4,8,16,32,48,64,96,128,160,192,224,256")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--no-cuda-graphs", action="store_true")
    ap.add_argument("--catch-up-window", type=int, default=8, help="with --measure: as DYNSPEC_CATCHUP_WINDOW")
    args = ap.parse_args(argv)
    what, tables = tables_from_profile(args.profile) if args.profile else tables_by_timing(args)
    text, ok = report(what, tables, args.limit)
    print(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
