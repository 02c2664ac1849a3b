"""Simulator speed: 3 arms x 10 concurrency levels up to 128, 256 output tokens.

Target: under 10 s on one core.  The simulator is single-threaded, so its
process CPU time is the time on one core; wall time is printed beside it.

    .venv/bin/python benchmarks/bench_sim.py [--profile seed-blackwell] [--repeat 3]

Exit status 1 when the best repeat misses the target.
"""

from __future__ import annotations

import argparse
import sys
import time

from dynspec.sim.profile import load_profile
from dynspec.sim.run import SIM_ARMS, run_sim

LEVELS = [1, 2, 4, 8, 16, 32, 48, 64, 96, 128]
TARGET_S = 10.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="seed-blackwell")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    profile = load_profile(args.profile)
    best_cpu = float("inf")
    for i in range(args.repeat):
        c0, w0 = time.process_time(), time.perf_counter()
        rows = run_sim(profile, list(SIM_ARMS), LEVELS, output_len=256)
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
        best_cpu = min(best_cpu, cpu)
        tokens = sum(r["total_output_tokens"] for r in rows)
        print(f"run {i + 1}: {len(rows)} levels, {tokens:,} simulated tokens, {cpu:.2f} s CPU, {wall:.2f} s wall")
    ok = best_cpu < TARGET_S
    print(f"{'PASS' if ok else 'FAIL'}: {args.profile}, 3 arms x {len(LEVELS)} levels up to {LEVELS[-1]}: "
          f"{best_cpu:.2f} s on one core (target < {TARGET_S:g} s)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
