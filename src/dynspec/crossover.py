"""Where speculation stops paying, profile by profile.

Two views of the same question. Per step: a speculative step emits accept_length tokens
per request and costs spec/plain plain steps, so it pays at batch b exactly while
accept_length > spec(b) / plain(b) (`Profile.crossover_batch`). Under load: the simulator
runs baseline, eagle3 and the dynamic policy at each concurrency, where prefill and the
spread of acceptance across requests also count, and each arm is measured against the
envelope max(baseline, eagle3).
"""

from __future__ import annotations

import pandas as pd

from dynspec.profile import Profile, load_profile, shipped_profiles

ACCEPT_LENGTHS = (2.0, 2.5, 3.0)
LEVELS = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 160, 192, 256)
STATIC = ("baseline", "eagle3")


def load_profiles(names=None) -> list[Profile]:
    return [load_profile(n) for n in (names or shipped_profiles())]


def _crossover_cell(p: Profile, al: float, table) -> str:
    """Where it stops paying within this table's measured batch sizes, else on its extended last segment."""
    ctx, last = table.context_len, table.batch_size[-1]
    b = p.crossover_batch(al, ctx, up_to=last)
    if b == 1:
        return "never"
    if b is not None:
        return str(b)
    far = p.crossover_batch(al, ctx, up_to=4 * last)  # on the last measured segment, extended
    return f"> {last} (~{far}, extrapolated)" if far else f"> {last} (> {4 * last} extrapolated)"


def crossover_table(profiles: list[Profile], accept_lengths=ACCEPT_LENGTHS) -> pd.DataFrame:
    """One row per profile and context: the batch size from which speculation no longer pays
    per step, at each accept length ("never": not even at batch 1)."""
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


def simulate_envelope(profile: Profile, levels=LEVELS, seeds: int = 1, arms=("dynamic",), **workload) -> pd.DataFrame:
    """Simulated output tok/s of baseline, eagle3 and `arms` at each level and seed, with each
    arm's ratio to max(baseline, eagle3) of the same seed: one row per (arm, level, seed)."""
    from dynspec.sim import run_sim

    rows = []
    for seed in range(seeds):
        rows += [{**r, "seed": seed} for r in run_sim(profile, [*STATIC, *arms], list(levels), seed=seed, **workload)]
    df = pd.DataFrame(rows)
    best = df[df.arm.isin(STATIC)].groupby(["concurrency", "seed"]).output_throughput.max().rename("envelope")
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


def step_cost_figure(profiles: list[Profile], accept_lengths=ACCEPT_LENGTHS):
    """spec/plain step time against batch size, a line per profile and context; speculation pays
    below the dotted line of its accept length."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    for p in profiles:
        for t in p.steps:
            label = p.name + (f" (context {t.context_len})" if p.context_aware else "")
            bs = t.batch_size
            ax.plot(bs, [s / q for s, q in zip(t.spec_total_ms, t.plain_ms)], marker="o", ms=3, label=label)
    for al in accept_lengths:
        ax.axhline(al, ls=":", lw=1, color="0.4")
        ax.annotate(f"accept length {al:g}", (1, al), xytext=(2, 2), textcoords="offset points", fontsize=8,
                    color="0.3")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size (requests in the decode step)")
    ax.set_ylabel("speculative / plain step time")
    ax.set_title("Speculation pays while the curve is below the accept length")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8, frameon=False)
    fig.tight_layout()
    return fig


def forward_curve_figure(profiles: list[Profile]):
    """For each measured table with a forward_ms curve: the target's forward time against the
    tokens it processes (batch x q), a line per q. Where the lines for different q lie on one
    curve, time depends only on the tokens, i.e. the forward is compute-bound; a verify of q=k+1
    tokens gets there at a k+1 times smaller batch than a plain step. None when no profile has one."""
    import matplotlib.pyplot as plt

    tables = [(p, t) for p in profiles for t in p.steps if t.forward_ms]
    if not tables:
        return None
    fig, axes = plt.subplots(1, len(tables), figsize=(4.2 * len(tables), 3.8), squeeze=False, sharey=True)
    for ax, (p, t) in zip(axes[0], tables):
        for q, ms in sorted(t.forward_ms.items()):
            ax.plot([b * q for b in t.batch_size], ms, marker="o", ms=3, label=f"q={q}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("tokens in the forward (batch x q)")
        ax.set_title(f"{p.name}, context {t.context_len}", fontsize=10)
    axes[0][0].set_ylabel("target forward, ms")
    axes[0][-1].legend(loc="upper left", fontsize=8, frameon=False)
    fig.tight_layout()
    return fig
