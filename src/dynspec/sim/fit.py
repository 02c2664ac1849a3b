"""Fit a profile's step times so that the simulator reproduces published throughputs.

A fit spec (YAML, configs/fits/) names the throughputs to hit: output tok/s of the
baseline and EAGLE-3 arms at given concurrencies, or EAGLE-3 as a speedup over the
baseline.  The profile's step tables have a knot at each target concurrency; the
fit runs `dynspec sim` itself in the loop (closed-loop clients, prefill included)
and rescales each knot's step time by simulated/target throughput until every
target is met.  Knots without a baseline target follow an assumed slope from the
first knot.  Everything the numbers do not pin down is an assumption, written in
the spec and copied into the profile's provenance.

    dynspec fit configs/fits/seed-blackwell.yaml --out src/dynspec/sim/profiles/seed-blackwell.yaml
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from dynspec import models
from dynspec.models import Model, field_default
from dynspec.sim.profile import (
    Acceptance,
    Prefill,
    Profile,
    Provenance,
    Speculative,
    Steps,
    dump_profile,
)
from dynspec.io.typed_yaml import parse_model, read_yaml
from dynspec.sim.lengths import closed_level_seed, level_lengths


class Target(Model):
    concurrency: int = Field(ge=1)
    baseline: float | None = Field(None, gt=0)  # output tok/s
    eagle3: float | None = Field(None, gt=0)  # output tok/s
    eagle3_speedup: float | None = Field(None, gt=0)  # eagle3 / baseline at this concurrency
    # The sweep repeats whose mean the figures are: each draws its own prompts, and the simulated
    # figure is the mean over the same draws (None: the first repeat's).
    repeats: list[int] | None = Field(None, min_length=1)
    note: str = ""

    @model_validator(mode="after")
    def _one_eagle(self) -> "Target":
        if self.eagle3 is not None and self.eagle3_speedup is not None:
            raise ValueError("give eagle3 or eagle3_speedup, not both")
        return self


class Workload(Model):
    """The simulated workload of the fit: lengths default to models.Workload's, as dynspec sim."""

    input_len: int = Field(field_default(models.Workload, "input_len"), ge=1)
    output_len: int = Field(field_default(models.Workload, "output_len"), ge=1)
    num_prompts: int | None = Field(None, ge=1)  # default: max(prompts_per_client*C, min_prompts)
    prompts_per_client: int = Field(field_default(models.Workload, "prompts_per_client"), ge=1)
    min_prompts: int = Field(field_default(models.Workload, "min_prompts"), ge=1)
    # Lengths uniform in [range_ratio x len, len], input and output, drawn as a sweep's random prompts
    # of the level's first repeat are (1: every request input_len / output_len).
    range_ratio: float = Field(1.0, gt=0, le=1)
    seed: int = 0

    def level(self, concurrency: int, repeat: int = 0) -> dict:
        """simulate_level's workload arguments at one closed-loop level and repeat."""
        n = self.num_prompts or max(self.prompts_per_client * concurrency, self.min_prompts)
        if self.range_ratio >= 1.0:
            return dict(num_prompts=n, input_len=self.input_len, output_len=self.output_len, seed=self.seed)
        seed = closed_level_seed(self.seed, concurrency, repeat)  # as a sweep draws that repeat's
        return dict(lengths=level_lengths(seed, n, self.input_len, self.output_len, self.range_ratio), seed=seed)


class FitSpec(Model):
    name: str
    description: str = ""
    hardware: str = ""
    model: str = ""
    speculative: Speculative
    acceptance: Acceptance
    prefill: Prefill
    workload: Workload = Workload()
    targets: list[Target] = Field(min_length=1)
    # Plain step time per extra request (ms) for knots without a baseline target.
    plain_slope_ms: float | None = Field(None, ge=0)
    # The draft-extend a plain step pays inside a server that can switch back to speculating, as a
    # fraction of the plain step at each knot: written as extend_ms (Profile.catch_up_time).  The
    # fitted arms (plain server, always speculating) never pay it, so the fit does not depend on it.
    catch_up_fraction: float = Field(0.0, ge=0, lt=1)
    # Given: the catch-up is the patch's KV-only one: catch_up_fraction is written as
    # catchup_ms, and this share of the plain step as resume_ms, paid once per switch to speculating.
    resume_fraction: float | None = Field(None, ge=0, lt=1)
    # Or both shares per knot from a calibrated profile (name or path) with catchup_ms and resume_ms:
    # its catchup/plain and resume/plain at the knot's batch size, at the workload's mean context
    # (clamped to the measured contexts).
    catch_up_from: str | None = None
    tolerance: float = Field(0.03, gt=0, lt=1)  # relative error every target must meet
    source: str
    kind: Literal["fitted", "derived"] = "fitted"
    assumptions: list[str] = []

    @model_validator(mode="after")
    def _check(self) -> "FitSpec":
        cs = [t.concurrency for t in self.targets]
        if cs != sorted(set(cs)):
            raise ValueError("targets must have distinct concurrencies in increasing order")
        if len(cs) < 2:
            raise ValueError("need targets at two or more concurrencies (a profile needs two knots)")
        if self.targets[0].baseline is None:
            raise ValueError("the first target needs a baseline throughput")
        if self.acceptance.mean_accepted > self.speculative.num_steps:
            raise ValueError(f"acceptance.accept_length {self.acceptance.accept_length:g} exceeds "
                             f"1 + speculative.num_steps = {1 + self.speculative.num_steps}")
        for t in self.targets:
            if t.eagle3 is None and t.eagle3_speedup is None:
                raise ValueError(f"target at concurrency {t.concurrency} has no eagle3 figure")
            if t.baseline is None and self.plain_slope_ms is None:
                raise ValueError(f"target at concurrency {t.concurrency} has no baseline: give plain_slope_ms")
        if self.catch_up_from and (self.catch_up_fraction or self.resume_fraction is not None):
            raise ValueError("give catch_up_from or catch_up_fraction/resume_fraction, not both")
        return self


