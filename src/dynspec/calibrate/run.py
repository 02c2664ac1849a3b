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

import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import Field, ValidationError, ValidationInfo, computed_field, field_validator, model_validator

from dynspec.io.atomic import write_json
from dynspec.calibrate.model_shapes import PRESETS, ModelDims, resolve_shape
from dynspec.sglang.hook import DEFAULT_CATCH_UP_WINDOW
from dynspec.models import Model, Workload, cli_options, field_default, validation_message

if TYPE_CHECKING:
    from dynspec.calibrate.random_model import StepSet

DTYPES = {"bfloat16": 2, "float16": 2, "float32": 4}  # bytes per element
STEP_KINDS = ("plain", "draft", "verify", "extend", "extend_eager", "catchup", "resume")
DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 160, 192, 224, 256)


class CalibrateError(ValueError):
    """Bad input; the message is one line, shown as `dynspec calibrate: MESSAGE`."""


def _torch():
    """torch, imported on first use: `dynspec --help` imports every command module, and torch
    is not a dependency of the rest of dynspec."""
    try:
        import torch
    except ImportError:
        raise CalibrateError("needs PyTorch (pip install torch)") from None
    return torch



class CalibrateConfig(Model):
    """What `dynspec calibrate` measures, built from its options (config_from_args)."""

    shape: str
    name: str
    out: Path
    accept_length: float = 2.5
    draft_vocab: int = Field(32000, ge=1)
    draft_layers: int = Field(1, ge=1)
    batch_sizes: tuple[int, ...] = DEFAULT_BATCH_SIZES
    contexts: tuple[int, ...] = (1024,)
    tokens_per_request: tuple[int, ...] = (1, 2, 4, 8)
    input_len: int = Field(field_default(Workload, "input_len"), ge=1)  # the prefill timings' prompt length
    num_steps: int = Field(3, ge=1)
    catch_up_window: int = Field(DEFAULT_CATCH_UP_WINDOW, ge=1, le=64)  # as the 0.5.9 patch's default
    concentration: float = Field(10.0, gt=0)
    repeats: int = Field(20, ge=1)
    warmup: int = Field(5, ge=0)
    dtype: str = "bfloat16"
    device: str = "cuda"
    cuda_graphs: bool = True
    seed: int = 0
    raw_out: Path | None = None

    @field_validator("batch_sizes", "contexts", "tokens_per_request")
    @classmethod
    def _increasing(cls, values: tuple[int, ...], info: ValidationInfo) -> tuple[int, ...]:
        least = 2 if info.field_name == "batch_sizes" else 1  # a profile step table has two or more
        if len(values) < least or any(v < 1 for v in values) or any(a >= b for a, b in zip(values, values[1:])):
            raise ValueError(f"must be {'at least two ' if least == 2 else ''}positive, strictly increasing "
                             f"integers, got {','.join(map(str, values))}")
        return values

    @field_validator("dtype")
    @classmethod
    def _dtype(cls, dtype: str) -> str:
        if dtype not in DTYPES:
            raise ValueError(f"must be one of {', '.join(DTYPES)}, got {dtype!r}")
        return dtype

    @field_validator("device")
    @classmethod
    def _device(cls, device: str) -> str:
        if device.split(":")[0] not in ("cuda", "cpu"):
            raise ValueError(f"must be cuda, cuda:N or cpu, got {device!r}")
        return device

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        if not name.strip():
            raise ValueError("must not be empty")
        return name

    @field_validator("out")
    @classmethod
    def _out(cls, out: Path) -> Path:
        if out.suffix not in (".yaml", ".yml"):
            raise ValueError(f"{out}: a profile is written as .yaml")
        return out

    @model_validator(mode="after")
    def _consistent(self) -> CalibrateConfig:
        # Checks of one option against another: their messages name both.
        if not (1.0 < self.accept_length <= 1 + self.num_steps):
            raise ValueError(f"--accept-length must be in (1, {1 + self.num_steps}] for --num-steps "
                             f"{self.num_steps} (tokens per request per verify, bonus included), "
                             f"got {self.accept_length:g}")
        if self.draft_vocab > self.dims.vocab:  # dims: a bad --shape's ShapeError is a ValueError, reported as is
            raise ValueError(f"--draft-vocab {self.draft_vocab} exceeds the {self.shape_name} vocabulary "
                             f"({self.dims.vocab})")
        return self

    # Recorded with the options: the shapes they resolved to.
    @computed_field  # type: ignore[prop-decorator]  # pydantic's documented form, which mypy cannot follow
    @cached_property
    def dims(self) -> ModelDims:
        return resolve_shape(self.shape)

    @property
    def shape_name(self) -> str:
        return self.shape if self.shape in PRESETS else Path(self.shape).parent.name or Path(self.shape).stem

    @property
    def verify_tokens(self) -> int:
        return self.num_steps + 1

    @property
    def forward_tokens(self) -> tuple[int, ...]:
        """The q of every target-forward timing: the requested curve, plus 1 (the plain step)."""
        return tuple(sorted({1, *self.tokens_per_request}))

    @property
    def raw_path(self) -> Path:
        return self.raw_out or self.out.with_name(self.out.stem + ".raw.json")

    def command(self) -> str:
        """The command line that reproduces this run, every setting explicit."""
        def csv(xs):
            return ",".join(map(str, xs))
        parts = ["dynspec", "calibrate", "--shape", self.shape, "--draft-vocab", str(self.draft_vocab),
                 "--draft-layers", str(self.draft_layers), "--batch-sizes", csv(self.batch_sizes),
                 "--context", csv(self.contexts), "--tokens-per-request", csv(self.tokens_per_request),
                 "--input-len", str(self.input_len), "--num-steps", str(self.num_steps),
                 "--accept-length", f"{self.accept_length:g}", "--concentration", f"{self.concentration:g}",
                 "--repeats", str(self.repeats), "--warmup", str(self.warmup), "--dtype", self.dtype,
                 "--device", self.device, "--seed", str(self.seed)]
        if not self.cuda_graphs:
            parts.append("--no-cuda-graphs")
        parts += ["--name", self.name, "--out", str(self.out)]
        if self.raw_out:
            parts += ["--raw-out", str(self.raw_out)]
        return shlex.join(parts)


