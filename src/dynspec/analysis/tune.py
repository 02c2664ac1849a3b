"""`dynspec tune`: the best static speculation cutoff each engine's own mechanism can express.

Input: a results file (the one results schema) holding a no-speculation arm and an
always-speculate arm at several concurrencies.  A static cutoff T means "speculate
while the running batch is at most T".  In a closed-loop sweep the running batch is
about the concurrency C, so the cutoff's throughput at a measured level C is modelled
as the speculating arm's when C <= T and the plain arm's otherwise.  The cutoff that
scores best over the measured levels (against the envelope, the better arm at each
level) is then written in each engine's own terms:

  sglang-adaptive  SGLang >= 0.5.23 --speculative-adaptive-config JSON (tiers by batch size)
  vllm             vLLM speculative_config num_speculative_tokens_per_batch_size
  trtllm           TensorRT-LLM max_concurrency (or its equivalent draft_len_schedule)
  threshold        a dynspec policy spec (threshold:on=T,off=T)

Only measured levels are scored; between two levels the crossover is unknown and the
report says where it lies rather than guessing.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError

from dynspec.io.atomic import write_text
from dynspec.models import Model, cli_options, validation_message
from dynspec.roles import arms_by_role

Target = Literal["sglang-adaptive", "vllm", "trtllm", "threshold"]
TARGETS: tuple[Target, ...] = ("sglang-adaptive", "vllm", "trtllm", "threshold")
OBJECTIVES = ("mean-ratio", "min-ratio", "total")
METRIC = "output_throughput"


class TuneError(ValueError):
    """A sweep that cannot be tuned on; the message is one line naming what is wrong."""


class TuneConfig(Model):
    """What `dynspec tune` was asked, parsed once from the command line and saved beside its output."""

    results: Path
    targets: tuple[Target, ...] = TARGETS
    num_steps: int | None = Field(None, ge=1, le=64)  # the spec arm's speculative_num_steps
    baseline_arm: str | None = None
    spec_arm: str | None = None
    run_id: str | None = None
    objective: Literal["mean-ratio", "min-ratio", "total"] = "mean-ratio"
    max_batch_size: int = Field(1024, ge=1)  # end of vLLM's "off" range (vLLM carries the last K beyond it anyway)


@dataclass
class Level:
    """Both arms at one concurrency: mean output tok/s over usable repeats (None when none)."""

    concurrency: int
    baseline: float | None
    spec: float | None
    baseline_runs: list[float] = field(default_factory=list)
    spec_runs: list[float] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return self.baseline is not None and self.spec is not None

    @property
    def envelope(self) -> float:
        """The better arm here (dynspec.analysis.levels.envelope_of); only asked of a complete level."""
        from dynspec.analysis.levels import envelope_of

        env = envelope_of(self.baseline, self.spec)
        if env is None:
            raise TuneError(f"C={self.concurrency}: no envelope without both arms")
        return env

    def mean(self, spec: bool) -> float:
        """One arm's mean (the speculating one's, or the baseline's); only asked of a complete level."""
        value = self.spec if spec else self.baseline
        if value is None:
            raise TuneError(f"C={self.concurrency}: no {'spec' if spec else 'baseline'} arm")
        return value

    @property
    def spec_wins(self) -> bool:
        return self.mean(spec=True) > self.mean(spec=False)


# --- reading the sweep ----------------------------------------------------------------

def _pick_arm(df, given: str | None, want: str, role: str, flag: str) -> str:
    """The arm given, else the one arm of the wanted role (dynspec.roles: by policy, else by name)."""
    arms = sorted(str(a) for a in df["arm"].unique())
    if given is not None:
        if given not in arms:
            raise TuneError(f"{flag} {given!r}: no such arm in the results (arms: {', '.join(arms) or 'none'})")
        return given
    found = [arm for arm, r in arms_by_role(df).items() if r == want]
    if not found:
        raise TuneError(f"the results have no {role} arm (arms: {', '.join(arms) or 'none'}); "
                        f"tune needs both a no-speculation and an always-speculate arm; name it with {flag}")
    if len(found) > 1:
        raise TuneError(f"several arms look like the {role} arm ({', '.join(found)}); choose one with {flag}")
    return found[0]


