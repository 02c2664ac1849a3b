"""goodput-k at small batches with and without K chosen for the request running (steps.OWN_K_UP_TO).

Per member of family S at one level: the best static K's steady output tok/s (every candidate
run alone), goodput-k's share of it without and with the request's own K, and SGLang 0.5.23's
default tiers' share (started at the member's N); then the mean of each and how many member-levels
moved.  Output lengths in [0.5, 1] x the member's, closed loop, as envelope.py --candidate-steps.
Simulated, simulator seed 0.

    .venv/bin/python experiments/generated-machines/own_k.py --family 31415 --members 0-59 --concurrency 1
"""

from __future__ import annotations

import argparse
import statistics
import sys
from unittest import mock

from dynspec.analysis.family import level_requests, level_throughputs, member
from dynspec.analysis.family_k import static_arm
from dynspec.policy.goodput import steps

CANDIDATES = [0, 1, 3, 5, 7]


def shares(seed: int, index: int, c: int, level_scale: int) -> tuple[float, float, float]:
    """goodput-k without and with its own K at batch 1, and SGLang's tiers, over the best static K."""
    m = member(seed, index)
    p, work = m.profile(), level_requests(m, c, 0.5, level_scale)

    def steady(arm: str) -> float:
        return level_throughputs(p, arm, c, 0, candidate_steps=CANDIDATES, **work)[1]

    best = max(steady(static_arm(k)) for k in CANDIDATES)
    with mock.patch.object(steps, "_OWN_K_BUCKETS", 0):
        without = steady("policy:goodput-k")
    return without / best, steady("policy:goodput-k") / best, \
        steady(f"policy:sglang-default-tiers:steps={m.num_steps}") / best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", type=int, default=31415, metavar="S")
    ap.add_argument("--members", default="0-59", metavar="A-B", help="member indices, inclusive")
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--level-scale", type=int, default=4, metavar="K", help="waves of 5 (default 4: twenty)")
    args = ap.parse_args(argv)
    try:
        lo, hi = (int(v) for v in args.members.split("-"))
        if lo < 0 or hi < lo:
            raise ValueError
    except ValueError:
        ap.error(f"--members must be A-B with 0 <= A <= B, got {args.members!r}")
    if args.concurrency < 1 or args.level_scale < 1 or args.family < 0:
        ap.error("--concurrency and --level-scale must be at least 1, --family at least 0")
    rows = []
    print(f"{'member':>8s} {'without':>8s} {'with':>8s} {'tiers':>8s}   (share of the best static K, steady state)")
    for i in range(lo, hi + 1):
        rows.append(shares(args.family, i, args.concurrency, args.level_scale))
        print(f"{args.family}:{i:<6d} {rows[-1][0]:8.3f} {rows[-1][1]:8.3f} {rows[-1][2]:8.3f}", flush=True)
    without, with_, tiers = zip(*rows)
    moved = [b - a for a, b, _ in rows]
    print(f"mean: without {statistics.mean(without):.4f}  with {statistics.mean(with_):.4f}  "
          f"tiers {statistics.mean(tiers):.4f}")
    print(f"more than 1% below the tiers: without {sum(a < t - 0.01 for a, _, t in rows)}, "
          f"with {sum(b < t - 0.01 for _, b, t in rows)}")
    print(f"with / without: better by > 0.5% at {sum(d > 0.005 for d in moved)}, worse at "
          f"{sum(d < -0.005 for d in moved)} of {len(rows)}; worst {min(moved):+.3f}, best {max(moved):+.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
