"""Where a live level's time went on the GPU: prefill steps, decode steps, and neither (idle).

Reads a sweep's run folder whose servers ran with SGLang's device timer
(SGLANG_ENABLE_METRICS_DEVICE_TIMER=1 and --enable-metrics, e.g.
experiments/h200-llama8b-price/price-timed.yaml): each level's scrapes hold
`sglang:gpu_execution_seconds_total` per forward mode, timed with CUDA events around every
forward, so the level's wall time splits into forward_extend + forward_decode + the rest, when
the GPU had no forward to run (the scheduler late, or no request to serve).  Arms are pooled by
kind (their sim_arm in the run's config.yaml: baseline, eagle3, policy:never ...; without one,
their policy column), and the last lines compare each kind with the first.
    python experiments/h200-llama8b-price/gpu_time_split.py experiments/h200-llama8b-price/data/h200-llama8b-price-timed
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

import pandas as pd

from dynspec.live.config import arm_kinds

GPU = "sglang:gpu_execution_seconds_total"


def load_scrape(folder: Path, stem: str) -> dict | None:
    for path, opener in ((folder / f"{stem}.json", open), (folder / f"{stem}.json.gz", gzip.open)):
        if path.exists():
            with opener(path, "rt") as f:
                return json.load(f)
    return None


def split(run: Path) -> pd.DataFrame:
    rows = pd.read_csv(run / "results.csv")
    kinds = arm_kinds(run)
    out = []
    for r in rows.itertuples():
        scrape = load_scrape(run / "scrapes", f"{r.arm}_c{r.concurrency}_r{r.repeat}")
        if scrape is None:
            continue
        before, after = scrape["before"]["metrics"], scrape["after"]["metrics"]
        if f"{GPU}{{forward_decode}}" not in after:
            continue  # a server without the device timer
        gpu = {m: after.get(f"{GPU}{{forward_{m}}}", 0.0) - before.get(f"{GPU}{{forward_{m}}}", 0.0)
               for m in ("extend", "decode")}
        out.append({"arm": r.arm, "kind": kinds.get(r.arm, r.policy), "concurrency": r.concurrency, "repeat": r.repeat,
                    "tok_s": r.output_throughput, "wall_s": r.duration_s, "prefill_s": gpu["extend"],
                    "decode_s": gpu["decode"], "idle_s": r.duration_s - gpu["extend"] - gpu["decode"]})
    return pd.DataFrame(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="a sweep's run folder")
    args = ap.parse_args()
    if not (args.run / "results.csv").exists():
        print(f"gpu_time_split: no results.csv in {args.run}", file=sys.stderr)
        return 2
    df = split(args.run)
    if df.empty:
        print(f"gpu_time_split: no level of {args.run} has the device timer's counters "
              "(SGLANG_ENABLE_METRICS_DEVICE_TIMER=1 with --enable-metrics)", file=sys.stderr)
        return 2
    pd.set_option("display.width", 160)
    print("per level (seconds; idle = wall - prefill - decode):")
    print(df.round(3).to_string(index=False))
    cols = ["tok_s", "wall_s", "prefill_s", "decode_s", "idle_s"]
    mean = df.groupby(["concurrency", "kind"], sort=False)[cols].mean()
    sem = df.groupby(["concurrency", "kind"], sort=False)[cols].sem()
    print("\nmean over levels (+- standard error):")
    for key, m in mean.iterrows():
        s = sem.loc[key]
        print(f"  C={key[0]} {key[1]:>8s}: " + "  ".join(f"{c} {m[c]:.3f} +- {s[c]:.3f}" for c in cols))
    for c, g in mean.groupby(level="concurrency"):
        first = g.iloc[0]
        for kind, m in g.iloc[1:].iterrows():
            print(f"  C={c} {kind[1]} - {g.index[0][1]}: " + "  ".join(
                f"{col} {m[col] - first[col]:+.3f}" for col in cols[1:]) + f"  (tok/s ratio {m.tok_s / first.tok_s:.4f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
