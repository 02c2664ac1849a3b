"""goodput as a TP>1 server runs it: measured step times reach it only through the sync hook.

In a tensor-parallel server each rank measures its own step times, so goodput folds them in
only when the ranks agree (an all-reduce every `sync_every` steps).  This runs the simulator's
dynamic arm both ways, one process (times agreed every step) and with agreement every N steps
(an identity hook stands in for the all-reduce: one simulated rank), on every shipped profile,
and prints each as a share of max(baseline, eagle3).

    .venv/bin/python benchmarks/tp_sync.py [--sync-every 64] [--seed 0]
"""

from __future__ import annotations

import argparse

import dynspec.sim.run as sim
from dynspec.policy import Goodput
from dynspec.sim.profile import load_profile, shipped_profiles

LEVELS = [1, 2, 4, 8, 16, 32, 64, 128]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sync-every", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    build = sim.build_policy

    def with_tp_sync(spec, **kw):  # "goodput-tp" is this script's arm: goodput behind a sync hook
        return Goodput(sync=lambda v: v, sync_every=args.sync_every) if spec == "goodput-tp" else build(spec, **kw)

    sim.build_policy = with_tp_sync
    spec_of = sim.arm_policy_spec
    sim.arm_policy_spec = lambda arm: "goodput-tp" if arm == "dynamic-tp" else spec_of(arm)
    print(f"{'profile':26s} {'C':>4s} {'dynamic':>8s} {'tp-sync':>8s}   (share of max(baseline, eagle3))")
    for name in shipped_profiles():
        profile = load_profile(name)
        for c in LEVELS:
            t = {a: sim.simulate_level(profile, a, c, seed=args.seed)[0]["output_throughput"]
                 for a in ("baseline", "eagle3", "dynamic", "dynamic-tp")}
            env = max(t["baseline"], t["eagle3"])
            print(f"{name:26s} {c:4d} {t['dynamic'] / env:8.3f} {t['dynamic-tp'] / env:8.3f}")


if __name__ == "__main__":
    main()
