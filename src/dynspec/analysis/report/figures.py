"""The report's figures (matplotlib and seaborn, imported when a figure is drawn): each arm the
same colour in every figure, concurrency on a log axis labelled at the measured levels.  Each
figure carries the words that stand for it (alt_text.describe): `alt_text.show` displays it with them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from dynspec.analysis.crossover import ACCEPT_LENGTHS
import dynspec.analysis.report.alt_text as alt
from dynspec.analysis.report.run import SEED_LABEL
from dynspec.analysis.report.tables import arm_order, envelope_table, pareto_points, roles, speedup_table, static_arms
from dynspec.results import percentile_label

if TYPE_CHECKING:
    from dynspec.sim.profile import Profile


FEW_SPEC_STEPS = 0.2  # below this share of steps speculated, an accept length is a probe's estimate


# Colours by role, the same arm the same colour in every figure: plain servers blue,
# always-speculate arms red/purple, policies green/orange and on.
_PLAIN_COLOURS = ["tab:blue", "tab:cyan", "navy"]


_SPEC_COLOURS = ["tab:red", "tab:purple", "tab:pink", "darkred"]


_POLICY_COLOURS = ["tab:green", "tab:orange", "tab:olive", "tab:brown", "tab:gray", "gold"]


def palette(levels: pd.DataFrame) -> dict[str, str]:
    plain, spec = static_arms(levels)
    rest = [a for a in arm_order(levels) if a not in plain and a not in spec]
    out = {}
    for arms, colours in ((plain, _PLAIN_COLOURS), (spec, _SPEC_COLOURS), (rest, _POLICY_COLOURS)):
        out.update({a: colours[i % len(colours)] for i, a in enumerate(arms)})
    return out


def _style():
    import matplotlib.pyplot as plt
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="notebook")
    return plt, sns


def _log_x(ax, levels: pd.Series) -> None:
    """A log concurrency axis labelled at the measured levels, thinned so labels do not collide."""
    from matplotlib.ticker import FixedLocator, NullLocator, ScalarFormatter

    ax.set_xscale("log")
    ticks: list[int] = []
    measured = sorted({int(c) for c in levels.dropna()})
    for c in measured:
        if not ticks or c / ticks[-1] >= 1.6:
            ticks.append(c)
    if measured and ticks[-1] != measured[-1]:  # the highest level is always labelled
        if len(ticks) > 1 and measured[-1] / ticks[-1] < 1.6:
            ticks.pop()
        ticks.append(measured[-1])
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.set_xlabel("concurrency (clients, log scale)")


def _concurrency_axes(ax, levels: pd.Series, ylabel: str, title: str) -> None:
    """A panel over the concurrency levels: the log x axis, its y label and its title."""
    _log_x(ax, levels)
    ax.set_ylabel(ylabel)
    ax.set_title(title)


def _arm_lines(sns, ax, data: pd.DataFrame, y: str, levels: pd.DataFrame, **kw) -> None:
    """One line per arm in its colour; runs told apart by line style when there are several."""
    order = [a for a in arm_order(levels) if a in set(data["arm"])]
    several = data["run_id"].nunique() > 1 if "run_id" in data else False
    sns.lineplot(data=data, x="concurrency", y=y, hue="arm", hue_order=order, palette=palette(levels),
                 style="run_id" if several else "arm", style_order=None if several else order,
                 markers=True, dashes=several, ax=ax, **kw)


def _legend_below(fig, ax) -> None:
    """The legend in rows under the figure, so long labels never squeeze the axes."""
    fig.tight_layout()
    if ax.get_legend() is None:
        return
    handles, labels = ax.get_legend_handles_labels()
    ax.get_legend().remove()
    ncol = min(len(labels), 4)
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=ncol, fontsize=8,
               frameon=False)


def throughput_figure(levels: pd.DataFrame, reference: pd.DataFrame | None = None):
    """Output throughput vs concurrency per arm; the seed's measurements as squares beside them.

    The seed measured three levels, so its points stand alone: a line between them
    would claim values it never measured.
    """
    plt, sns = _style()
    fig, ax = plt.subplots(figsize=(10, 4.8))
    d = levels.dropna(subset=["output_throughput"])
    _arm_lines(sns, ax, d, "output_throughput", levels)
    xs = d["concurrency"]
    if reference is not None and len(reference):
        base, spec = roles(levels)
        colours = palette(levels)
        role_colour = {role: colours.get(arm, fallback) if arm is not None else fallback
                       for role, arm, fallback in (("baseline", base, "0.25"), ("eagle3", spec, "tab:red"))}
        for arm, r in reference.groupby("arm"):
            r = r.sort_values("concurrency")
            ax.plot(r["concurrency"], r["output_throughput"], linestyle="none", marker="s", markersize=9,
                    markerfacecolor="white", markeredgewidth=2, color=role_colour.get(arm, "0.5"),
                    label=f"{arm} ({SEED_LABEL})")
            for _, p in r[r["approximate"]].iterrows():
                ax.annotate("~", (p["concurrency"], p["output_throughput"]), textcoords="offset points",
                            xytext=(7, 5))
        xs = pd.concat([xs, reference["concurrency"]])
    _concurrency_axes(ax, xs, "output throughput (tok/s)", "Output throughput vs concurrency")
    _legend_below(fig, ax)
    return alt.describe(fig, alt.throughput(levels, reference))


def speedup_figure(levels: pd.DataFrame):
    plt, sns = _style()
    sp = speedup_table(levels).dropna(subset=["speedup"])
    fig, ax = plt.subplots(figsize=(10, 4.2))
    _arm_lines(sns, ax, sp, "speedup", levels)
    ax.axhline(1.0, color="0.3", linewidth=1)
    _concurrency_axes(ax, sp["concurrency"], "output throughput / baseline",
                      "Speedup over the baseline (above 1: speculation pays)")
    _legend_below(fig, ax)
    return alt.describe(fig, alt.speedup(levels))


def envelope_figure(levels: pd.DataFrame):
    """Throughput with the envelope max(baseline, eagle3), and each arm's share of it."""
    plt, sns = _style()
    env = envelope_table(levels).dropna(subset=["of_envelope"])
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(13, 4.4))
    e = env.drop_duplicates(["run_id", "concurrency"]).sort_values("concurrency")
    a1.fill_between(e["concurrency"], 0, e["envelope"], color="0.88", label="envelope")
    _arm_lines(sns, a1, env, "output_throughput", levels, legend=False)
    _concurrency_axes(a1, env["concurrency"], "output throughput (tok/s)", "Arms against the envelope (grey)")
    _arm_lines(sns, a2, env, "of_envelope", levels)
    a2.axhline(1.0, color="0.3", linewidth=1)
    _concurrency_axes(a2, env["concurrency"], "share of envelope", "How close each arm comes to the envelope")
    _legend_below(fig, a2)
    return alt.describe(fig, alt.envelope(levels))


