"""Which steady-state figure tells static draft lengths apart: one member-level at several lengths.

For member I of family S at concurrency C (candidate steps 0,1,3,5,7, output lengths in [0.5, 1] x),
each static K and goodput-k run at --scales x five waves.  Per run, three figures, each as a share
of the best static K's whole run at the longest scale (the nearest to a server under constant
load): the whole run's output tok/s; Little's law over the requests finished by the last send (the
steady figure before 2026-12-06, `finished_by_last_send`); and over the cohort by send time
(`dynspec.analysis.family.steady_throughput`).  Simulated, simulator seed 0.

    .venv/bin/python experiments/generated-machines/steady_measure.py 0:77 256
"""

from __future__ import annotations

import argparse
import math
import sys

from dynspec.analysis.family import level_requests, member, steady_throughput
from dynspec.analysis.family_k import static_arm
from dynspec.sim.run import simulate_level

CANDIDATES = [0, 1, 3, 5, 7]


def finished_by_last_send(records, c: int) -> float:
    """C x tokens / latency over the requests sent after the first wave and finished by the last send."""
    first, last = min(r.start for r in records), max(r.start for r in records)
    done = [r for r in records if first < r.start and r.end <= last]
    busy = sum(r.end - r.start for r in done)
    return c * sum(r.output_tokens for r in done) / busy if busy > 0 else math.nan


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("member", metavar="S:I")
    ap.add_argument("concurrency", type=int)
    ap.add_argument("--scales", default="1,4,12", help="level lengths, in five-wave units")
    args = ap.parse_args(argv)
    try:
        s, i = (int(v) for v in args.member.split(":"))
        scales = sorted({int(v) for v in args.scales.split(",")})
        if s < 0 or i < 0 or scales[0] < 1 or args.concurrency < 1:
            raise ValueError
    except ValueError:
        ap.error("member must be S:I (integers >= 0), concurrency and --scales integers >= 1")
    m = member(s, i)
    arms = {f"K={k}": static_arm(k) for k in CANDIDATES} | {"goodput-k": "policy:goodput-k"}
    got = {}
    for scale in scales:
        work = level_requests(m, args.concurrency, 0.5, scale)
        for name, arm in arms.items():
            metrics, records = simulate_level(m.profile(), arm, args.concurrency, seed=0,
                                              candidate_steps=CANDIDATES, **work)
            got[scale, name] = (metrics["output_throughput"], finished_by_last_send(records, args.concurrency),
                                steady_throughput(records, args.concurrency))
    ref = max(got[scales[-1], f"K={k}"][0] for k in CANDIDATES)
    print(f"{m}\nshares of the best static K's whole run at {scales[-1]} x five waves (simulated):")
    print(f"{'arm':10s} " + " ".join(f"{f'x{sc}: whole  by-send  cohort':>30s}" for sc in scales))
    for name in arms:
        print(f"{name:10s} " + " ".join(f"{'':6s}" + "  ".join(f"{v / ref:6.3f}" for v in got[sc, name])
                                          for sc in scales))
    return 0


if __name__ == "__main__":
    sys.exit(main())