class FitError(ValueError):
    """A fit spec that cannot be read or a fit that did not converge."""


def load_fit_spec(path: str | Path) -> FitSpec:
    path = Path(path)
    return parse_model(FitSpec, read_yaml(path, FitError, "fit spec"), str(path), FitError, "fit spec")


def catch_up_shares(spec: FitSpec) -> tuple[list[float], list[float] | None, list[str]]:
    """Per knot, the plain step's catch-up share and the switch's resume share (None: the old full
    draft-extend model, no resume), and the assumption lines that say where they came from."""
    n = len(spec.targets)
    if not spec.catch_up_from:
        resume = None if spec.resume_fraction is None else [spec.resume_fraction] * n
        return [spec.catch_up_fraction] * n, resume, []
    from dynspec.sim.profile import ProfileError, load_profile

    try:
        src = load_profile(spec.catch_up_from)
    except ProfileError as exc:
        raise FitError(f"catch_up_from: {exc}") from None
    if src.steps[0].catchup_ms is None:
        raise FitError(f"catch_up_from: profile {src.name} has no catchup_ms and resume_ms (calibrate it again)")
    ctx = None
    if src.context_aware:  # the workload's mean context, within the measured ones (shares, not times)
        measured = [t.context_len for t in src.steps if t.context_len is not None]  # several tables: all have one
        ctx = min(max(spec.workload.input_len + spec.workload.output_len / 2, measured[0]), measured[-1])
    bs = [t.concurrency for t in spec.targets]
    cu = [round(src.catch_up_time(b, ctx) / src.plain_time(b, ctx), 5) for b in bs]
    res = [round(src.resume_time(b, ctx) / src.plain_time(b, ctx), 5) for b in bs]

    def pct(xs):
        return ", ".join(f"{100 * x:.2f}%" for x in xs)
    when = f", {src.provenance.date}" if src.provenance.date else ""
    note = (f"a plain step inside a server that can switch back to speculating (dynspec's patched 0.5.9, KV-only "
            f"draft catch-up) costs the plain server's step plus {pct(cu)} of it (catchup_ms), and each switch to "
            f"speculating adds {pct(res)} of a plain step once (resume_ms), at batch {', '.join(map(str, bs))}: "
            f"the shares profile {src.name} measured at these batch sizes"
            + (f" and context {ctx:g}" if ctx is not None else "")
            + f" ({src.provenance.kind} on {src.hardware or 'unknown hardware'}{when}), not measured on this node")
    return cu, res, [note]


def build_profile(spec: FitSpec, plain_ms: list[float], spec_ms: list[float], command: str | None = None,
                  shares: tuple | None = None) -> Profile:
    cu, res, notes = shares or catch_up_shares(spec)
    catch_up = [round(f * x, 4) for f, x in zip(cu, plain_ms)] if any(cu) or res is not None else None
    columns: dict[str, Any] = ({"extend_ms": catch_up} if res is None else
               {"catchup_ms": catch_up, "resume_ms": [round(f * x, 4) for f, x in zip(res, plain_ms)]})
    return Profile(
        name=spec.name, description=spec.description, hardware=spec.hardware, model=spec.model,
        speculative=spec.speculative, acceptance=spec.acceptance, prefill=spec.prefill,
        steps=[Steps(batch_size=[t.concurrency for t in spec.targets],
                     plain_ms=[round(x, 4) for x in plain_ms], spec_ms=[round(x, 4) for x in spec_ms], **columns)],
        provenance=Provenance(kind=spec.kind, source=spec.source, command=command,
                              assumptions=list(spec.assumptions) + notes),
    )


