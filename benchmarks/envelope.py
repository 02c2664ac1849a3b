"""The dynamic arm against the better static arm, on every shipped profile.

Target (issue 4): dynamic reaches at least 97% of max(baseline, eagle3) output
throughput at every concurrency from 1 to 128, on every shipped profile.  Printed
beside it, the same ratio for a static threshold and SGLang's default tiers.

    .venv/bin/python benchmarks/envelope.py [--profile NAME ...] [--threshold 32] [--seeds 3] [--out FILE.csv]

Each level runs with seeds 0..N-1 (different per-request acceptance draws); the table
shows mean throughputs and, per arm, the worst ratio over the seeds.  Exit status 1
when the dynamic arm misses the target at any level for any seed.
"""

from __future__ import annotations

import argparse
import sys
import time

from dynspec.profile import load_profile, shipped_profiles
from dynspec.sim import run_sim

LEVELS = [1, 2, 4, 8, 16, 32, 48, 64, 96, 128]
TARGET = 0.97


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", action="append", help="profile name or path (default: every shipped one)")
    ap.add_argument("--threshold", default="32", help="the static threshold shown beside (policy:threshold:N)")
    ap.add_argument("--concurrency", default=",".join(map(str, LEVELS)))
    ap.add_argument("--seeds", type=int, default=3, help="run seeds 0..N-1; ratios are the worst over them")
    ap.add_argument("--out", help="also write every row to this .csv/.parquet")
    args = ap.parse_args(argv)
    levels = [int(c) for c in args.concurrency.split(",")]
    others = [f"policy:threshold:{args.threshold}", "policy:sglang-default-tiers"]
    arms = ["baseline", "eagle3", "dynamic", *others]
    all_rows, ok = [], True
    t0 = time.process_time()
    for name in args.profile or shipped_profiles():
        profile = load_profile(name)
        tput: dict = {}
        for seed in range(args.seeds):
            rows = run_sim(profile, arms, levels, seed=seed)
            all_rows += rows
            for r in rows:
                tput[(r["arm"], r["concurrency"], seed)] = r["output_throughput"]

        def mean(arm, c):
            return sum(tput[(arm, c, s)] for s in range(args.seeds)) / args.seeds

        def worst(arm, c):
            return min(tput[(arm, c, s)] / max(tput[("baseline", c, s)], tput[("eagle3", c, s)])
                       for s in range(args.seeds))

        print(f"\nprofile {profile.name}: output tok/s (mean of {args.seeds} seeds); "
              f"ratio = arm / max(baseline, eagle3), worst seed")
        head = f"{'C':>5s} {'baseline':>9s} {'eagle3':>9s} {'dynamic':>9s} {'ratio':>6s}"
        head += "".join(f" {a.removeprefix('policy:'):>24s}" for a in others)
        print(head)
        for c in levels:
            ratio = worst("dynamic", c)
            line = f"{c:5d} {mean('baseline', c):9.1f} {mean('eagle3', c):9.1f} {mean('dynamic', c):9.1f} "
            line += f"{ratio:6.3f}" + (" " if ratio >= TARGET else "!")
            line += "".join(f" {mean(a, c):14.1f} ({worst(a, c):5.3f})" for a in others)
            print(line)
            ok &= ratio >= TARGET
    print(f"\n{'PASS' if ok else 'FAIL'}: dynamic >= {TARGET:.0%} of the better static arm at every level "
          f"({time.process_time() - t0:.1f} s CPU)")
    if args.out:
        from dynspec.results import write_table

        write_table(all_rows, args.out)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
