"""The step-cost profile `dynspec calibrate` writes: fitted and assembled from the raw timings
(`timing.run_calibration`), shown as a table, validated and written as YAML beside the raw JSON."""

from __future__ import annotations

import os
import statistics

from dynspec.io.atomic import write_json
from dynspec.calibrate.config import CHUNK_TOKENS, CalibrateConfig, CalibrateError


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