def simulate_targets(profile: Profile, spec: FitSpec) -> dict[tuple[str, int], float]:
    """Simulated output tok/s of baseline and eagle3 at every target concurrency."""
    from dynspec.sim.run import simulate_level

    w = spec.workload
    out = {}
    for t in spec.targets:
        repeats = t.repeats if t.repeats and w.range_ratio < 1.0 else [0]  # (fixed lengths: one draw)
        for arm in ("baseline", "eagle3"):
            runs = [simulate_level(profile, arm, t.concurrency, **w.level(t.concurrency, r))[0] for r in repeats]
            out[(arm, t.concurrency)] = sum(m["output_throughput"] for m in runs) / len(runs)
    return out


def target_values(spec: FitSpec, simulated: dict[tuple[str, int], float]) -> dict[tuple[str, int], float]:
    """The throughput each (arm, concurrency) must reach; speedups are relative to the simulated baseline."""
    want = {}
    for t in spec.targets:
        if t.baseline is not None:
            want[("baseline", t.concurrency)] = t.baseline
        if t.eagle3 is not None:
            want[("eagle3", t.concurrency)] = t.eagle3
        else:
            assert t.eagle3_speedup is not None  # Target: eagle3 or eagle3_speedup (FitSpec._check)
            want[("eagle3", t.concurrency)] = t.eagle3_speedup * simulated[("baseline", t.concurrency)]
    return want


def _sloped_plain_ms(spec: FitSpec, first_ms: float, concurrency: int) -> float:
    """A knot without a baseline target: the first knot's plain step plus plain_slope_ms per extra request."""
    assert spec.plain_slope_ms is not None  # FitSpec._check: given whenever a target has no baseline
    return first_ms + spec.plain_slope_ms * (concurrency - spec.targets[0].concurrency)


def fit(spec: FitSpec, *, max_iter: int = 40, command: str | None = None, log=None) -> tuple[Profile, list[dict]]:
    """Fit knot step times; return the profile and a table of target vs simulated figures."""
    accept = spec.acceptance.accept_length
    # Start from steady state: a full batch of C emits C tokens per plain step.
    plain = []
    for t in spec.targets:
        if t.baseline is not None:
            plain.append(1000.0 * t.concurrency / t.baseline)
        else:
            plain.append(_sloped_plain_ms(spec, plain[0], t.concurrency))
    specs_ = []
    for t, tp in zip(spec.targets, plain):
        if t.eagle3 is not None:
            specs_.append(1000.0 * t.concurrency * accept / t.eagle3)
        else:
            assert t.eagle3_speedup is not None  # Target: eagle3 or eagle3_speedup (FitSpec._check)
            specs_.append(tp * accept / t.eagle3_speedup)
    shares = catch_up_shares(spec)
    for it in range(max_iter):
        profile = build_profile(spec, plain, specs_, command, shares)
        sim = simulate_targets(profile, spec)
        want = target_values(spec, sim)
        errors = {k: sim[k] / v - 1.0 for k, v in want.items()}
        worst = max(abs(e) for e in errors.values())
        if log:
            log(f"iteration {it}: worst error {100 * worst:.2f}%")
        if worst < spec.tolerance / 4:
            break
        # Throughput goes as 1/step time: scale each knot by simulated/target.
        for i, t in enumerate(spec.targets):
            if ("baseline", t.concurrency) in want and t.baseline is not None:
                plain[i] *= sim[("baseline", t.concurrency)] / want[("baseline", t.concurrency)]
            specs_[i] *= sim[("eagle3", t.concurrency)] / want[("eagle3", t.concurrency)]
        for i, t in enumerate(spec.targets):
            if t.baseline is None:
                plain[i] = _sloped_plain_ms(spec, plain[0], t.concurrency)
    table = []
    for (arm, c), v in want.items():
        table.append({"arm": arm, "concurrency": c, "target": v, "simulated": sim[(arm, c)],
                      "error": errors[(arm, c)]})
    table.sort(key=lambda r: (r["arm"], r["concurrency"]))
    if worst > spec.tolerance:
        raise FitError(f"fit of {spec.name} did not converge: worst error {100 * worst:.1f}% "
                       f"> {100 * spec.tolerance:.0f}% after {max_iter} iterations")
    return profile, table


def format_table(table: list[dict]) -> str:
    lines = [f"{'arm':9s} {'C':>4s} {'target':>9s} {'simulated':>10s} {'error':>7s}"]
    for r in table:
        lines.append(f"{r['arm']:9s} {r['concurrency']:4d} {r['target']:9.1f} {r['simulated']:10.1f} "
                     f"{100 * r['error']:+6.2f}%")
    return "\n".join(lines)


def profile_yaml(profile: Profile, table: list[dict]) -> str:
    """The profile as YAML, headed by the fit's residuals as comments."""
    head = [f"{profile.name}: written by `{profile.provenance.command}`; do not edit by hand.",
            "Simulated vs target output tok/s (workload in provenance.assumptions):"]
    head += ["  " + line for line in format_table(table).splitlines()]
    return dump_profile(profile.model_dump(mode="json", exclude_none=True), head)
