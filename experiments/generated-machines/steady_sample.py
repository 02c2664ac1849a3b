"""goodput against the switching server's best, steady state, on a quick sample of a family.

Members 0..N-1 of family SEED at C = 2, 8, 24 and 64, output lengths fixed and drawn in
[0.5, 1] x the member's: each level's steady throughput (dynspec.analysis.family.level_throughputs)
of a goodput spec over max(never, EAGLE-3).  A minute's check of a policy change on many
machines before the full envelope; run it on two checkouts to compare them.

    PYTHONPATH=src .venv/bin/python experiments/generated-machines/steady_sample.py --family 0 --members 200
"""

from __future__ import annotations

import argparse
import statistics
from multiprocessing import Pool

from dynspec.analysis.family import level_requests, level_throughputs, member

LEVELS = (2, 8, 24, 64)


def ratio(job: tuple[int, int, int, float, str]) -> float:
    family, index, c, range_ratio, spec = job
    m = member(family, index)
    work = level_requests(m, c, range_ratio)
    steady = {a: level_throughputs(m.profile(), a, c, **work)[1] for a in ("policy:never", "eagle3", f"policy:{spec}")}
    return steady[f"policy:{spec}"] / max(steady["policy:never"], steady["eagle3"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--family", type=int, default=0)
    ap.add_argument("--members", type=int, default=200)
    ap.add_argument("--spec", default="goodput")
    ap.add_argument("--jobs", type=int, default=2)
    a = ap.parse_args(argv)
    jobs = [(a.family, i, c, rr, a.spec) for i in range(a.members) for c in LEVELS for rr in (1.0, 0.5)]
    with Pool(a.jobs) as pool:
        v = pool.map(ratio, jobs, chunksize=4)
    print(f"family {a.family}, {a.members} members, {len(v)} member-levels, {a.spec} / max(never, EAGLE-3), steady: "
          f"min {min(v):.3f}, median {statistics.median(v):.4f}, mean {statistics.mean(v):.4f}, "
          f"below 0.97: {sum(x < 0.97 for x in v)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
