"""Where each switching arm stands, level by level, judged round by round.

A round measures every arm of a level side by side (an interleaved sweep), so a ratio within a
round cancels what moves the whole GPU between rounds (on one H200 a plain server's throughput
at one level moved by up to 30% from round to round, while the ratios moved far less).  Per level
this gives, for every switching arm: its share of the envelope (the better static arm of the same
round), averaged over rounds and its worst round; its ratio to the best other switching arm (a
static cutoff, say); EAGLE-3 over plain; and, with a simulated twin of the run, sim over live.
Where a run has two servers doing the same work (two plain arms, say), `twin_spread` is the
fastest of them over the slowest, per round: the noise floor of one ratio in that design.

    python -m dynspec.analysis.standing RUN_DIR [--sim SIM_RUN_DIR] [--arm dynspec-goodput] [--skip ARM ...]

`--skip` leaves an arm out of every comparison: a server that is configured differently on
purpose (SGLang's torch layer bodies beside the fused ones, say) is no twin and no envelope.
"""

from __future__ import annotations

import argparse
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


def standing(results: pd.DataFrame, arm: str, sim: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per concurrency: `arm`'s share of the envelope (mean over rounds, worst round), its
    ratio to each other switching arm (mean over rounds), spec/plain of the static arms, the
    rounds counted and, given a simulated run, the arm's sim/live throughput (level means)."""
    plain, spec = static_arms(results)
    if arm not in set(results["arm"]):
        raise SystemExit(f"standing: no arm {arm!r} in the run (arms: {', '.join(sorted(set(results['arm'])))})")
    if not plain or not spec:
        raise SystemExit("standing: the run needs a plain arm and an always-speculating arm")
    keys = ["concurrency", "repeat"]
    wide = results.pivot_table(index=keys, columns="arm", values=METRIC)
    env = envelope(results, keys).set_index(keys)["envelope"]
    per_round = pd.DataFrame({"of_envelope": wide[arm] / env,
                              "spec_over_plain": wide[spec].max(axis=1) / wide[plain].max(axis=1)})
    others = [a for a in wide.columns if a not in plain + spec + [arm]]
    for other in others:
        per_round[f"over_{other}"] = wide[arm] / wide[other]
    twins = [group for group in (plain, spec) if len(group) > 1]
    if twins:  # servers doing the same work: how far apart they measure is what a ratio can resolve
        per_round["twin_spread"] = pd.concat([wide[g].max(axis=1) / wide[g].min(axis=1) for g in twins],
                                             axis=1).max(axis=1)
    per_round = per_round.dropna(subset=["of_envelope"])
    g = per_round.groupby(level="concurrency")
    out = g.mean()
    out.insert(1, "worst_round", g["of_envelope"].min())
    out.insert(0, "rounds", g.size())
    if twins:
        out["worst_twin_spread"] = g["twin_spread"].max()
    if sim is not None:
        live_mean = results[results["arm"] == arm].groupby("concurrency")[METRIC].mean()
        sim_mean = sim[sim["arm"] == arm].groupby("concurrency")[METRIC].mean()
        out["sim_over_live"] = sim_mean / live_mean
    return out.reset_index()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dynspec.analysis.standing", description=__doc__.split("\n\n")[0])
    p.add_argument("run", type=Path, help="a run folder with results.csv")
    p.add_argument("--arm", default="dynspec-goodput", help="the switching arm to judge (default dynspec-goodput)")
    p.add_argument("--sim", type=Path, help="the run's simulated twin (same arms and levels)")
    p.add_argument("--skip", action="extend", nargs="+", default=[], metavar="ARM", help="arms left out")
    args = p.parse_args(argv)
    live = _read(args.run)
    unknown = sorted(set(args.skip) - set(live["arm"]))
    if unknown:
        raise SystemExit(f"standing: --skip {', '.join(unknown)}: no such arm in {args.run}")
    live = live[~live["arm"].isin(args.skip)]
    sim = _read(args.sim) if args.sim else None
    if sim is not None:
        sim = sim[~sim["arm"].isin(args.skip)]
    table = standing(live, args.arm, sim)
    print(table.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
