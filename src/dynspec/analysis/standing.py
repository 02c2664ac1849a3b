"""Where each switching arm stands, level by level, judged round by round.

A round measures every arm of a level side by side (an interleaved sweep), so a ratio within a
round cancels what moves the whole GPU between rounds (on one H200 a plain server's throughput
at one level moved by up to 30% from round to round, while the ratios moved far less).  Per level
this gives, for every switching arm: its share of the envelope (the better static arm of the same
round), averaged over rounds and its worst round (where the run has a plain and an always-speculating
arm); its ratio to the best other switching arm (a static cutoff, say); EAGLE-3 over plain; and, with a simulated twin of the run, sim over live.
Where a run has two servers doing the same work (two plain arms, say), `twin_spread` is the
fastest of them over the slowest, per round: the noise floor of one ratio in that design.

Against the strongest other switching arm of a level (`best_other`: the one the arm trails most
on the mean), the rounds also say whether "within MARGIN of it" is resolved: `vs_best_se` is the
standard error of the mean per-round ratio, the verdict `met` where the mean less two standard
errors is at or above 1 - MARGIN, `short` where the mean plus two is below it, else `unresolved`,
and `rounds_for_margin` how many rounds at this spread would make two standard errors MARGIN.

    python -m dynspec.analysis.standing RUN_DIR [--sim SIM_RUN_DIR] [--arm dynspec-goodput] [--skip ARM ...] [--margin 0.02]
        [--metric steady_output_throughput]

`--skip` leaves an arm out of every comparison: a server that is configured differently on
purpose (SGLang's torch layer bodies beside the fused ones, say) is no twin and no envelope.
`--metric steady_output_throughput` judges each level by its steady window (dynspec.results.steady_window)
rather than by the whole level, first wave and drain included.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import pandas as pd

from dynspec.analysis.levels import METRIC, envelope, static_arms, usable


def _read(run: Path) -> pd.DataFrame:
    path = run / "results.csv"
    if not path.is_file():
        raise SystemExit(f"standing: {run}: no results.csv (a dynspec sweep's run folder)")
    df = pd.read_csv(path)
    return df[usable(df)]


def _margin_verdict(ratios: pd.Series, margin: float) -> dict:
    """The mean per-round ratio to the strongest other arm, its standard error, and whether two
    standard errors settle "within `margin`" (one round settles nothing)."""
    n, mean = len(ratios), float(ratios.mean())
    sd = float(ratios.std(ddof=1)) if n > 1 else math.nan
    se = sd / math.sqrt(n) if n > 1 else math.nan
    floor = 1.0 - margin
    verdict = ("unresolved" if not n > 1 else "met" if mean - 2 * se >= floor
               else "short" if mean + 2 * se < floor else "unresolved")
    rounds = max(n, math.ceil((2 * sd / margin) ** 2)) if n > 1 else math.nan
    return {"vs_best": mean, "vs_best_se": se, "verdict": verdict, "rounds_for_margin": rounds}


def standing(results: pd.DataFrame, arm: str, sim: pd.DataFrame | None = None,
             margin: float = 0.02, metric: str = METRIC) -> pd.DataFrame:
    """One row per concurrency: `arm`'s share of the envelope (mean over rounds, worst round), its
    ratio to each other switching arm (mean over rounds), spec/plain of the static arms, the
    rounds counted, against the strongest other switching arm whether the rounds settle "within
    `margin`", and, given a simulated run, the arm's sim/live throughput (level means)."""
    if not 0.0 < margin < 1.0:
        raise SystemExit(f"standing: --margin must lie between 0 and 1, not {margin:g}")
    plain, spec = static_arms(results)
    if arm not in set(results["arm"]):
        raise SystemExit(f"standing: no arm {arm!r} in the run (arms: {', '.join(sorted(set(results['arm'])))})")
    has_env = bool(plain and spec)  # without both, the arm is judged against the other switching arms alone
    keys = ["concurrency", "repeat"]
    if metric not in results or not results[metric].notna().any():
        raise SystemExit(f"standing: the run has no {metric} (steady_output_throughput: runs from 2026-12-06 on)")
    wide = results.pivot_table(index=keys, columns="arm", values=metric)
    others = [a for a in wide.columns if a not in plain + spec + [arm]]
    if not has_env and not others:
        raise SystemExit("standing: the run needs a plain and an always-speculating arm, or another switching arm")
    per_round = pd.DataFrame(index=wide.index)
    if has_env:
        env = envelope(results, keys, value=metric).set_index(keys)["envelope"]
        per_round["of_envelope"] = wide[arm] / env
        per_round["spec_over_plain"] = wide[spec].max(axis=1) / wide[plain].max(axis=1)
    for other in others:
        per_round[f"over_{other}"] = wide[arm] / wide[other]
    twins = [group for group in (plain, spec) if len(group) > 1]
    if twins:  # servers doing the same work: how far apart they measure is what a ratio can resolve
        per_round["twin_spread"] = pd.concat([wide[g].max(axis=1) / wide[g].min(axis=1) for g in twins],
                                             axis=1).max(axis=1)
    per_round = per_round.dropna(subset=["of_envelope"] if has_env else None, how="all")
    g = per_round.groupby(level="concurrency")
    out = g.mean()
    if has_env:
        out.insert(1, "worst_round", g["of_envelope"].min())
    out.insert(0, "rounds", g.size())
    if twins:
        out["worst_twin_spread"] = g["twin_spread"].max()
    if others:
        best = out[[f"over_{o}" for o in others]].idxmin(axis=1)  # the arm it trails most, per level
        out["best_other"] = best.str.removeprefix("over_")
        verdicts = pd.DataFrame({c: _margin_verdict(per_round.xs(c, level="concurrency")[col].dropna(), margin)
                                 for c, col in best.items()}).T
        verdicts = verdicts.astype({"vs_best": float, "vs_best_se": float, "rounds_for_margin": float})
        out = out.join(verdicts.astype({"rounds_for_margin": "Int64"}))
    if sim is not None:
        live_mean = results[results["arm"] == arm].groupby("concurrency")[metric].mean()
        sim_mean = sim[sim["arm"] == arm].groupby("concurrency")[metric].mean()
        out["sim_over_live"] = sim_mean / live_mean
    return out.reset_index()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dynspec.analysis.standing", description=__doc__.split("\n\n")[0])
    p.add_argument("run", type=Path, help="a run folder with results.csv")
    p.add_argument("--arm", default="dynspec-goodput", help="the switching arm to judge (default dynspec-goodput)")
    p.add_argument("--sim", type=Path, help="the run's simulated twin (same arms and levels)")
    p.add_argument("--skip", action="extend", nargs="+", default=[], metavar="ARM", help="arms left out")
    p.add_argument("--margin", type=float, default=0.02,
                   help="how close to the strongest other switching arm counts as level with it (default 0.02)")
    p.add_argument("--metric", default=METRIC, choices=[METRIC, "steady_output_throughput"],
                   help=f"what a level is judged by (default {METRIC}, the whole level's)")
    args = p.parse_args(argv)
    live = _read(args.run)
    unknown = sorted(set(args.skip) - set(live["arm"]))
    if unknown:
        raise SystemExit(f"standing: --skip {', '.join(unknown)}: no such arm in {args.run}")
    live = live[~live["arm"].isin(args.skip)]
    sim = _read(args.sim) if args.sim else None
    if sim is not None:
        sim = sim[~sim["arm"].isin(args.skip)]
    table = standing(live, args.arm, sim, margin=args.margin, metric=args.metric)
    print(table.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