def load_levels(cfg: TuneConfig):
    """Read the sweep; return (baseline arm, spec arm, levels, notes, context)."""
    from dynspec.analysis.levels import unusable_reasons
    from dynspec.results import closed_loop, read_table, wall_clock_problem

    if not cfg.results.is_file():
        raise TuneError(f"{cfg.results}: no such results file")
    if problem := wall_clock_problem(cfg.results.parent):
        raise TuneError(problem)
    try:
        df = closed_loop(read_table(cfg.results))  # a cutoff is judged at concurrency levels
    except ValueError as exc:
        raise TuneError(f"{cfg.results}: {exc}" if str(cfg.results) not in str(exc) else str(exc)) from None
    except Exception as exc:  # noqa: BLE001 - a broken CSV/parquet: say which file, not a traceback
        raise TuneError(f"{cfg.results}: cannot read results ({type(exc).__name__}: {exc})") from None
    if cfg.run_id is not None:
        df = df[df["run_id"].astype(str) == cfg.run_id]
        if df.empty:
            raise TuneError(f"--run-id {cfg.run_id!r}: no rows with that run_id in {cfg.results}")
    if df.empty:
        raise TuneError(f"{cfg.results}: no result rows")
    base = _pick_arm(df, cfg.baseline_arm, "plain", "no-speculation", "--baseline-arm")
    spec = _pick_arm(df, cfg.spec_arm, "spec", "always-speculate", "--spec-arm")
    if base == spec:
        raise TuneError(f"the no-speculation and always-speculate arms are the same arm ({base!r})")
    rows = df[df["arm"].isin([base, spec])]
    backends = sorted({str(b) for b in rows["backend"]})
    if len(backends) > 1:
        raise TuneError(f"arms {base!r} and {spec!r} mix backends ({', '.join(backends)}); "
                        "tune one sweep at a time (--run-id)")
    notes: list[str] = []
    levels: dict[int, Level] = {}
    reasons = unusable_reasons(rows)  # one rule of usable rows with the report (dynspec.analysis.levels)
    for (_, row), why in zip(rows.iterrows(), reasons):
        c = int(row["concurrency"])
        lv = levels.setdefault(c, Level(c, None, None))
        if why:
            notes.append(f"C={c}: ignored a {row['arm']} row (repeat {row['repeat']}): {why}")
            continue
        (lv.baseline_runs if row["arm"] == base else lv.spec_runs).append(float(row[METRIC]))
    for lv in levels.values():
        lv.baseline = sum(lv.baseline_runs) / len(lv.baseline_runs) if lv.baseline_runs else None
        lv.spec = sum(lv.spec_runs) / len(lv.spec_runs) if lv.spec_runs else None
    ordered = [levels[c] for c in sorted(levels)]
    profiles = sorted({str(p) for p in rows["profile"] if str(p).strip() and str(p) != "nan"})
    context = {"backend": backends[0] if backends else "", "profiles": profiles}
    return base, spec, ordered, notes, context


# --- choosing the cutoff ----------------------------------------------------------------

def modelled(levels: list[Level], cutoff: int) -> list[float]:
    """Throughput a cutoff would have given at each complete level (running batch ~ concurrency)."""
    return [lv.mean(spec=lv.concurrency <= cutoff) for lv in levels]


def score(levels: list[Level], cutoff: int, objective: str) -> float:
    got = modelled(levels, cutoff)
    if objective == "total":
        return sum(got)
    ratios = [g / lv.envelope for g, lv in zip(got, levels)]
    return min(ratios) if objective == "min-ratio" else sum(ratios) / len(ratios)


def choose_cutoff(levels: list[Level], objective: str) -> int:
    """The best cutoff among 0 (never) and the measured levels; ties go to the smaller cutoff.

    Every cutoff between two measured levels models the same as the lower one, so
    these candidates cover all distinct choices.
    """
    candidates = [0] + [lv.concurrency for lv in levels]
    best, best_key = 0, (-math.inf, -math.inf)
    for t in candidates:
        # min-ratio ties often; the mean ratio breaks them.
        key = (score(levels, t, objective), score(levels, t, "mean-ratio"))
        if key[0] > best_key[0] + 1e-12 or (abs(key[0] - best_key[0]) <= 1e-12 and key[1] > best_key[1] + 1e-12):
            best, best_key = t, key
    return best


def cutoff_range(levels: list[Level], cutoff: int) -> dict:
    """Where, between measured levels, the real cutoff could lie with the same modelled result
    (not a crossover: dynspec.analysis.levels says which those are)."""
    cs = [lv.concurrency for lv in levels]
    above = [c for c in cs if c > cutoff]
    return {"low": cutoff, "high": (above[0] - 1) if above else None}


