"""`dynspec calibrate`: measure a step-cost profile on this machine's GPU.

What a decode step costs depends on the model's shapes, not its weight values, so the steps
are timed on a model of the real architecture with random weights (`random_model`: a
Llama-style decoder of a preset's or a Hugging Face config.json's shapes, `model_shapes`, and
an EAGLE-3 draft head).  Per context length and batch size, each piece is captured in a CUDA
graph (SGLang replays graphs for decode) and timed with CUDA events: the median of N replays
after warm-up.

    plain    target forward of 1 token per request + greedy argmax
    verify   target forward of num_steps+1 tokens per request (topk 1) + argmax + acceptance compare
    draft    num_steps-1 single-token draft-head forwards (the first draft token comes from
             the draft-extend's logits, as SGLang's EAGLE workers do) + top-1 each
    extend   one draft-head forward over num_steps+1 tokens per request (SGLang's spec-v2
             worker runs this fixed shape under its CUDA graph) + top-1 at the last accepted;
             also timed eagerly (extend_eager: 0.5.9 graphs it only on triton and trtllm_mla)
    catchup  a switching server's plain step's draft work: the KV-only catch-up of 1 token per
             request (embed, fc, norms, the K/V rows of qkv, RoPE, cache write), done as the
             patch does it: rows kept per step, written --catch-up-window steps at a time
             (default 8; the time per step is the window's time / window)
    resume   the first speculative step after plain steps: one full 1-token draft forward
             (attention over the context, MLP, norm, LM head) + top-1
    forward  target forward of q tokens per request, for each --tokens-per-request: the curve
             that shows where verifying turns compute-bound

Batch sizes whose KV cache does not fit at a context are left out of that context's table.
Acceptance is not measurable with random weights: --accept-length (default 2.5) is recorded as
an assumption.  On CPU it runs too (no graphs, wall-clock times), which is what the tests use.

    dynspec calibrate --shape llama-3.1-8b --context 1024,4096 --name NAME --out NAME.yaml
"""

from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path

from pydantic import ValidationError

from dynspec.calibrate.config import (DEFAULT_BATCH_SIZES, DTYPES, STEP_KINDS, CalibrateConfig, CalibrateError,
                                      import_torch, parse_ints)
from dynspec.calibrate.model_shapes import PRESETS
from dynspec.calibrate.profile_writer import build_profile, crossover_lines, fit_prefill, format_table, write_outputs
from dynspec.calibrate.timing import fitting_batch, prefill_prompts, run_calibration
from dynspec.models import cli_options, field_default, validation_message
from dynspec.sglang.hook import DEFAULT_CATCH_UP_WINDOW

# The command's pieces, importable from here: settings, timing loops, the profile.
__all__ = ["STEP_KINDS", "CalibrateConfig", "CalibrateError", "add_cli", "build_profile", "config_from_args",
           "fit_prefill", "fitting_batch", "format_table", "prefill_prompts", "run_calibration", "write_outputs"]


def config_from_args(args) -> CalibrateConfig:
    try:
        return CalibrateConfig(
            shape=args.shape, accept_length=args.accept_length, name=args.name, out=Path(args.out),
            draft_vocab=args.draft_vocab, draft_layers=args.draft_layers,
            batch_sizes=parse_ints(args.batch_sizes, "--batch-sizes"), contexts=parse_ints(args.context, "--context"),
            tokens_per_request=parse_ints(args.tokens_per_request, "--tokens-per-request"),
            input_len=args.input_len, num_steps=args.num_steps, catch_up_window=args.catch_up_window,
            concentration=args.concentration, repeats=args.repeats, warmup=args.warmup, dtype=args.dtype,
            device=args.device, cuda_graphs=not args.no_cuda_graphs, seed=args.seed,
            raw_out=Path(args.raw_out) if args.raw_out else None)
    except ValidationError as exc:
        raise CalibrateError(validation_message(exc, options=cli_options(CalibrateConfig, contexts="--context",
                                                                         cuda_graphs="--no-cuda-graphs"))) from None


