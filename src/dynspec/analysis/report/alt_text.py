"""What each report figure shows, in words computed from the data it draws: the alt text of its
image in the published page (and in JupyterLab), so a reader who cannot see the figure gets the
arms, the axes and the finding rather than "no description".

`describe(fig, text)` attaches a text to a figure; `show(fig)` displays the figure as an <img>
carrying it.  The texts name every arm (or profile) drawn and say where the lines cross.
"""

from __future__ import annotations

import base64
import html
import io
from typing import TYPE_CHECKING, Any

import pandas as pd

from dynspec.analysis.report.tables import arm_order, envelope_table, pareto_points, roles, speedup_table
from dynspec.results import percentile_label

if TYPE_CHECKING:
    from dynspec.sim.profile import Profile

_ATTR = "dynspec_alt"


def describe(fig: Any, text: str) -> Any:
    """`fig` with `text` as the words that stand for it; returned for `return describe(fig, ...)`."""
    setattr(fig, _ATTR, text)
    return fig


def alt_of(fig: Any) -> str | None:
    return getattr(fig, _ATTR, None)


def show(fig: Any) -> bool:
    """Display `fig` as a PNG <img> with its alt text, and close it so the inline backend does not
    show it a second time without one.  False (nothing shown) when `fig` is None."""
    if fig is None:
        return False
    import matplotlib.pyplot as plt
    from IPython.display import HTML, display

    buf = io.BytesIO()
    # As matplotlib's inline backend draws it: the legend below the axes stays inside the image.
    fig.savefig(buf, format="png", bbox_inches="tight", dpi=fig.dpi, facecolor=fig.get_facecolor())
    plt.close(fig)
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    alt = alt_of(fig) or "A figure without a description"
    display(HTML(f'<img alt="{html.escape(alt, quote=True)}" style="max-width:100%" '
                 f'src="data:image/png;base64,{data}">'))
    return True


# --- pieces ----------------------------------------------------------------------------------------

def _names(items: list[str]) -> str:
    """a; a and b; a, b and c."""
    items = [str(i) for i in items]
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


def _levels_span(concurrency: pd.Series) -> str:
    cs = sorted({int(c) for c in concurrency.dropna()})
    if not cs:
        return "no level"
    return f"C={cs[0]}" if len(cs) == 1 else f"C={cs[0]} to {cs[-1]}"