def latency_figure(levels: pd.DataFrame, percentiles=(50, 99)):
    """TTFT and TPOT at each percentile (one line style each), per arm."""
    plt, sns = _style()
    parts = []
    stats = [percentile_label(p) for p in percentiles]
    for metric in ("ttft", "tpot"):
        for stat in stats:
            col = f"{stat}_{metric}_ms"
            if col not in levels:
                continue
            d = levels[["arm", "concurrency", col]].rename(columns={col: "ms"})
            parts.append(d.assign(metric=metric.upper(), percentile=stat))
    long = pd.concat(parts).dropna(subset=["ms"])
    order = [a for a in arm_order(levels) if a in set(long["arm"])]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.4))
    for ax, metric in zip(axes, ("TTFT", "TPOT")):
        sns.lineplot(data=long[long["metric"] == metric], x="concurrency", y="ms", hue="arm", hue_order=order,
                     palette=palette(levels), style="percentile", style_order=stats, markers=True,
                     ax=ax, legend=metric == "TPOT")
        ax.set_yscale("log")
        _concurrency_axes(ax, long["concurrency"], f"{metric} (ms, log scale)",
                          f"{metric}: {', '.join(stats)} (one line style each)")
    _legend_below(fig, axes[1])
    return alt.describe(fig, alt.latency(levels, percentiles))


