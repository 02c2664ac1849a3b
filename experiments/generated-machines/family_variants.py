"""goodput variants on a generated family's hardest member-levels, and the closed loop's drain.

Reads the CSV (or .parquet) that `experiments/generated-machines/envelope.py --family N --out F.csv` wrote (with
`--range-ratio R` or `--level-scale K`, give the same here: the same seeded requests), takes the dynamic arm's
`--worst` lowest member-levels (against the switching server's max(never, EAGLE-3)) and a seeded
random sample of `--sample` others, and simulates each goodput spec given on them: min / p5 /
median / mean of the ratio, how many sit below 0.97 and how many rose or fell by more than 1%
against the CSV's dynamic arm, for the worst and the sample apart, so a variant that lifts the
tail at the median's expense shows it.  `--all`: every member-level of the
CSV instead (the dynamic arm alone, about 2 minutes a spec with `--jobs 2` where the whole
envelope run takes 12).  `--steady`: judge every arm over each level's steady state instead (the
CSV's `steady_throughput`: the closed loop's first wave and drain left out).

    PYTHONPATH=src .venv/bin/python experiments/generated-machines/family_variants.py F.csv goodput goodput:lead=0.1
    PYTHONPATH=src .venv/bin/python experiments/generated-machines/family_variants.py F.csv goodput:lead_apart=0.05 --all --jobs 2

With `--drain M:C ...`, instead: member M of the family at concurrency C with max(5C, 50) and
max(20C, 50) prompts, EAGLE-3 / never and dynamic / max(never, EAGLE-3): how much of a level's
loss is the closed loop's finite run (the last requests draining at a low batch) rather than the
steady state.
"""

from __future__ import annotations

import argparse
import random
from multiprocessing import Pool

import pandas as pd

from dynspec.analysis.family import level_requests, level_throughputs, member
from dynspec.io.atomic import write_text
from dynspec.sim.run import simulate_level


def tps(m, arm: str, c: int, num_prompts: int | None = None, range_ratio: float = 1.0, level_scale: int = 1) -> float:
    work = level_requests(m, c, range_ratio, level_scale)  # the requests the CSV's level served
    if num_prompts is not None:  # --drain: fixed lengths, this many requests
        work["num_prompts"] = num_prompts
    return simulate_level(m.profile(), arm, c, seed=0, **work)[0]["output_throughput"]


def _level_tps(task: tuple) -> float:
    family_seed, mi, c, spec, range_ratio, level_scale, steady = task
    m = member(family_seed, mi)
    if steady:  # over the level's steady state, as the CSV's steady_throughput
        return level_throughputs(m.profile(), f"policy:{spec}", c, 0, **level_requests(m, c, range_ratio, level_scale))[1]
    return tps(m, f"policy:{spec}", c, range_ratio=range_ratio, level_scale=level_scale)


def variants(csv: str, specs: list[str], worst: int, sample: int, family_seed: int, range_ratio: float,
             every: bool = False, jobs: int = 1, level_scale: int = 1, steady: bool = False) -> pd.DataFrame:
    d = pd.read_parquet(csv) if csv.endswith(".parquet") else pd.read_csv(csv)
    if steady and "steady_throughput" not in d:
        raise SystemExit(f"family_variants.py: {csv} has no steady_throughput column (an envelope.py run "
                         "from before 2026-12-02); run it again for --steady")
    value = "steady_throughput" if steady else "output_throughput"
    piv = d.pivot_table(index=["member", "concurrency"], columns="arm", values=value)
    own = piv[["never", "eagle3"]].max(axis=1)
    base = (piv["dynamic"] / own).sort_values()
    if every:
        hard, others = list(base.index), []
    else:
        hard = list(base.index[:worst])
        others = random.Random(1).sample([k for k in base.index[worst:]], min(sample, len(base) - worst))
    keys = hard + others
    tasks = [(family_seed, int(mi), int(c), s, range_ratio, level_scale, steady) for s in specs for mi, c in keys]
    if jobs > 1:
        with Pool(jobs) as pool:
            out = pool.map(_level_tps, tasks, chunksize=4)
    else:
        out = [_level_tps(t) for t in tasks]
    label = "all" if every else "worst"
    r = pd.DataFrame({"set": [label] * len(hard) + ["sample"] * len(others),
                      "dynamic (from the CSV)": [base[k] for k in keys]},
                     index=pd.MultiIndex.from_tuples(keys, names=["member", "concurrency"]))
    for i, s in enumerate(specs):
        r[s] = [x / own[k] for x, k in zip(out[i * len(keys):(i + 1) * len(keys)], keys)]
    for col in ["dynamic (from the CSV)", *specs]:
        for name, sub in r.groupby("set"):
            x = sub[col]
            moved = ""
            if col in specs:  # against the CSV's own dynamic arm, member-level by member-level
                d = x - sub["dynamic (from the CSV)"]
                moved = f"  rose / fell by more than 1%: {(d > 0.01).sum()} / {(d < -0.01).sum()}"
            print(f"{col:36s} {name:7s} (n={len(x)}) of max(never, EAGLE-3): min {x.min():.3f}  p5 {x.quantile(.05):.3f}"
                  f"  median {x.median():.3f}  mean {x.mean():.4f}  below 0.97: {(x < 0.97).sum()}{moved}")
    return r


def drain(points: list[str], family_seed: int) -> None:
    for point in points:
        mi, c = (int(v) for v in point.split(":"))
        m = member(family_seed, mi)
        for k in (5, 20):
            n = max(k * c, 50)
            t = {a: tps(m, a, c, n) for a in ("eagle3", "policy:never", "dynamic")}
            own = max(t["eagle3"], t["policy:never"])
            print(f"member {mi} C={c} {n:5d} prompts: EAGLE-3 / never {t['eagle3'] / t['policy:never']:.3f}"
                  f"  dynamic / max(never, EAGLE-3) {t['dynamic'] / own:.3f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", nargs="?", help="envelope.py --family N --out F.csv")
    ap.add_argument("specs", nargs="*", help="goodput specs, e.g. goodput goodput:lead=0.1")
    ap.add_argument("--worst", type=int, default=60)
    ap.add_argument("--sample", type=int, default=340)
    ap.add_argument("--family-seed", type=int, default=0)
    ap.add_argument("--all", action="store_true", help="every member-level of the CSV (no worst/sample split)")
    ap.add_argument("--jobs", type=int, default=1, help="member-levels simulated in parallel")
    ap.add_argument("--drain", nargs="+", metavar="M:C")
    ap.add_argument("--range-ratio", type=float, default=1.0, metavar="R",
                    help="the --range-ratio the CSV was made with (its seeded output-length draws)")
    ap.add_argument("--level-scale", type=int, default=1, metavar="K",
                    help="the --level-scale the CSV was made with (K x max(5C, 50) requests a level)")
    ap.add_argument("--steady", action="store_true",
                    help="judge over each level's steady state (the CSV's steady_throughput: the closed "
                         "loop's first wave and drain left out) instead of the whole run")
    ap.add_argument("--out", help="also write each member-level's ratios to this .csv")
    args = ap.parse_args()
    if args.level_scale < 1:
        ap.error(f"--level-scale must be at least 1 (got {args.level_scale})")
    if args.drain:
        drain(args.drain, args.family_seed)
    elif args.csv and args.specs:
        r = variants(args.csv, args.specs, args.worst, args.sample, args.family_seed, args.range_ratio,
                     args.all, max(args.jobs, 1), args.level_scale, args.steady)
        if args.out:
            write_text(args.out, r.to_csv())
    else:
        ap.error("give a CSV and goodput specs, or --drain M:C ...")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
