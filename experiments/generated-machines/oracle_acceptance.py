"""What if goodput knew each running request's acceptance exactly?  A what-if on a family CSV.

goodput estimates a batch's accepted drafts from what its requests showed so far (each one's own
mean up to 8 requests, the population's above).  This replaces that estimate with the truth the
simulator holds: the mean over the running requests of their expected accepted drafts per step
(rate r, num_steps n: r + r^2 + ... + r^n), re-read before every decision; step times, probes,
lead and everything else stay goodput's.  What is left below the switching server's best is then
not the acceptance estimate's error (with fixed output lengths: the lock-step, docs/FAMILY_LOG.md).

Reads the CSV (or .parquet) of `experiments/generated-machines/envelope.py --family N --out F.csv` (with
`--range-ratio R`, give the same R) and simulates, on its `--worst` lowest dynamic member-levels
against max(never, EAGLE-3) and a seeded sample of `--sample` others, goodput as it is and the
oracle with each given lead:

    PYTHONPATH=src .venv/bin/python experiments/generated-machines/oracle_acceptance.py F.csv [--range-ratio 0.5] [--lead 0.05 0]
"""

from __future__ import annotations

import argparse
import random

import pandas as pd

import dynspec.sim.run as sim_run
from dynspec.analysis.family import level_requests, member
from dynspec.policy import Goodput, bucket_of
from dynspec.sim.engine import Engine


class OracleAcceptance(Goodput):
    """goodput whose acceptance estimate is the running requests' true expected accepted drafts."""

    engine: Engine | None = None

    def _accepted(self, b: int) -> float | None:
        e = self.engine
        if e is None or not e.running:
            return super()._accepted(b)
        n = e.num_steps
        return sum(sum(r.accept_rate ** j for j in range(1, n + 1)) for r in e.running) / len(e.running)

    def decide(self, batch_size: int) -> bool:
        self._refresh(bucket_of(batch_size))  # the batch's truth changed with its requests
        return super().decide(batch_size)


class _Engine(Engine):
    def __init__(self, profile, policy=None, **kw):
        super().__init__(profile, policy, **kw)
        if isinstance(policy, OracleAcceptance):
            policy.engine = self  # the oracle reads the requests the engine runs


def _oracle_spec(spec: str, *, build=sim_run.build_policy, **kw):
    if spec.startswith("oracle:lead="):
        return OracleAcceptance(lead=float(spec.split("=", 1)[1]))
    return build(spec, **kw)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--range-ratio", type=float, default=1.0)
    ap.add_argument("--lead", type=float, nargs="+", default=[0.05, 0.0])
    ap.add_argument("--worst", type=int, default=40)
    ap.add_argument("--sample", type=int, default=120)
    ap.add_argument("--family-seed", type=int, default=0)
    args = ap.parse_args()
    sim_run.Engine, sim_run.build_policy = _Engine, _oracle_spec  # what-if only: this process
    d = pd.read_parquet(args.csv) if args.csv.endswith(".parquet") else pd.read_csv(args.csv)
    piv = d.pivot_table(index=["member", "concurrency"], columns="arm", values="output_throughput")
    own = piv[["never", "eagle3"]].max(axis=1)
    base = (piv["dynamic"] / own).sort_values()
    hard = list(base.index[:args.worst])
    others = random.Random(1).sample(list(base.index[args.worst:]), min(args.sample, len(base) - args.worst))
    specs = ["goodput", *(f"oracle:lead={x:g}" for x in args.lead)]
    rows = []
    for key in hard + others:
        m, c = member(args.family_seed, int(key[0])), int(key[1])
        work = level_requests(m, c, args.range_ratio)
        row = {"set": "worst" if key in hard else "sample"}
        for s in specs:
            row[s] = sim_run.simulate_level(m.profile(), f"policy:{s}", c, **work)[0]["output_throughput"] / own[key]
        rows.append(row)
    r = pd.DataFrame(rows)
    print(f"simulated output tok/s / max(never, EAGLE-3), {args.csv}, lengths range ratio {args.range_ratio:g}")
    for col in specs:
        for name, sub in r.groupby("set"):
            x = sub[col]
            print(f"  {col:20s} {name:6s} (n={len(x)}) min {x.min():.3f}  p5 {x.quantile(.05):.3f}  "
                  f"median {x.median():.3f}  mean {x.mean():.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
