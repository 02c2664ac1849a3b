"""Greedy outputs compared across the arms of a live run.

Every arm of a sweep gets the same prompts at a level and repeat (one seed per level and
repeat, `level_seed`), and the load generator asks for greedy tokens, so every arm that serves
the same model must generate the same tokens for each prompt, however it gets there: a plain
server, EAGLE-3, dynspec switching between the two.  A request whose digest differs from the
reference arm's for the same prompt is an output the server got wrong (or a model whose greedy
choice is a near tie that another kernel path breaks differently: a real model's outputs can
differ slightly between a plain step and a verify; the tiny crafted models' cannot).

    python -m dynspec.live.identity RUN_DIR [--reference ARM]

Prints one row per arm, level and repeat: requests compared and how many differ.  Exit 1 if any
differs, 2 if nothing could be compared (no digests: a driver or API that does not return ids).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from dynspec.live.bench import read_requests
from dynspec.live.config import Level, level_name
from dynspec.results import read_table


class IdentityError(ValueError):
    """The run cannot be compared; one line naming what is missing."""


def _records(run_dir: Path, name: str) -> list | None:
    for suffix in (".jsonl", ".jsonl.gz"):
        path = run_dir / "requests" / f"{name}{suffix}"
        if path.exists():
            return read_requests(path)
    return None


def output_mismatches(run_dir: str | Path, reference: str | None = None) -> pd.DataFrame:
    """Per (arm, concurrency, request_rate, repeat): requests `compared` with the reference arm's
    request for the same prompt (both completed, both with a digest) and how many `differ`."""
    run_dir = Path(run_dir)
    results = run_dir / "results.csv"
    if not results.exists():
        raise IdentityError(f"{results}: no such file (not a sweep's run folder)")
    rows = read_table(results)
    arms = list(dict.fromkeys(rows["arm"]))
    if reference is None:
        reference = "baseline" if "baseline" in arms else arms[0] if arms else None
    if reference is None or reference not in arms:
        raise IdentityError(f"{run_dir}: no arm {reference!r} to compare with (arms: {', '.join(arms)})")
    out = []
    for (conc, rate, rep), level in rows.groupby(["concurrency", "request_rate", "repeat"]):
        lv = Level(int(conc), float(rate))
        ref = _records(run_dir, level_name(reference, lv, int(rep)))
        if ref is None:
            continue
        for arm in level["arm"]:
            if arm == reference:
                continue
            mine = _records(run_dir, level_name(arm, lv, int(rep)))
            if mine is None:
                continue
            pairs = [(a, b) for a, b in zip(ref, mine) if a.ok and b.ok and a.output_digest and b.output_digest]
            out.append({"arm": arm, "concurrency": int(conc), "request_rate": float(rate), "repeat": int(rep),
                        "reference": reference, "compared": len(pairs),
                        "differ": sum(a.output_digest != b.output_digest for a, b in pairs)})
    return pd.DataFrame(out, columns=["arm", "concurrency", "request_rate", "repeat", "reference", "compared",
                                      "differ"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dynspec.live.identity", description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir")
    ap.add_argument("--reference", help="the arm every other is compared with (default: baseline, else the first)")
    args = ap.parse_args(argv)
    try:
        table = output_mismatches(args.run_dir, args.reference)
    except (IdentityError, OSError, ValueError) as exc:
        print(f"dynspec.live.identity: {exc}", file=sys.stderr)
        return 2
    if table.empty or not table["compared"].any():
        print(f"dynspec.live.identity: {args.run_dir}: no request carries an output digest to compare",
              file=sys.stderr)
        return 2
    print(table.to_string(index=False))
    differ = int(table["differ"].sum())
    print(f"{differ} of {int(table['compared'].sum())} compared requests differ from {table['reference'].iloc[0]}'s")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
