"""goodput-k against the best static K at member-levels: this tree beside another revision.

Each side runs in a process of its own (the other revision from a temporary `git worktree`),
both at once: per member-level, the best static K's steady output tok/s (every candidate alone)
and goodput-k's share of it; then the worst, median and mean of each side and how many
member-levels moved by more than 0.5%.  Twenty-wave closed-loop levels, output lengths in
[0.5, 1] x the member's, as envelope.py --candidate-steps.  Simulated, simulator seed 0.

    .venv/bin/python experiments/generated-machines/k_against.py HEAD~1 --family 7919 --members 0-29 \\
        --concurrency 1,2,4,8,16,64
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CANDIDATES = [0, 1, 3, 5, 7]


def child(family: int, lo: int, hi: int, levels: list[int], level_scale: int) -> None:
    """One side: a JSON line per member-level (run with that side's src first on sys.path)."""
    from dynspec.analysis.family import level_requests, level_throughputs, member
    from dynspec.analysis.family_k import static_arm

    for i in range(lo, hi + 1):
        m = member(family, i)
        p = m.profile()
        for c in levels:
            work = level_requests(m, c, 0.5, level_scale)
            steady = {arm: level_throughputs(p, arm, c, 0, candidate_steps=CANDIDATES, **work)[1]
                      for arm in [*(static_arm(k) for k in CANDIDATES), "policy:goodput-k"]}
            best = max(v for arm, v in steady.items() if arm != "policy:goodput-k")
            print(json.dumps({"member": f"{family}:{i}", "c": c, "share": steady["policy:goodput-k"] / best}),
                  flush=True)


def run_side(src: Path, args: argparse.Namespace) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(src))
    cmd = [sys.executable, __file__, "--child", args.rev, "--family", str(args.family), "--members", args.members,
           "--concurrency", args.concurrency, "--level-scale", str(args.level_scale)]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rev", help="the git revision to set beside this tree")
    ap.add_argument("--family", type=int, default=0, metavar="S")
    ap.add_argument("--members", default="0-29", metavar="A-B", help="member indices, inclusive")
    ap.add_argument("--concurrency", default="1,2,4,8,16,64", metavar="C,C,...")
    ap.add_argument("--level-scale", type=int, default=4, metavar="K", help="waves of 5 (default 4: twenty)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    try:
        lo, hi = (int(v) for v in args.members.split("-"))
        levels = [int(c) for c in args.concurrency.split(",")]
        if lo < 0 or hi < lo or min(levels) < 1:
            raise ValueError
    except ValueError:
        ap.error(f"--members must be A-B with 0 <= A <= B and --concurrency positive integers, "
                 f"got {args.members!r} and {args.concurrency!r}")
    if args.level_scale < 1 or args.family < 0:
        ap.error("--level-scale must be at least 1, --family at least 0")
    if args.child:
        child(args.family, lo, hi, levels, args.level_scale)
        return 0
    known = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", f"{args.rev}^{{commit}}"],
                           capture_output=True, text=True)
    if known.returncode:
        print(f"k_against: {args.rev!r} is not a revision of {ROOT}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        other = Path(tmp) / "other"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "--quiet", str(other),
                        known.stdout.strip()], check=True)
        try:
            procs = {"other": run_side(other / "src", args), "this": run_side(ROOT / "src", args)}
            out = {side: [json.loads(line) for line in p.stdout] for side, p in procs.items()}  # type: ignore[union-attr]
            if any(p.wait() for p in procs.values()):
                print("k_against: a side failed (its error is above)", file=sys.stderr)
                return 1
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(other)], check=False)
    pairs = [(a["share"], b["share"]) for a, b in zip(out["other"], out["this"])]
    for a, (x, y) in zip(out["this"], pairs):
        print(f"{a['member']}@{a['c']}  {args.rev} {x:.3f}  this tree {y:.3f}")
    for name, xs in ((args.rev, [x for x, _ in pairs]), ("this tree", [y for _, y in pairs])):
        print(f"{name}: worst {min(xs):.3f}  median {statistics.median(xs):.3f}  mean {statistics.mean(xs):.4f}  "
              f"below 0.97: {sum(x < 0.97 for x in xs)} of {len(xs)}")
    print(f"this tree over {args.rev}: better by > 0.5% at {sum(y > x * 1.005 for x, y in pairs)}, "
          f"worse at {sum(y < x * 0.995 for x, y in pairs)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
