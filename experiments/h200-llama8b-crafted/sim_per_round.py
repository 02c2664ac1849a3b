"""A simulated twin against its live run, round by round: each sweep repeat draws its own prompts
(seeded by level and repeat), so the twin's round r runs the live round r's prompts.

Prints, per arm: sim / live output tokens/s for every (level, round) both have, and per level
their means over the rounds live has (the twin on those same rounds); then each round's
goodput share of max(plain, EAGLE-3), live and simulated.  First it checks that the draws match
(every shared row's input and output token totals equal).

    python experiments/h200-llama8b-crafted/sim_per_round.py \\
        experiments/h200-llama8b-crafted/data/crossover-warm-2 experiments/h200-llama8b-crafted/data/crossover-warm-2-sim
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from dynspec.analysis.levels import METRIC, usable

KEYS = ["arm", "concurrency", "repeat"]


def read(run: Path) -> pd.DataFrame:
    df = pd.read_csv(run / "results.csv")
    return df[usable(df)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("live", type=Path)
    ap.add_argument("sim", type=Path)
    ap.add_argument("--arms", nargs="+", default=["baseline", "eagle3", "dynspec-goodput"])
    ap.add_argument("--switching", default="dynspec-goodput", help="the arm whose envelope share is shown")
    args = ap.parse_args()
    live, sim = read(args.live), read(args.sim)
    both = live.merge(sim, on=KEYS, suffixes=("_live", "_sim"))
    same = ((both["total_input_tokens_live"] == both["total_input_tokens_sim"])
            & (both["total_output_tokens_live"] == both["total_output_tokens_sim"]))
    print(f"rows in both: {len(both)}; the same prompts drawn (input and output tokens) in {int(same.sum())}")
    both["ratio"] = both[f"{METRIC}_sim"] / both[f"{METRIC}_live"]
    for arm in args.arms:
        rows = both[both["arm"] == arm]
        table = rows.pivot(index="concurrency", columns="repeat", values="ratio")
        table.columns = [f"round {r}" for r in table.columns]
        means = rows.groupby("concurrency")[[f"{METRIC}_live", f"{METRIC}_sim"]].mean()
        table["level (live's rounds)"] = means[f"{METRIC}_sim"] / means[f"{METRIC}_live"]
        print(f"\n{arm}: sim / live, {METRIC}")
        print(table.round(3).to_string())

    def share(df: pd.DataFrame) -> pd.Series:
        wide = df.pivot_table(index=["concurrency", "repeat"], columns="arm", values=METRIC)
        return wide[args.switching] / wide[["baseline", "eagle3"]].max(axis=1)

    print(f"\n{args.switching} / max(baseline, eagle3), per round")
    print(pd.DataFrame({"live": share(live), "sim": share(sim)}).round(3).to_string())


if __name__ == "__main__":
    main()
