"""One goodput-k mechanism switched off, on open-loop arrivals with varied output lengths (simulated).

envelope.py's family runs are closed loops only, so this runs the levels itself: on the first N
members of family S, at concurrency caps C, requests arrive at a share of the rate the member's
plain server completes at that C in a closed loop (Poisson, dynspec.sim.arrivals), output lengths
drawn in [0.5, 1] x the member's.  Arms: `goodput-k`, and the same with one mechanism off:

- `plain-probes`: no probes of a K not yet run while Goodput decodes plainly (the choice of K
  then moves only while speculating, as before 2026-12-04).

Printed per member-level: each arm's output tok/s and mean TPOT (means over --seeds simulator
seeds), and goodput-k / ablated; last, the member-levels where the mechanism earns >= 0.5%
(throughput up or TPOT down).  At batch 1 one request's acceptance draws decide a level: a
single seed's difference there is mostly luck.

    .venv/bin/python experiments/generated-machines/k_ablation.py [--family 12] [--seed 0]
        [--concurrency 4,32] [--load 0.6,0.9] [--seeds 3] [--out F.csv]
"""

from __future__ import annotations

import argparse
import sys

MECHANISMS = {"plain-probes": ("_plain_probe_target", lambda self, b: None)}


def run(args) -> list[dict]:
    from dynspec.analysis.family import level_requests, member
    from dynspec.policy.goodput.steps import GoodputK
    from dynspec.sim.run import simulate_level

    cands = [0, 1, 3, 5, 7]
    attr, off = MECHANISMS[args.mechanism]
    on = getattr(GoodputK, attr)
    rows = []
    for i in range(args.family):
        m = member(args.seed, i)
        p = m.profile()
        for c in (int(x) for x in args.concurrency.split(",")):
            work = level_requests(m, c, 0.5)
            plain, _ = simulate_level(p, "policy:never", c, candidate_steps=cands, **work)
            for load in (float(x) for x in args.load.split(",")):
                rate = load * plain["request_throughput"]
                got: dict[str, list[tuple[float, float]]] = {"goodput-k": [], args.mechanism: []}
                for seed in range(args.seeds):  # simulator seeds: acceptance draws and arrivals
                    for arm, impl in (("goodput-k", on), (args.mechanism, off)):
                        setattr(GoodputK, attr, impl)
                        try:
                            mt, _ = simulate_level(p, "policy:goodput-k", c, seed=seed, candidate_steps=cands,
                                                   request_rate=rate, **work)
                        finally:
                            setattr(GoodputK, attr, on)
                        got[arm].append((mt["output_throughput"], mt["mean_tpot_ms"]))
                a, b = ([sum(x) / len(x) for x in zip(*got[arm])] for arm in ("goodput-k", args.mechanism))
                rows.append({"member": i, "concurrency": c, "load": load, "request_rate": rate,
                             "tput": a[0], "tput_off": b[0], "tpot_ms": a[1], "tpot_ms_off": b[1]})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", type=int, default=12, help="the first N members")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--concurrency", default="4,32", help="concurrency caps of the open loop")
    ap.add_argument("--load", default="0.6,0.9", help="arrival rates as shares of the plain server's closed-loop rate")
    ap.add_argument("--mechanism", choices=sorted(MECHANISMS), default="plain-probes")
    ap.add_argument("--seeds", type=int, default=1, help="each arm's mean over simulator seeds 0..N-1")
    ap.add_argument("--out", help="also write the rows to this .csv")
    args = ap.parse_args(argv)
    if args.family < 1 or args.seeds < 1:
        ap.error(f"--family and --seeds must be at least 1, got {args.family} and {args.seeds}")
    import pandas as pd

    df = pd.DataFrame(run(args))
    df["tput_ratio"] = df.tput / df.tput_off
    df["tpot_ratio"] = df.tpot_ms_off / df.tpot_ms  # > 1: the mechanism makes tokens come faster
    print(f"SIMULATED, family {args.seed} members 0..{args.family - 1}, open loop (Poisson), output lengths in "
          f"[0.5, 1] x, means over simulator seeds 0..{args.seeds - 1}; goodput-k / goodput-k without {args.mechanism}:")
    print(df.round(3).to_string(index=False))
    earns = df[(df.tput_ratio >= 1.005) | (df.tpot_ratio >= 1.005)]
    loses = df[(df.tput_ratio <= 0.995) | (df.tpot_ratio <= 0.995)]
    print(f"earns >= 0.5% (throughput or TPOT) at {len(earns)} of {len(df)} member-levels, loses >= 0.5% at "
          f"{len(loses)}; median throughput ratio {df.tput_ratio.median():.4f}, TPOT ratio {df.tpot_ratio.median():.4f}")
    if args.out:
        from dynspec.io.atomic import write_frame

        write_frame(args.out, df)
    return 0


if __name__ == "__main__":
    sys.exit(main())