# --- each engine's terms ----------------------------------------------------------------

def _refused(reason: str) -> dict:
    return {"config": None, "refused": reason}


def sglang_adaptive(cutoff: int, k: int | None, top: int) -> dict:
    if cutoff == 0:
        return _refused("speculation lost at every measured level: serve without --speculative-algorithm")
    if k is None:
        return _refused("the speculating arm's speculative_num_steps is unknown (not in the results' profile): "
                        "pass --num-steps")
    cfg = {"1": {"candidate_steps": [k]}, str(cutoff + 1): {"candidate_steps": [0]}}
    notes = [
        "each tier has one candidate, so SGLang's acceptance EMA never moves it: a static cutoff",
        "SGLang routes a batch by its CUDA-graph-padded size, so batches whose padded size exceeds "
        f"{cutoff} already run plain; the cutoff is exact when {cutoff} is a capture size",
    ]
    if cutoff >= top:
        notes.append(f"speculation won up to the largest measured level (C={top}); the off tier at "
                     f"{cutoff + 1} is unmeasured: sweep higher to place it")
    return {
        "config": cfg,
        "flags": ["--speculative-algorithm", "EAGLE3", "--speculative-adaptive",
                  "--speculative-adaptive-config", "FILE.json", "--speculative-num-steps", str(k),
                  "--speculative-eagle-topk", "1"],
        "notes": notes,
    }


def vllm_schedule(cutoff: int, k: int | None, max_batch: int) -> dict:
    if cutoff == 0:
        return _refused("speculation lost at every measured level: serve without a speculative_config")
    if k is None:
        return _refused("the speculating arm's draft length is unknown (not in the results' profile): pass --num-steps")
    schedule = [[1, cutoff, k], [cutoff + 1, max(cutoff + 1, max_batch), 0]]
    return {
        "config": {"num_speculative_tokens": k, "num_speculative_tokens_per_batch_size": schedule},
        "notes": ["inclusive (start, end, K) ranges starting at 1; vLLM carries the last K past the last range"],
    }


def trtllm(cutoff: int, k: int | None) -> dict:
    if cutoff == 0:
        return _refused("speculation lost at every measured level: serve without a speculative_config "
                        "(max_concurrency must be > 0)")
    out: dict[str, Any] = {"config": {"max_concurrency": cutoff}, "notes": [
        f"max_concurrency={cutoff}: speculation is disabled at batch sizes above it (PyTorch backend only); "
        "max_concurrency and draft_len_schedule are mutually exclusive: set one"]}
    if k is None:
        out["notes"].append("draft_len_schedule needs the draft length: pass --num-steps")
    else:
        out["config"]["max_draft_len"] = k
        out["alternative"] = {"max_draft_len": k, "draft_len_schedule": {str(cutoff): k}}
    return out


def dynspec_threshold(cutoff: int) -> dict:
    from dynspec.policy import check_spec

    spec = "never" if cutoff == 0 else f"threshold:on={cutoff},off={cutoff}"
    return {"config": check_spec(spec), "notes": ["DYNSPEC_POLICY for the patched server, or sim_arm policy:SPEC"]}


# --- the whole report ------------------------------------------------------------------------

def _find_profile(name: str, results: Path, notes: list[str]):
    """The profile the rows name and where it was found (a shipped name, or the path the sweep's saved
    config.yaml points at); (None, None) when neither holds it."""
    import yaml

    from dynspec.sim.profile import ProfileError, load_profile

    try:
        return load_profile(name), name
    except ProfileError as exc:
        first = str(exc)
    saved = results.parent / "config.yaml"  # a sweep saves its resolved config beside results.csv
    try:
        path = (yaml.safe_load(saved.read_text()) or {}).get("profile") if saved.is_file() else None
        prof = load_profile(path) if isinstance(path, str) else None
    except (ProfileError, yaml.YAMLError, OSError, AttributeError):
        prof = None
    if prof is not None and prof.name == name:
        return prof, path
    notes.append(f"num_steps unknown: {first}")
    return None, None


def _num_steps(cfg: TuneConfig, profiles: list[str], notes: list[str]) -> tuple[int | None, str | None]:
    """The spec arm's speculative_num_steps, and the profile (name or path) it came from."""
    if cfg.num_steps is not None:
        return cfg.num_steps, None
    if len(profiles) != 1:
        if profiles:
            notes.append(f"the rows name several profiles ({', '.join(profiles)}): num_steps not taken from any")
        return None, None
    prof, source = _find_profile(profiles[0], cfg.results, notes)
    if prof is None:
        return None, None
    if prof.speculative.topk != 1:
        notes.append(f"profile {profiles[0]} speculates with topk={prof.speculative.topk} "
                     f"({prof.speculative.num_draft_tokens}-token tree); SGLang's adaptive mode needs topk=1 "
                     "(a chain), which this sweep did not measure: the modelled throughput is the tree's")
    return prof.speculative.num_steps, source


