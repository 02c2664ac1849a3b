"""A fit spec from a sweep's own measurements: `dynspec fit --from-run RUN_DIR`.

On a node with SGLang a sweep of a plain arm and an EAGLE-3 arm calibrates the simulator by
itself: their output throughputs at each concurrency become the fit's targets, the EAGLE-3
arm's measured accept length its acceptance, the plain arm's time to first token at the
lowest level its prefill cost, and the run's saved config its workload.  The fitted profile
then lets `dynspec sim` try any policy on that machine without it.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from dynspec.live.config import Arm, ConfigError, SweepConfig, parse_config
from dynspec.sim.fit import FitError, FitSpec, Target, Workload
from dynspec.sim.profile import Acceptance, Prefill, Speculative
from dynspec.io.typed_yaml import read_yaml

# sglang.launch_server options -> Speculative fields
_SPEC_FLAGS = {"--speculative-num-steps": "num_steps", "--speculative-eagle-topk": "topk",
               "--speculative-num-draft-tokens": "num_draft_tokens"}


def _arm(config: SweepConfig, name: str, role: str) -> Arm:
    try:
        return config.arm(name)
    except KeyError:
        raise FitError(f"no arm {name!r} in the run (arms: {', '.join(a.name for a in config.arms)}); "
                       f"name the {role} arm with --{role}-arm") from None


def speculative_of(arm: Arm) -> Speculative:
    """The speculative settings on the arm's launch command (SGLang's defaults where absent)."""
    launch = arm.launch
    found = {}
    for flag, key in _SPEC_FLAGS.items():
        if flag in launch and launch.index(flag) + 1 < len(launch):
            try:
                found[key] = int(launch[launch.index(flag) + 1])
            except ValueError:
                raise FitError(f"arm {arm.name!r}: {flag} is not an integer") from None
    steps = found.get("num_steps", 3)
    return Speculative(num_steps=steps, topk=found.get("topk", 1), num_draft_tokens=found.get("num_draft_tokens", steps + 1))


def server_prefill_ms(run_dir: Path) -> float | None:
    """What a prefill forward costs as the patched servers timed it: the median of goodput's
    fixed_ms over the run's scrapes, or None where no scrape carries it.  A time to first token
    holds the HTTP path and the wait for a step besides; on a GPU it can be several times the
    forward, and a fit that charged it to every request would find no step times that fit."""
    import gzip
    import json

    from dynspec.live.server_info import dynspec_state

    found = []
    for path in sorted((run_dir / "scrapes").glob("*.json*")):
        try:
            with (gzip.open(path, "rt") if path.suffix == ".gz" else open(path)) as f:
                after = json.load(f).get("after") or {}
        except (OSError, ValueError, AttributeError):
            continue
        block = dynspec_state(after.get("server_info") if isinstance(after, dict) else None) or {}
        ms = (block.get("prefill_estimates") or {}).get("fixed_ms")
        if isinstance(ms, (int, float)) and ms > 0:
            found.append(float(ms))
    return statistics.median(found) if found else None


def spec_from_run(run_dir: str | Path, *, baseline_arm: str = "baseline", eagle3_arm: str = "eagle3",
                  name: str | None = None, catch_up_fraction: float = 0.0,
                  accept_length: float | None = None) -> FitSpec:
    """The fit spec that makes the simulator reproduce the run's two arms."""
    from dynspec.results import closed_loop, read_table

    run_dir = Path(run_dir)
    results, config_path = run_dir / "results.csv", run_dir / "config.yaml"
    for p in (results, config_path):
        if not p.is_file():
            raise FitError(f"{run_dir}: no {p.name} (a dynspec sweep's run folder holds both)")
    from dynspec.results import wall_clock_problem

    if problem := wall_clock_problem(run_dir):
        raise FitError(problem)
    try:  # not load_config: a measured run's prompt file need not exist on this machine
        config = parse_config(read_yaml(config_path, FitError, "run config"), str(config_path))
    except ConfigError as exc:
        raise FitError(str(exc)) from None
    _arm(config, baseline_arm, "baseline")
    spec_arm = _arm(config, eagle3_arm, "eagle3")
    try:
        df = closed_loop(read_table(results))  # the fit's targets are concurrency levels
    except (ValueError, OSError) as exc:
        raise FitError(f"{results}: not a results table ({' '.join(str(exc).split())[:200]})") from None
    df = df[df["error"].astype(object).fillna("") == ""]
    # Each level's target is the mean over the repeats both arms measured without error, and the
    # fit simulates those repeats' own prompts: a level of a few hundred requests moves with the draw.
    df = df.assign(repeat=df["repeat"].fillna(0).astype(int) if "repeat" in df else 0)
    both = set(zip(df["concurrency"], df["repeat"]))
    shared: dict[int, list[int]] = {}
    for arm in (baseline_arm, eagle3_arm):
        got = set(zip(df[df["arm"] == arm]["concurrency"], df[df["arm"] == arm]["repeat"]))
        both &= got
    for c, r in sorted(both):
        shared.setdefault(int(c), []).append(int(r))
    rows = df[[(int(c), int(r)) in both for c, r in zip(df["concurrency"], df["repeat"])]]
    tput = {arm: rows[rows["arm"] == arm].groupby("concurrency")["output_throughput"].mean().to_dict()
            for arm in (baseline_arm, eagle3_arm)}
    levels = sorted(set(tput[baseline_arm]) & set(tput[eagle3_arm]))
    if len(levels) < 2:
        raise FitError(f"{results}: arms {baseline_arm!r} and {eagle3_arm!r} share {len(levels)} measured "
                       "level(s) without error; a fit needs two")

    measured = [x for x in df[df["arm"] == eagle3_arm]["accept_length"] if not math.isnan(x)]
    accept_given = accept_length is not None
    if accept_length is None:
        if not measured:
            raise FitError(f"{results}: arm {eagle3_arm!r} reports no accept_length; give --accept-length")
        accept_length = statistics.fmean(measured)
    if not accept_length > 1.0:
        raise FitError(f"accept length must be above 1 (tokens per request per verify, bonus included), "
                       f"got {accept_length:g}")
    input_len, output_len = config.input_len, config.output_len
    base = df[df["arm"] == baseline_arm]
    ttft = float(base[base["concurrency"] == levels[0]]["median_ttft_ms"].mean())
    timed = server_prefill_ms(run_dir)
    if timed is None and not ttft > 0:
        raise FitError(f"{results}: no time to first token for arm {baseline_arm!r} at C={levels[0]}")
    prefill_ms = ttft if timed is None else timed
    run_id = run_dir.name
    prompts = config.num_prompts or f"max({config.prompts_per_client}C, {config.min_prompts})"
    # Lengths as the run drew them where the fit can draw them too (random prompts); a file's are its own.
    pc = config.prompts
    ratio = pc.range_ratio if pc.source == "random" and pc.output_lens == "range" else 1.0
    lengths = (f"{input_len} input / {output_len} output tokens" if ratio >= 1.0 else
               f"input and output tokens uniform in [{ratio:g} x, 1 x] {input_len} / {output_len}, as the run drew them")
    if pc.source != "random" and pc.output_lens != "fixed":
        lengths += f" (the run's {pc.source} prompts' own lengths are not modelled)"
    assumptions = [
        f"workload as the run's config: {lengths}, "
        f"{prompts} prompts per level, closed-loop clients; each level's target the mean over the repeats both "
        "arms measured without error, simulated on those repeats' own prompts",
        (f"acceptance: accept length {accept_length:.3f}, "
         + ("given on the command line" if accept_given else "the mean over the eagle3 arm's levels")
         + "; concentration 10 assumed"),
        ((f"prefill: the baseline's median time to first token at C={levels[0]} ({ttft:.1f} ms) taken as one "
          if timed is None else
          f"prefill: {timed:.1f} ms, the median over the patched servers' own timing of their prefill forwards "
          "(prefill_estimates.fixed_ms in the scrapes), taken as one ")
         + f"{input_len}-token prefill, all per token; 8192-token chunks assumed"),
        "step times between the measured concurrencies are linear in batch size; beyond the last they extend it",
        (f"a plain step inside a switching server costs {100 * catch_up_fraction:g}% more than the plain "
         "server's (the draft catch-up; catch_up_fraction), not measured by this run"),
    ]
    return FitSpec(
        name=name or f"{run_id}-fitted", hardware=config.hardware,
        description=f"Step times fitted to run {run_id}: arms {baseline_arm} and {eagle3_arm}.",
        model=config.model or "", kind="fitted",
        source=f"dynspec run {run_id} ({config.backend}): {results}, arms {baseline_arm} and {eagle3_arm}",
        speculative=speculative_of(spec_arm),
        acceptance=Acceptance(accept_length=round(accept_length, 4)),
        prefill=Prefill(fixed_ms=0.0, per_token_ms=round(prefill_ms / input_len, 6)),
        workload=Workload(input_len=input_len, output_len=output_len, num_prompts=config.num_prompts,
                          prompts_per_client=config.prompts_per_client, min_prompts=config.min_prompts,
                          range_ratio=ratio, seed=config.seed),
        targets=[Target(concurrency=int(c), baseline=round(tput[baseline_arm][c], 3),
                        eagle3=round(tput[eagle3_arm][c], 3), repeats=shared[int(c)]) for c in levels],
        catch_up_fraction=catch_up_fraction, assumptions=assumptions,
    )