def _by_run(table: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """(prefix, rows) per run: one run unnamed, compared runs each named ("In r1:")."""
    if "run_id" not in table or table["run_id"].nunique() <= 1:
        return [("", table)]
    return [(f" In {r}:", table[table["run_id"] == r]) for r in dict.fromkeys(table["run_id"])]


def _per_level(table: pd.DataFrame, arm: str, value: str) -> pd.Series:
    d = table[table["arm"] == arm].dropna(subset=[value])
    return d.groupby("concurrency")[value].mean().sort_index()


def _sides(ratio: pd.Series, above: str, below: str) -> str:
    """Where a ratio (indexed by concurrency) is >= 1 and where below: 'above up to C=4, below from C=16'."""
    if ratio.empty:
        return "no common level"
    up = ratio >= 1.0
    cs = [int(c) for c in ratio.index]
    if up.all():
        return f"{above} at every level"
    if not up.any():
        return f"{below} at every level"
    flags = list(up)
    switches = sum(a != b for a, b in zip(flags, flags[1:]))
    if switches == 1:
        last = max(i for i, f in enumerate(flags) if f == flags[0])
        first, then = (above, below) if flags[0] else (below, above)
        return f"{first} up to C={cs[last]}, {then} from C={cs[last + 1]}"
    ups = ", ".join(str(c) for c, f in zip(cs, flags) if f)
    downs = ", ".join(str(c) for c, f in zip(cs, flags) if not f)
    return f"{above} at C={ups}; {below} at C={downs}"


def _runs_note(table: pd.DataFrame) -> str:
    if "run_id" not in table or table["run_id"].nunique() <= 1:
        return ""
    return f" Runs {_names(list(dict.fromkeys(table['run_id'])))} in different line styles."


# --- a run's figures ---------------------------------------------------------------------------------

def throughput(levels: pd.DataFrame, reference: pd.DataFrame | None = None) -> str:
    d = levels.dropna(subset=["output_throughput"])
    arms = [a for a in arm_order(levels) if a in set(d["arm"])]
    text = (f"Output throughput (tok/s) against concurrency ({_levels_span(d['concurrency'])}, log scale) "
            f"for {_names(arms)}.")
    if reference is not None and len(reference):
        text += f" The seed's measurements for {_names(sorted(set(reference['arm'])))} as hollow squares."
    text += _runs_note(d)
    base, _ = roles(levels)
    for prefix, run in _by_run(d):
        text += prefix
        if base is not None:
            b = _per_level(run, base, "output_throughput")
            for arm in arms:
                if arm != base and arm in set(run["arm"]):
                    ratio = (_per_level(run, arm, "output_throughput") / b).dropna()
                    text += f" {arm} {_sides(ratio, f'above {base}', f'below {base}')}."
        if len(run):
            top = run.loc[run["output_throughput"].idxmax()]
            text += f" Highest: {top['arm']}, {top['output_throughput']:.0f} tok/s at C={int(top['concurrency'])}."
    return text


def speedup(levels: pd.DataFrame) -> str:
    sp = speedup_table(levels).dropna(subset=["speedup"])
    base, _ = roles(levels)
    arms = [a for a in arm_order(levels) if a in set(sp["arm"]) and a != base]
    text = (f"Output throughput over {base}'s against concurrency ({_levels_span(sp['concurrency'])}, log scale) "
            f"for {_names(arms)}; a line at 1 marks break-even (above it speculation pays).")
    text += _runs_note(sp)
    for prefix, run in _by_run(sp):
        text += prefix
        for arm in arms:
            s = _per_level(run, arm, "speedup")
            if len(s):
                text += (f" {arm}: {s.iloc[0]:.2f}x at C={int(s.index[0])} to {s.iloc[-1]:.2f}x at "
                         f"C={int(s.index[-1])}, {_sides(s, 'above 1', 'below 1')}.")
    return text


def envelope(levels: pd.DataFrame) -> str:
    env = envelope_table(levels).dropna(subset=["of_envelope"])
    arms = [a for a in arm_order(levels) if a in set(env["arm"])]
    text = (f"Left: output throughput of {_names(arms)} against concurrency ({_levels_span(env['concurrency'])}, "
            "log scale) under a grey band, the envelope max(baseline, eagle3). Right: each arm's share of the "
            "envelope, 1 meaning it matches the better static arm.")
    worst = []
    for arm in arms:
        s = _per_level(env, arm, "of_envelope")
        if len(s):
            worst.append(f"{arm} {s.min():.2f} at C={int(s.idxmin())}")
    if worst:
        text += f" Lowest share: {'; '.join(worst)}."
    return text


def latency(levels: pd.DataFrame, percentiles=(50, 99)) -> str:
    stats = [percentile_label(p) for p in percentiles]
    arms = arm_order(levels)
    text = (f"Left: TTFT, right: TPOT, in ms on a log scale, at {_names(stats)} (one line style each), against "
            f"concurrency ({_levels_span(levels['concurrency'])}, log scale) for {_names(arms)}.")
    col = f"{stats[0]}_tpot_ms"
    if col in levels:
        top = levels.dropna(subset=[col])
        if len(top):
            c = int(top["concurrency"].max())
            at = top[top["concurrency"] == c].groupby("arm")[col].mean().sort_values()
            text += (f" At C={c}, {stats[0]} TPOT is lowest for {at.index[0]} ({at.iloc[0]:.1f} ms) and highest "
                     f"for {at.index[-1]} ({at.iloc[-1]:.1f} ms).")
    return text


def pareto(levels: pd.DataFrame, percentile: float = 50, slo_tpot_ms: float | None = None) -> str:
    d = pareto_points(levels, percentile)
    arms = [a for a in arm_order(levels) if a in set(d["arm"])]
    text = (f"Output tokens/s against tokens/s per user (1000 / {percentile_label(percentile)} TPOT), one line per "
            f"arm through its concurrency levels, for {_names(arms)}.")
    front = d[d["pareto"]].sort_values("per_user")
    if len(front):
        pts = [f"{r.arm} at C={int(r.concurrency)}" for r in front.itertuples()]
        text += f" Circled, the Pareto front: {_names(pts)}."
    if slo_tpot_ms:
        text += f" A dashed line marks the TPOT SLO of {slo_tpot_ms:g} ms."
    return text


def speculation(levels: pd.DataFrame) -> str:
    acc = levels.dropna(subset=["accept_length"])
    frac = levels.dropna(subset=["spec_step_fraction"])
    acc_arms = [a for a in arm_order(levels) if a in set(acc["arm"])]
    frac_arms = [a for a in arm_order(levels) if a in set(frac["arm"])]
    text = (f"Left: accept length (tokens per verify, 1 = nothing accepted) for {_names(acc_arms) or 'no arm'}; "
            f"right: the fraction of decode steps speculated for {_names(frac_arms) or 'no arm'}; both against "
            f"concurrency ({_levels_span(levels['concurrency'])}, log scale).")
    for arm in frac_arms:
        s = _per_level(frac, arm, "spec_step_fraction")
        a = _per_level(acc, arm, "accept_length")
        part = f" {arm}: {s.iloc[0]:.2f} of steps speculated at C={int(s.index[0])}"
        part += f", {s.iloc[-1]:.2f} at C={int(s.index[-1])}" if len(s) > 1 else ""
        if len(a):
            lo, hi = f"{a.min():.2f}", f"{a.max():.2f}"
            part += f"; accept length {lo}" + (f" to {hi}" if hi != lo else "")
        text += part + "."
    return text


# --- profiles ---------------------------------------------------------------------------------------

def _profile_line(p: Profile, context_len: int | None) -> str:
    return p.name + (f" (context {context_len})" if p.context_aware else "")


def step_cost(profiles: list[Profile], accept_lengths) -> str:
    lines, ends = [], []
    for p in profiles:
        for t in p.steps:
            label = _profile_line(p, t.context_len)
            lines.append(label)
            r = [s / q for s, q in zip(t.spec_total_ms, t.plain_ms)]
            ends.append(f"{label} {r[0]:.2f} at batch {t.batch_size[0]} to {r[-1]:.2f} at batch {t.batch_size[-1]}")
    text = (f"Speculative over plain step time against batch size (log scale), one line each for {_names(lines)}; "
            f"dotted lines at accept length {_names([f'{a:g}' for a in accept_lengths])}: speculation pays "
            "per step while a line is below its accept length.")
    return text + (f" {'; '.join(ends)}." if ends else "")


def forward_curve(profiles: list[Profile]) -> str:
    panels = []
    for p in profiles:
        for t in p.steps:
            if t.forward_ms:
                qs = _names([f"q={q}" for q in sorted(t.forward_ms)])
                panels.append(f"{p.name}, context {t.context_len} ({qs})")
    return ("Target forward time (ms, log scale) against the tokens in the forward (batch x q, log scale), one "
            f"panel per measured table: {'; '.join(panels)}. Where the lines of different q lie on one curve "
            "the forward is compute-bound.")