def tune(cfg: TuneConfig) -> dict:
    """The report: chosen cutoff, per-level modelled throughput and shortfall, each target's config."""
    base, spec, levels, notes, context = load_levels(cfg)
    complete = [lv for lv in levels if lv.complete]
    gaps = []
    for lv in levels:
        if not lv.complete:
            missing = [a for a, v in ((base, lv.baseline), (spec, lv.spec)) if v is None]
            gaps.append({"concurrency": lv.concurrency, "missing": missing})
            notes.append(f"C={lv.concurrency}: no usable {' or '.join(missing)} row: not scored, not modelled")
    if not complete:
        raise TuneError(f"no concurrency has usable rows of both {base!r} and {spec!r}: nothing to compare")
    if len(complete) < 2:
        notes.append("only one level has both arms: the cutoff is a guess beyond it")
    for lv in complete:
        if len(lv.baseline_runs) > 1 and len(lv.spec_runs) > 1:
            if min(lv.baseline_runs) <= max(lv.spec_runs) and min(lv.spec_runs) <= max(lv.baseline_runs):
                notes.append(f"C={lv.concurrency}: the arms' repeats overlap; the on/off choice there is within noise")
    cutoff = choose_cutoff(complete, cfg.objective)
    got = modelled(complete, cutoff)
    k, k_profile = _num_steps(cfg, context["profiles"], notes)
    top = complete[-1].concurrency
    per_level = []
    for lv, g in zip(complete, got):
        per_level.append({
            "concurrency": lv.concurrency,
            "baseline": lv.baseline, "spec": lv.spec, "envelope": lv.envelope,
            "best_static": "spec" if lv.spec_wins else "plain",
            "modelled": g, "speculates": lv.concurrency <= cutoff,
            "shortfall": lv.envelope - g, "shortfall_pct": 100.0 * (lv.envelope - g) / lv.envelope,
            "repeats": [len(lv.baseline_runs), len(lv.spec_runs)],
        })
    builders = {
        "sglang-adaptive": lambda: sglang_adaptive(cutoff, k, top),
        "vllm": lambda: vllm_schedule(cutoff, k, cfg.max_batch_size),
        "trtllm": lambda: trtllm(cutoff, k),
        "threshold": lambda: dynspec_threshold(cutoff),
    }
    return {
        "results": str(cfg.results),
        "backend": context["backend"],
        "arms": {"baseline": base, "spec": spec},
        "num_steps": k,
        "num_steps_profile": k_profile,  # the profile (shipped name or path) num_steps was read from
        "objective": cfg.objective,
        "cutoff": cutoff,
        "cutoff_range": cutoff_range(complete, cutoff),
        "score": score(complete, cutoff, cfg.objective),
        "assumption": "running batch ~ concurrency (closed loop): at a measured level C the cutoff T gives the "
                      "speculating arm's throughput when C <= T, the plain arm's otherwise",
        "levels": per_level,
        "gaps": gaps,
        "targets": {t: builders[t]() for t in cfg.targets},
        "notes": notes,
    }


# --- output ---------------------------------------------------------------------------------

