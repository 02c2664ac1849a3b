"""goodput on generated profiles with fixed and with randomized output lengths (simulated).

The family benchmark (`benchmarks/envelope.py --family`) sends fixed lengths, which makes a
plain server's requests finish in lock-step (docs/PIPELINE.md, TTFT).  This runs the dynamic
arm on the first N members at every third of their levels, both ways (range: input and output
lengths uniform between half and all, per request, seeded by member), and prints the
distribution of dynamic / max(baseline, eagle3).
    .venv/bin/python benchmarks/family_lengths.py [--members 30] [--seed 0]
"""

from __future__ import annotations

import argparse
import random
import statistics

from dynspec.analysis.family import family, levels_for
from dynspec.sim.run import default_num_prompts, simulate_level


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--members", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0, help="which family")
    args = ap.parse_args()
    ratios: dict[str, list[float]] = {"fixed": [], "range": []}
    for m in family(args.members, args.seed):
        p = m.profile()
        for mode in ratios:
            rng = random.Random(m.index)
            for c in levels_for(m)[::3]:
                n = default_num_prompts(c)
                lengths = None if mode == "fixed" else \
                    [(rng.randint(m.input_len // 2, m.input_len), rng.randint(m.output_len // 2, m.output_len))
                     for _ in range(n)]
                t = {a: simulate_level(p, a, c, input_len=m.input_len, output_len=m.output_len, seed=0,
                                       lengths=lengths)[0]["output_throughput"]
                     for a in ("baseline", "eagle3", "dynamic")}
                ratios[mode].append(t["dynamic"] / max(t["baseline"], t["eagle3"]))
    print(f"family {args.seed}, members 0..{args.members - 1}: dynamic / max(baseline, eagle3)")
    for mode, xs in ratios.items():
        xs = sorted(xs)
        print(f"{mode:6s} {len(xs)} points: worst {xs[0]:.3f}, 5th pct {xs[len(xs) // 20]:.3f}, "
              f"median {statistics.median(xs):.3f}, at or above 0.97: {sum(x >= 0.97 for x in xs) / len(xs):.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