def _run(args) -> int:
    from dynspec import provenance

    prog = "dynspec calibrate"
    argv = provenance.argv_of(args)
    try:
        cfg = config_from_args(args)
        if cfg.device.startswith("cuda") and not import_torch().cuda.is_available():
            raise CalibrateError("no CUDA device: torch.cuda.is_available() is False (use --device cpu)")
        raw = run_calibration(cfg, log=lambda m: print(m, file=sys.stderr, flush=True),
                              command=shlex.join(argv) if argv else None)
        raw["date"] = time.strftime("%Y-%m-%d")
        profile = build_profile(cfg, raw)
        loaded = write_outputs(cfg, raw, profile)
    except CalibrateError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    provenance.write(provenance.beside(cfg.out), "calibrate", cfg, argv=argv, outputs=[cfg.out, cfg.raw_path])
    print(format_table(profile))
    print(f"prefill: {profile['prefill']['fixed_ms']:.3f} ms + {profile['prefill']['per_token_ms']:.5f} ms/token")
    print("\n".join(crossover_lines(loaded)))
    print(f"wrote {cfg.out} (validated) and {cfg.raw_path} ({raw['elapsed_s']:.0f} s)")
    return 0


def add_cli(sub) -> None:
    p = sub.add_parser("calibrate", help="measure a step-cost profile on this machine's GPU (random-weight model)")
    p.add_argument("--shape", default="llama-3.1-8b",
                   help=f"model shapes: a preset ({', '.join(PRESETS)}) or a Hugging Face config.json (default llama-3.1-8b)")
    p.add_argument("--draft-vocab", type=int, default=32000, help="EAGLE-3 draft vocabulary (default 32000)")
    p.add_argument("--draft-layers", type=int, default=1, help="decoder layers in the draft head (default 1, as EAGLE-3)")
    p.add_argument("--batch-sizes", default=",".join(map(str, DEFAULT_BATCH_SIZES)),
                   help="comma-separated, increasing (default %(default)s)")
    p.add_argument("--context", default="1024",
                   help="tokens in each request's KV cache; comma-separated for a table per context (default 1024)")
    p.add_argument("--tokens-per-request", default="1,2,4,8",
                   help="q of the target-forward curve, comma-separated (default 1,2,4,8)")
    p.add_argument("--input-len", type=int, default=field_default(CalibrateConfig, "input_len"),
                   help="prompt length of the prefill timings (default %(default)s)")
    p.add_argument("--num-steps", type=int, default=3, help="EAGLE draft chain length (topk 1; default 3)")
    p.add_argument("--catch-up-window", type=int, default=DEFAULT_CATCH_UP_WINDOW,
                   help="plain steps whose draft KV catch-up is written in one pass, as the patch's "
                        "DYNSPEC_CATCHUP_WINDOW (1..64; default %(default)s)")
    p.add_argument("--accept-length", type=float, default=2.5,
                   help="assumed tokens per request per verify, bonus included, in (1, 1+num_steps]; random "
                        "weights cannot measure it (default 2.5)")
    p.add_argument("--concentration", type=float, default=10.0, help="assumed acceptance spread (Beta; default 10)")
    p.add_argument("--repeats", type=int, default=20, help="timed runs per point; the median is kept (default 20)")
    p.add_argument("--warmup", type=int, default=5, help="untimed runs per point first (default 5)")
    p.add_argument("--dtype", default="bfloat16", help=f"{', '.join(DTYPES)} (default bfloat16)")
    p.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (default cuda)")
    p.add_argument("--no-cuda-graphs", action="store_true", help="time eager calls instead of graph replays")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--name", required=True, help="the profile's name")
    p.add_argument("--out", required=True, help="the profile YAML to write")
    p.add_argument("--raw-out", help="raw timings JSON (default: beside --out, NAME.raw.json)")
    p.set_defaults(func=_run)