def render(rep: dict) -> str:
    lines = [f"dynspec tune: {rep['results']} ({rep['backend'] or 'unknown backend'})",
             f"arms: plain={rep['arms']['baseline']}  spec={rep['arms']['spec']}  "
             f"num_steps={rep['num_steps'] if rep['num_steps'] is not None else 'unknown'}"]
    cut, rng = rep["cutoff"], rep["cutoff_range"]
    if cut == 0:
        lines.append("cutoff: never speculate (speculation lost at every measured level)")
    else:
        same = (f"any cutoff >= {cut} models the same: no level above {cut} was measured" if rng["high"] is None
                else f"any cutoff {cut}..{rng['high']} models the same: no level between was measured")
        lines.append(f"cutoff: speculate while batch <= {cut}  ({same})")
    lines.append(f"objective {rep['objective']}: {rep['score']:.4f}")
    lines.append("")
    lines.append(f"{'C':>6} {'plain':>10} {'spec':>10} {'envelope':>10} {'cutoff':>10} {'mode':>5} {'shortfall':>10}")
    for lv in rep["levels"]:
        lines.append(f"{lv['concurrency']:>6} {lv['baseline']:>10.1f} {lv['spec']:>10.1f} {lv['envelope']:>10.1f} "
                     f"{lv['modelled']:>10.1f} {'spec' if lv['speculates'] else 'plain':>5} "
                     f"{lv['shortfall_pct']:>9.1f}%")
    lines.append("(output tok/s; shortfall against the envelope, the better arm at each level)")
    for name, t in rep["targets"].items():
        lines.append("")
        lines.append(f"[{name}]")
        if t["config"] is None:
            lines.append(f"  refused: {t['refused']}")
            continue
        lines.append("  " + (t["config"] if isinstance(t["config"], str) else json.dumps(t["config"])))
        if "flags" in t:
            lines.append("  flags: " + " ".join(t["flags"]))
        if "alternative" in t:
            lines.append("  or: " + json.dumps(t["alternative"]))
        for n in t.get("notes", []):
            lines.append(f"  - {n}")
    if rep["notes"]:
        lines.append("")
        lines.append("notes:")
        lines.extend(f"  - {n}" for n in rep["notes"])
    return "\n".join(lines)


def write_outputs(rep: dict, cfg: TuneConfig, out: Path, argv: list[str] | None = None) -> list[Path]:
    """tune.json, the resolved config beside it, SGLang's adaptive config ready to pass to the server,
    and the provenance record of them all."""
    import yaml

    from dynspec import provenance

    out.mkdir(parents=True, exist_ok=True)
    written = [out / "tune.json", out / "tune_config.yaml"]
    write_text(written[0], json.dumps(rep, indent=2) + "\n")
    write_text(written[1], yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
    sg = rep["targets"].get("sglang-adaptive")
    if sg and sg["config"] is not None:
        written.append(out / "sglang_adaptive_config.json")
        write_text(written[-1], json.dumps(sg["config"], indent=2) + "\n")
    written.append(provenance.write(provenance.in_folder(out), "tune", cfg, argv=argv,
                                    profile=rep["num_steps_profile"], outputs=written))
    return written


def _run(args) -> int:
    try:
        cfg = TuneConfig(
            results=Path(args.results),
            targets=tuple(args.target) if args.target else TARGETS,
            num_steps=args.num_steps, baseline_arm=args.baseline_arm, spec_arm=args.spec_arm,
            run_id=args.run_id, objective=args.objective, max_batch_size=args.max_batch_size,
        )
    except ValidationError as exc:
        print(f"dynspec tune: {validation_message(exc, options=cli_options(TuneConfig, targets='--target'))}",
              file=sys.stderr)
        return 2
    try:
        rep = tune(cfg)
    except TuneError as exc:
        from dynspec.cli import one_line

        print(f"dynspec tune: {one_line(exc)}", file=sys.stderr)
        return 2
    if args.out:
        from dynspec.provenance import argv_of

        for p in write_outputs(rep, cfg, Path(args.out), argv=argv_of(args)):
            print(f"wrote {p}", file=sys.stderr)
    print(json.dumps(rep, indent=2) if args.json else render(rep))
    return 0


def add_cli(sub) -> None:
    p = sub.add_parser("tune", help="best static speculation cutoff for SGLang, vLLM, TensorRT-LLM and dynspec",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("--results", required=True, help="results file (.csv or .parquet) with a plain and a spec arm")
    p.add_argument("--target", action="append", choices=TARGETS,
                   help="which mechanism(s) to write (repeatable; default: all)")
    p.add_argument("--num-steps", type=int, help="the spec arm's speculative_num_steps (default: from its profile)")
    p.add_argument("--baseline-arm", help="the no-speculation arm (default: the arm named/policied baseline|none)")
    p.add_argument("--spec-arm", help="the always-speculate arm (default: the arm named/policied eagle3|always)")
    p.add_argument("--run-id", help="use only rows of this run_id")
    p.add_argument("--objective", choices=OBJECTIVES, default="mean-ratio",
                   help="what the cutoff maximizes over measured levels: mean or min of throughput/envelope, "
                        "or total throughput (default: mean-ratio)")
    p.add_argument("--max-batch-size", type=int, default=1024, help="end of vLLM's off range (default 1024)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--out", help="directory for tune.json, tune_config.yaml and sglang_adaptive_config.json")
    p.set_defaults(func=_run)
