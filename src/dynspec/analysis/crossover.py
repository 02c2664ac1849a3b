"""Where speculation stops paying, profile by profile.

Two views of the same question (dynspec.analysis.levels names them). Per step, the *step crossover*:
a speculative step emits accept_length tokens per request and costs spec/plain plain steps,
so it pays at batch b exactly while accept_length > spec(b) / plain(b) (`Profile.crossover_batch`,
`step_crossover` here, tabulated by `step_crossover_table`). Under load: the simulator runs
baseline, eagle3 and the dynamic policy at each concurrency, where prefill and the spread of
acceptance across requests also count, and each arm is measured against the envelope
max(baseline, eagle3) (dynspec.analysis.levels.envelope).  The figures of these tables are the report's
(dynspec.analysis.report.figures: step_cost_figure, forward_curve_figure).
"""

from __future__ import annotations

import pandas as pd

from dynspec.analysis import levels as lv
from dynspec.sim.profile import Profile, load_profile, shipped_profiles

ACCEPT_LENGTHS = (2.0, 2.5, 3.0)
LEVELS = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 160, 192, 256)
STATIC = ("baseline", "eagle3")


def load_profiles(names=None) -> list[Profile]:
    return [load_profile(n) for n in (names or shipped_profiles())]


def step_crossover(p: Profile, accept_length: float | None = None, context: float | None = None,
                   up_to: int | None = None) -> int | None:
    """The step crossover: the batch size from which a speculative step no longer pays at this accept
    length and context (1: not even at batch 1; None: it pays up to `up_to`), `Profile.crossover_batch`."""
    return p.crossover_batch(accept_length, context, up_to=up_to)


def _crossover_cell(p: Profile, al: float, table) -> str:
    """Where it stops paying within this table's measured batch sizes, else on its extended last segment."""
    ctx, last = table.context_len, table.batch_size[-1]
    b = step_crossover(p, al, ctx, up_to=last)
    if b == 1:
        return "never"
    if b is not None:
        return str(b)
    far = step_crossover(p, al, ctx, up_to=4 * last)  # on the last measured segment, extended
    return f"> {last} (~{far}, extrapolated)" if far else f"> {last} (> {4 * last} extrapolated)"


def step_crossover_table(profiles: list[Profile], accept_lengths=ACCEPT_LENGTHS) -> pd.DataFrame:
    """One row per profile and context: the step crossover, the batch size from which speculation no
    longer pays per step, at each accept length ("never": not even at batch 1)."""
    rows = []
    for p in profiles:
        for t in p.steps:
            row = {"profile": p.name, "provenance": p.provenance.kind, "context": t.context_len or "-",
                   "measured to batch": t.batch_size[-1],
                   "spec/plain at batch 1": round(p.spec_time(1, t.context_len) / p.plain_time(1, t.context_len), 2)}
            for al in accept_lengths:
                row[f"stops paying at accept length {al:g}"] = _crossover_cell(p, al, t)
            rows.append(row)
    return pd.DataFrame(rows)


crossover_table = step_crossover_table  # the name the notebook and tests knew it by


def simulate_envelope(profile: Profile, levels=LEVELS, seeds: int = 1, arms=("dynamic",), **workload) -> pd.DataFrame:
    """Simulated output tok/s of baseline, eagle3 and `arms` at each level and seed, with each
    arm's ratio to max(baseline, eagle3) of the same seed: one row per (arm, level, seed)."""
    from dynspec.sim.run import run_sim

    rows = []
    for seed in range(seeds):
        rows += [{**r, "seed": seed} for r in run_sim(profile, [*STATIC, *arms], list(levels), seed=seed, **workload)]
    df = pd.DataFrame(rows)
    best = lv.envelope(df, ["concurrency", "seed"], STATIC).set_index(["concurrency", "seed"])["envelope"]
    df = df.join(best, on=["concurrency", "seed"])
    df["of_envelope"] = df.output_throughput / df.envelope
    return df


def envelope_by_profile(profiles: list[Profile], levels=LEVELS, seeds: int = 1, arm: str = "dynamic",
                        **workload) -> pd.DataFrame:
    """Per profile: the arm's worst ratio to the envelope over levels and seeds, and where."""
    rows = []
    for p in profiles:
        df = simulate_envelope(p, levels, seeds, (arm,), **workload)
        mine = df[df.arm == arm]
        worst = mine.loc[mine.of_envelope.idxmin()]
        eagle_wins = sorted(c for c, g in df[df.seed == 0].groupby("concurrency")
                            if g.set_index("arm").output_throughput["eagle3"] > g.set_index("arm").output_throughput["baseline"])
        rows.append({"profile": p.name, "levels": f"{min(levels)}-{max(levels)}",
                     "eagle3 beats baseline at C": _ranges(eagle_wins, levels),
                     f"{arm}: worst of envelope": round(float(worst.of_envelope), 3),
                     "at C": int(worst.concurrency),
                     f"{arm}: mean of envelope": round(float(mine.of_envelope.mean()), 3)})
    return pd.DataFrame(rows)


def _ranges(chosen: list[int], levels) -> str:
    """The chosen levels as runs of consecutive levels: '1-96', 'none', '1-8, 32'."""
    levels = sorted(levels)
    if not chosen:
        return "none"
    runs, start, prev = [], chosen[0], chosen[0]
    for c in chosen[1:]:
        if levels.index(c) != levels.index(prev) + 1:
            runs.append((start, prev))
            start = c
        prev = c
    runs.append((start, prev))
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