def pareto_figure(levels: pd.DataFrame, percentile: float = 50, slo_tpot_ms: float | None = None):
    """Output throughput against tokens per second per user (1000 / TPOT at the percentile), one line
    per arm through its levels; the run's Pareto front outlined; an SLO on TPOT as a line."""
    plt, sns = _style()
    d = pareto_points(levels, percentile)
    fig, ax = plt.subplots(figsize=(8, 5))
    order = [a for a in arm_order(levels) if a in set(d["arm"])]
    colours = palette(levels)
    for arm in order:
        a = d[d["arm"] == arm].sort_values("concurrency")
        ax.plot(a["per_user"], a["output_throughput"], marker="o", color=colours.get(arm), label=arm)
    front = d[d["pareto"]].sort_values("per_user")
    ax.plot(front["per_user"], front["output_throughput"], linestyle="none", marker="o", markersize=13,
            markerfacecolor="none", markeredgecolor="black", label="Pareto front")
    if slo_tpot_ms:
        ax.axvline(1000.0 / slo_tpot_ms, color="grey", linestyle="--", label=f"TPOT SLO {slo_tpot_ms:g} ms")
    ax.set_xlabel(f"tokens/s per user (1000 / {percentile_label(percentile)} TPOT ms)")
    ax.set_ylabel("output tokens/s")
    ax.set_title("Throughput against interactivity (each point a concurrency level)")
    ax.legend()
    _legend_below(fig, ax)
    return alt.describe(fig, alt.pareto(levels, percentile, slo_tpot_ms))


def speculation_figure(levels: pd.DataFrame):
    """Accept length and the fraction of decode steps speculated, against the load.

    With closed-loop clients the decode batch is the number of requests in flight, at
    most the concurrency, so concurrency stands for batch size here.
    """
    plt, sns = _style()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(13, 4.2))
    acc = levels.dropna(subset=["accept_length"])
    # An arm that speculates on a few steps only (a policy's probes) estimates its accept
    # length from few verifies: drawn as hollow points, not joined, so the noise does not
    # read as a trend.
    few = acc["spec_step_fraction"].fillna(1.0) < FEW_SPEC_STEPS
    if (~few).any():
        _arm_lines(sns, a1, acc[~few], "accept_length", levels, legend=False)
    colours = palette(levels)
    for arm, d in acc[few].groupby("arm"):
        a1.plot(d["concurrency"], d["accept_length"], linestyle="none", marker="o", markersize=6,
                markerfacecolor="none", color=colours.get(arm, "0.5"),
                label=f"{arm} (under {FEW_SPEC_STEPS:.0%} of steps speculated)")
    if few.any():
        a1.legend(fontsize=8, loc="lower left")
    # From 1 (nothing accepted): a cut axis makes small differences look large.
    top = max(2.0, float(acc["accept_length"].max()) if len(acc) else 2.0)
    a1.set_ylim(1.0, top * 1.05)
    a1.set_ylabel("accept length (tokens per verify)")
    a1.set_title("Accept length (bonus token included; 1 = nothing accepted)")
    frac = levels.dropna(subset=["spec_step_fraction"])
    if len(frac):
        _arm_lines(sns, a2, frac, "spec_step_fraction", levels)
    a2.set_ylim(-0.05, 1.05)
    a2.set_ylabel("fraction of decode steps speculated")
    a2.set_title("Steps speculated vs batch size")
    for ax in (a1, a2):
        _log_x(ax, levels["concurrency"])
        ax.set_xlabel("concurrency = max decode batch size (log scale)")
    _legend_below(fig, a2)
    return alt.describe(fig, alt.speculation(levels))


# Profiles (the report's "By profile": dynspec.analysis.crossover's tables beside them) ----------------

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
    return alt.describe(fig, alt.step_cost(profiles, accept_lengths))


def forward_curve_figure(profiles: list[Profile]):
    """For each measured table with a forward_ms curve: the target's forward time against the
    tokens it processes (batch x q), a line per q. Where the lines for different q lie on one
    curve, time depends only on the tokens, i.e. the forward is compute-bound; a verify of q=k+1
    tokens gets there at a k+1 times smaller batch than a plain step. None when no profile has one."""
    import matplotlib.pyplot as plt

    tables = [(p, t, t.forward_ms) for p in profiles for t in p.steps if t.forward_ms]
    if not tables:
        return None
    fig, axes = plt.subplots(1, len(tables), figsize=(4.2 * len(tables), 3.8), squeeze=False, sharey=True)
    for ax, (p, t, forward_ms) in zip(axes[0], tables):
        for q, ms in sorted(forward_ms.items()):
            ax.plot([b * q for b in t.batch_size], ms, marker="o", ms=3, label=f"q={q}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("tokens in the forward (batch x q)")
        ax.set_title(f"{p.name}, context {t.context_len}", fontsize=10)
    axes[0][0].set_ylabel("target forward, ms")
    axes[0][-1].legend(loc="upper left", fontsize=8, frameon=False)
    fig.tight_layout()
    return alt.describe(fig, alt.forward_curve(profiles))
