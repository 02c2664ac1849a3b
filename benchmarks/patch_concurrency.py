"""Many `dynspec patch apply` and `revert` commands at once on one SGLang 0.5.9 tree: the lock lets
one work at a time, the others are refused in one line, and the tree ends whole.

Each round unpacks the real sglang 0.5.9 wheel into a scratch folder (nothing installed), starts
N commands at the same moment (apply or revert, seeded mix), waits for all, then checks that
`dynspec patch status` says patched or unpatched, that every file the manifest names has its
upstream or its patched sha256 (all on the same side), and that a final revert gives back the
wheel's bytes, every file of the tree.

    .venv/bin/python benchmarks/patch_concurrency.py [--commands 50] [--rounds 3] [--seed 0]

Prints one line per round (refused by the lock, applied, reverted, already there, other
failures, half-patched trees) and a total; exit status 1 when a tree was left half-patched or a
command failed for any reason but the lock.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

from dynspec.realsglang.wheels import unpack
from dynspec.sglang import patching

VERSION = "0.5.9"
LOCK_BUSY = "another dynspec patch command"


def tree_hashes(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and not p.is_symlink()}


def classify(op: str, proc: subprocess.CompletedProcess) -> str:
    """What one command did, from its exit status and its one line."""
    out, err = proc.stdout.strip(), proc.stderr.strip()
    if proc.returncode == patching.EXIT_REFUSED and LOCK_BUSY in err:
        return "refused by the lock"
    if proc.returncode != patching.EXIT_OK:
        return "failed"
    if out.startswith(("already patched", "not patched")):
        return "already there"
    if op == "apply" and "patched:" in out:
        return "applied"
    if op == "revert" and "reverted:" in out:
        return "reverted"
    return "failed"


def manifest_side(site: Path) -> str:
    """'patched' or 'unpatched' when every manifest file is wholly one or the other, else 'half'."""
    manifest = json.loads((patching.patches_root() / f"sglang-{VERSION}" / "manifest.json").read_text())
    sides = set()
    for rel, h in manifest["files"].items():
        got = hashlib.sha256((site / rel).read_bytes()).hexdigest()
        sides.add("unpatched" if got == h["upstream_sha256"] else "patched" if got == h["patched_sha256"] else "other")
    return sides.pop() if len(sides) == 1 and "other" not in sides else "half"


def dynspec(*args: str) -> list[str]:
    return [sys.executable, "-m", "dynspec", "patch", *args]


def one_round(pristine: Path, work: Path, n: int, rng: random.Random) -> tuple[Counter, list[str]]:
    site = work / "site"
    shutil.rmtree(site, ignore_errors=True)
    shutil.copytree(pristine, site, symlinks=True)
    ops = [rng.choice(("apply", "revert")) for _ in range(n)]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    # Every command is started before any is waited for: they race for the lock.
    procs = [(op, subprocess.Popen(dynspec(op, "--sglang-path", str(site)), stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, env=env)) for op in ops]
    counts: Counter = Counter()
    problems = []
    for op, p in procs:
        out, err = p.communicate(timeout=600)
        kind = classify(op, subprocess.CompletedProcess(p.args, p.returncode, out, err))
        counts[kind] += 1
        if kind == "failed":
            problems.append(f"{op} exited {p.returncode}: {(err or out).strip()[:200]}")
    st = subprocess.run(dynspec("status", "--sglang-path", str(site)), capture_output=True, text=True)
    side = manifest_side(site)
    state = st.stdout.split()[0] if st.stdout.split() else "?"
    whole = st.returncode == 0 and state == side and not (site / "sglang" / ".dynspec-journal.json").exists()
    if not whole:
        problems.append(f"status {state!r} (exit {st.returncode}), manifest hashes {side}")
    # Reverted, the tree must be the wheel's byte for byte (the backup folder gone with it).
    rv = subprocess.run(dynspec("revert", "--sglang-path", str(site)), capture_output=True, text=True)
    if rv.returncode != 0 or tree_hashes(site) != tree_hashes(pristine):
        whole = False
        problems.append(f"the final revert did not give back the wheel's bytes: {(rv.stderr or rv.stdout).strip()}")
    counts["half-patched trees"] += 0 if whole else 1
    counts[f"ended {state}"] += 1
    return counts, problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--commands", type=int, default=50, help="commands started at once per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.commands < 1 or args.rounds < 1:
        print("--commands and --rounds must be at least 1", file=sys.stderr)
        return 2
    rng = random.Random(args.seed)
    total: Counter = Counter()
    failed = False
    keys = ("refused by the lock", "applied", "reverted", "already there", "failed", "half-patched trees")
    with tempfile.TemporaryDirectory(prefix="dynspec-patch-concurrency-") as tmp:
        pristine = unpack(VERSION, Path(tmp) / "pristine")
        for r in range(args.rounds):
            counts, problems = one_round(pristine, Path(tmp), args.commands, rng)
            total.update(counts)
            ended = next(k for k in counts if k.startswith("ended "))
            print(f"round {r + 1}: {args.commands} commands: " + ", ".join(f"{k} {counts[k]}" for k in keys)
                  + f"; {ended}", flush=True)
            for line in problems:
                print(f"  {line}", flush=True)
            failed = failed or bool(problems)
    print(f"total over {args.rounds} rounds: " + ", ".join(f"{k} {total[k]}" for k in keys))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
