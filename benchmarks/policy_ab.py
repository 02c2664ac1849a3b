"""`dynspec policy bench` for this tree against an earlier commit, run alternately (A B A B ...).

One bench's median moves by half between runs on a shared 2-core machine (other tenants, clock
speed), so two versions are compared only side by side: each round runs both, one process each,
in turns, with the same hash seed; the summary gives each one's lowest and median per-run median
and their ratio (this tree over REV).

    .venv/bin/python benchmarks/policy_ab.py REV [--spec goodput] [--rounds 6] [--steps 20000] [--candidate-steps 0,1,3,5,7]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MEDIAN = re.compile(r"median\s+([0-9.]+) us")


def export_src(rev: str, into: Path) -> Path:
    """REV's src/ (git archive) under `into`; a clear error when REV is not a commit."""
    out = subprocess.run(["git", "archive", rev, "src"], cwd=ROOT, capture_output=True)
    if out.returncode:
        raise SystemExit(f"policy_ab: {rev!r} is not a commit here: {out.stderr.decode().strip()}")
    with tarfile.open(fileobj=BytesIO(out.stdout)) as tar:
        tar.extractall(into, filter="data")
    return into / "src"


def bench_median(src: Path, spec: str, steps: int, candidate_steps: str | None = None) -> float:
    env = dict(os.environ, PYTHONPATH=str(src), PYTHONHASHSEED="0")
    cmd = [sys.executable, "-m", "dynspec", "policy", "bench", spec, "--steps", str(steps)]
    if candidate_steps:
        cmd += ["--candidate-steps", candidate_steps]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return float(MEDIAN.search(out.stdout).group(1))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rev", help="the commit to compare with (e.g. HEAD~1)")
    ap.add_argument("--spec", default="goodput")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=20000)
    ap.add_argument("--candidate-steps", help="the draft lengths a server runs (e.g. 0,1,3,5,7; SGLang 0.5.23)")
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.steps < 2:
        ap.error(f"--rounds must be >= 1 and --steps >= 2, got {args.rounds} and {args.steps}")
    with tempfile.TemporaryDirectory() as tmp:
        old_src, new_src = export_src(args.rev, Path(tmp)), ROOT / "src"
        new, old = [], []
        for r in range(args.rounds):
            new.append(bench_median(new_src, args.spec, args.steps, args.candidate_steps))
            old.append(bench_median(old_src, args.spec, args.steps, args.candidate_steps))
            print(f"round {r + 1}: this tree {new[-1]:.2f} us   {args.rev} {old[-1]:.2f} us", flush=True)
    for name, x in (("this tree", new), (args.rev, old)):
        print(f"{name:>12s}: lowest {min(x):.2f} us, median {statistics.median(x):.2f} us over {len(x)} runs")
    print(f"ratio (this tree / {args.rev}): lowest {min(new) / min(old):.3f}, "
          f"median {statistics.median(new) / statistics.median(old):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
