"""Steady step intervals of each mode by batch size and the batch's mean context, read from a
goodput server's step traces (DYNSPEC_STEP_TRACE): what a step costs late in its requests' lives
against early, at one batch size.

A level is a stretch of the trace between idle gaps of over a second.  The context is
reconstructed: prompt tokens join with their prefill, every step adds the tokens it emitted, and
a step whose batch shrank keeps that share of the context (finished requests taken as average).
An interval counts when it and the result before it are steps of one mode at one batch size.

    python experiments/h200-llama8b-crafted/step_times_by_context.py \\
        experiments/h200-llama8b-crafted/data/crossover-warm-2 --batch 16-23
"""

from __future__ import annotations

import argparse
import csv
import gzip
import statistics
import sys
from collections import defaultdict
from pathlib import Path


def levels(rows: list[dict]) -> list[list[dict]]:
    out, cur, last = [], [], None
    for r in rows:
        t = float(r["t"])
        if last is not None and t - last > 1.0 and cur:
            out.append(cur)
            cur = []
        cur.append(r)
        last = t
    return out + [cur] if cur else out


def intervals(level: list[dict]) -> dict[tuple[str, int], list[tuple[float, float]]]:
    """(mode, batch) -> [(interval s, mean context per request)] of one level."""
    ctx, n, prev = 0.0, 0, None
    out: dict[tuple[str, int], list[tuple[float, float]]] = defaultdict(list)
    for r in level:
        kind, b, c, t = r["kind"], int(r["batch"]), int(r["count"]), float(r["t"])
        if kind == "F":
            ctx, n, prev = ctx + c, n + b, None
            continue
        if kind not in "SP":
            continue
        if 0 < b < n:
            ctx *= b / n
        n = b
        if prev is not None and prev[:2] == (kind, b):
            out[(kind, b)].append((t - prev[2], ctx / max(b, 1)))
        ctx += b + (c if kind == "S" else 0)
        prev = (kind, b, t)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="a live run folder with traces.call*/goodput.csv.gz")
    ap.add_argument("--batch", default="16-23", help="batch sizes LO-HI (default 16-23)")
    ap.add_argument("--min-steps", type=int, default=5, help="rows with fewer intervals are left out")
    a = ap.parse_args(argv)
    try:
        lo, hi = (int(x) for x in a.batch.split("-"))
    except ValueError:
        print(f"--batch: want LO-HI, got {a.batch!r}", file=sys.stderr)
        return 2
    traces = sorted(a.run.glob("traces.call*/goodput.csv*"))
    if not traces:
        print(f"{a.run}: no traces.call*/goodput.csv[.gz]", file=sys.stderr)
        return 2
    print("trace\tlevel peak\tmode\tbatch\tintervals\tmedian ms\tcontext/request")
    for path in traces:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt") as f:
            rows = list(csv.DictReader(f))
        for level in levels(rows):
            steps = [int(r["batch"]) for r in level if r["kind"] in "SP"]
            if not steps:
                continue
            for (kind, b), v in sorted(intervals(level).items()):
                if lo <= b <= hi and len(v) >= a.min_steps:
                    ms = 1000 * statistics.median(x[0] for x in v)
                    ctx = statistics.median(x[1] for x in v)
                    print(f"{path.parent.name}\t{max(steps)}\t{'spec' if kind == 'S' else 'plain'}\t{b}\t{len(v)}\t{ms:.2f}\t{ctx:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