def parse_ints(text: str, option: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise CalibrateError(f"{option} takes comma-separated integers, got {text!r}") from None


# ------------------------------------------------------------------------- timing



def time_ms(fn: Callable[[], None], *, repeats: int, warmup: int, device, graphs: bool) -> tuple[list[float], str]:
    """Milliseconds per call of fn, one value per repeat, and how it ran ("cuda-graph", "eager", "cpu")."""
    from dynspec.calibrate.random_model import fused_attention_only

    torch = _torch()
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
    torch = _torch()
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

    torch = _torch()
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


# ---------------------------------------------------------------------- the profile


CHUNK_TOKENS = 8192  # SGLang's default chunked-prefill size, written into the profile


def prefill_prompts(cfg: CalibrateConfig) -> list[int]:
    """How many prompts of input_len tokens to prefill in one forward: 1, 2, 4, ... up to one chunk."""
    most = min(cfg.batch_sizes[-1], max(1, CHUNK_TOKENS // cfg.input_len))
    return [k for k in (2 ** i for i in range(16)) if k <= most]


def fit_prefill(points: dict) -> tuple[float, float]:
    """(fixed_ms, per_token_ms) from {tokens: median ms}: least squares, both kept non-negative."""
    xs, ys = list(points), list(points.values())
    if len(xs) == 1:
        return ys[0], 0.0
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = max(sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs), 0.0)
    return max(my - slope * mx, 0.0), slope


def build_profile(cfg: CalibrateConfig, raw: dict) -> dict:
    """The profile (a plain dict in the README's format) from the raw timings: a step table per context."""
    env, dims = raw["environment"], cfg.dims

    def table(ctx) -> dict:
        points = raw["steps"][ctx]
        sizes = sorted(points, key=int)

        def med(kind: str) -> list[float]:
            return [round(statistics.median(points[bs][kind]["ms"]), 4) for bs in sizes]

        forward = {q: med("plain" if q == 1 else f"forward_q{q}") for q in cfg.forward_tokens}
        return {"context_len": int(ctx), "batch_size": [int(b) for b in sizes], "plain_ms": med("plain"),
                "draft_ms": med("draft"), "verify_ms": med("verify"), "extend_ms": med("extend"),
                "catchup_ms": med("catchup"), "resume_ms": med("resume"), "extend_eager_ms": med("extend_eager"),
                "forward_ms": forward}

    fixed, per_token = fit_prefill({n: statistics.median(v["ms"]) for n, v in raw["prefill"].items()})
    hows = sorted({v["how"] for rows in raw["steps"].values() for row in rows.values()
                   for k, v in row.items() if k != "extend_eager"})
    if "gpu" in env:
        machine = f"1x {env['gpu']} ({env['sm_count']} SMs, {env['memory_gib']} GiB)"
        versions = f"torch {env['torch']}, CUDA {env['cuda']}, driver {env.get('driver') or 'unknown'}"
    else:
        machine = f"CPU {env['cpu']} ({env['threads']} threads)"
        versions = f"torch {env['torch']}"
    date = raw.get("date", "")
    contexts = "/".join(map(str, cfg.contexts))
    source = (f"dynspec calibrate on {machine}: {versions}; {cfg.shape_name} shapes ({dims.describe()}), "
              f"{cfg.dtype}, EAGLE-3 head of {cfg.draft_layers} layer(s) with draft vocab {cfg.draft_vocab}; "
              f"context {contexts} tokens; median of {cfg.repeats} timed runs after {cfg.warmup} warm-up per "
              f"point ({', '.join(hows)}); raw timings: {cfg.raw_path.name}")
    t = cfg.verify_tokens
    assumptions = [
        "random weights: a step's cost depends on the shapes, not on the weight values",
        (f"acceptance: accept_length {cfg.accept_length:g} and concentration {cfg.concentration:g} are given on "
         "the command line, not measured (random weights say nothing about acceptance)"),
        ("kernels: plain PyTorch (cuBLAS GEMMs; scaled_dot_product_attention, fused backends only on CUDA, query "
         "heads of one kv head grouped as decode kernels do; unfused RMSNorm, RoPE and SwiGLU) instead of "
         "SGLang's FlashInfer/FA3 attention and fused kernels"),
        ("one device, no tensor parallelism, no overlap scheduling; device time only: the scheduler's CPU "
         "work per step (batch bookkeeping, sampling setup, spec-v2's plan stream) is not included"),
        ("uniform batch: every request at the table's context_len, KV cache contiguous per layer "
         "(not paged), filled with random values; between and beyond the measured contexts a step's time "
         "is taken as linear in the context"),
        "plain: target forward of 1 token per request + greedy argmax",
        (f"verify: target forward of {t} tokens per request (topk 1 chain, num_draft_tokens {t}) + argmax + "
         f"acceptance compare; EAGLE-3 aux hidden states from target layers {list(dims.aux_layers)}"),
        (f"draft: {cfg.num_steps - 1} single-token draft-head forwards + top-1 each: the first of the "
         f"{cfg.num_steps} draft tokens comes from the draft-extend's logits, as in SGLang's EAGLE workers"),
        (f"extend: one draft-head forward over {t} tokens per request (num_steps + 1, the fixed shape SGLang's "
         "spec-v2 worker replays in its CUDA graph; the v1 worker runs accept_length + 1) + top-1 at the last "
         "accepted position"),
        (f"catchup: what a plain step of a server that can switch back to speculating adds (the {t}-token extend "
         "before the KV-only catch-up): the KV-only draft catch-up of the step's 1 token per request: embedding, fc over the 3 "
         "aux hidden states, norms, the K/V rows of the draft layer's qkv projection, RoPE, KV cache write; no "
         f"attention, MLP or LM head; rows copied aside each step and written {cfg.catch_up_window} steps at a "
         "time, as the 0.5.9 patch does (DYNSPEC_CATCHUP_WINDOW), so the time is per step of the window"
         + ("" if cfg.draft_layers == 1 else
                                        f"; with {cfg.draft_layers} draft layers the later layers read the first's "
                                        "attention output, so it is the full 1-token draft forward")),
        ("resume: once per plain-to-speculative switch: one full 1-token-per-request draft forward at the last "
         "position (attention over the context, MLP, norm, LM head) + top-1"),
        (f"extend_eager_ms: the {t}-token extend timed without a CUDA graph (SGLang 0.5.9 captures the draft-extend "
         "graph only for the triton and trtllm_mla backends; flashinfer runs it eagerly), for reading; the "
         "simulator does not use it"),
        (f"forward_ms: the target's forward of q = {','.join(map(str, cfg.forward_tokens))} tokens per request "
         "+ argmax at each, for reading the step-cost curve; the simulator uses plain/draft/verify/extend"),
        (f"prefill: target only, eager, {'/'.join(str(v['prompts']) for v in raw['prefill'].values())} prompts of "
         f"{cfg.input_len} tokens in one forward, fitted as fixed + per-token; the draft's prefill under "
         f"speculation is not included; chunk_tokens {CHUNK_TOKENS} assumed (SGLang's default)"),
        "RoPE without Llama-3.1's frequency scaling (same cost)",
    ]
    for ctx, sizes in raw.get("skipped", {}).items():
        assumptions.append(f"context {ctx}: batch sizes {','.join(map(str, sizes))} did not fit in the GPU's "
                           "memory (contiguous KV cache); beyond the last measured one the last segment is extended")
    return {
        "name": cfg.name,
        "description": (f"Decode step costs measured by dynspec calibrate on {machine}, with "
                        f"{cfg.shape_name} shapes and random weights, EAGLE-3 chain of {cfg.num_steps} (topk 1), "
                        f"at context {contexts}."),
        "hardware": machine,
        "model": (f"{cfg.shape_name} shapes, random weights, {cfg.dtype} + EAGLE-3 head shapes "
                  f"({cfg.draft_layers} layer(s), draft vocab {cfg.draft_vocab})"),
        "speculative": {"algorithm": "EAGLE3", "num_steps": cfg.num_steps, "topk": 1, "num_draft_tokens": t},
        "acceptance": {"accept_length": cfg.accept_length, "concentration": cfg.concentration},
        "steps": [table(ctx) for ctx in raw["steps"]],
        "prefill": {"fixed_ms": round(fixed, 4), "per_token_ms": round(per_token, 6), "chunk_tokens": CHUNK_TOKENS},
        "provenance": {"kind": "measured", "source": source, "command": raw["command"], "date": date or None,
                       "assumptions": assumptions},
    }


def format_table(profile: dict) -> str:
    tables = profile["steps"] if isinstance(profile["steps"], list) else [profile["steps"]]
    lines = []
    for s in tables:
        lines.append(f"context {s.get('context_len', '?')}:")
        qs = [q for q in s.get("forward_ms", {}) if q > 1]
        new = [k for k in ("catchup_ms", "resume_ms", "extend_eager_ms") if s.get(k)]
        heads = {"catchup_ms": "catchup", "resume_ms": "resume", "extend_eager_ms": "ext-eager"}
        lines.append(f"{'bs':>5s} {'plain':>9s} {'draft':>9s} {'verify':>9s} {'extend':>9s} {'spec':>9s} "
                     f"{'spec/plain':>10s}" + "".join(f" {heads[k]:>9s}" for k in new)
                     + "".join(f" {'q=' + str(q):>8s}" for q in qs))
        for i, bs in enumerate(s["batch_size"]):
            spec = s["draft_ms"][i] + s["verify_ms"][i] + s["extend_ms"][i]
            lines.append(f"{bs:5d} {s['plain_ms'][i]:9.3f} {s['draft_ms'][i]:9.3f} {s['verify_ms'][i]:9.3f} "
                         f"{s['extend_ms'][i]:9.3f} {spec:9.3f} {spec / s['plain_ms'][i]:10.2f}"
                         + "".join(f" {s[k][i]:9.3f}" for k in new)
                         + "".join(f" {s['forward_ms'][q][i]:8.3f}" for q in qs))
    return "\n".join(lines)


def crossover_lines(profile, accept_lengths=(2.0, 2.5, 3.0)) -> list[str]:
    """Where a speculative step stops paying, per context and accept length (from the loaded profile)."""
    lines = []
    for table in profile.steps:
        ctx = table.context_len
        cells = []
        for al in accept_lengths:
            b = profile.crossover_batch(al, ctx)
            cells.append(f"accept length {al:g}: " + (f"pays below batch {b}" if b and b > 1 else
                                                      "never pays" if b == 1 else
                                                      f"pays at every batch up to {table.batch_size[-1]}"))
        lines.append(f"context {ctx}: " + "; ".join(cells))
    return lines


def profile_yaml(profile: dict) -> str:
    from dynspec.sim.profile import dump_profile

    head = [f"{profile['name']}: written by `{profile['provenance']['command']}`; measured, do not edit by hand.",
            "Median milliseconds per step piece (spec = draft + verify + extend; catchup, resume: the KV-only draft "
            "catch-up per plain step and per switch; q=N: target forward of N tokens):"]
    head += ["  " + line for line in format_table(profile).splitlines()]
    return dump_profile(profile, head)


def write_outputs(cfg: CalibrateConfig, raw: dict, profile: dict):
    """Raw JSON first (the measurement is never lost), then the profile: validated, then renamed into
    place.  Returns the profile as loaded."""
    from dynspec.sim.profile import ProfileError, load_profile

    write_json(cfg.raw_path, raw, indent=1)
    cfg.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = cfg.out.with_name(cfg.out.stem + ".tmp.yaml")  # load_profile reads .yaml paths
    try:
        tmp.write_text(profile_yaml(profile))
        loaded = load_profile(tmp)
        os.replace(tmp, cfg.out)
    except ProfileError as exc:
        raise CalibrateError(f"the measured profile does not validate: {exc}") from None
    finally:
        tmp.unlink(missing_ok=True)
    return loaded


# ---------------------------------------------------------------------------- CLI


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
        if cfg.device.startswith("cuda") and not _torch().cuda.is_available():
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
