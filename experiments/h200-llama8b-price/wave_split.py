"""Where a closed-loop level's request time goes, kind against kind, from its per-request records.

In a fixed-length closed loop the C requests of a level run in waves: they finish within a step
or two of each other, the next C are sent at once, prefill in a few batches and decode together.
Per request this splits the time into the time to first token, the first inter-token gap (it
holds the wave's later prefills), steady decode steps (gaps under --pause-ms) and pauses (longer
gaps); per wave, the offsets from its first send to its first token, to its last first token and
to its last request's end.  Arms are pooled by kind (their sim_arm in the run's config.yaml; without
one, a name with "never" in it, else plain).
    python experiments/h200-llama8b-price/wave_split.py data/runs/RUN [--out waves.csv]
Needs the run's requests/*.jsonl[.gz] (the sweep writes them; the committed H200 runs leave
them out for size).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import pandas as pd

from dynspec.live.bench import read_requests
from dynspec.live.config import arm_kinds
from dynspec.results import RequestRecord


def streamed(path: Path) -> list[RequestRecord]:
    """The level's completed requests that streamed at least two tokens (they have gaps)."""
    return [r for r in read_requests(path) if r.ok and r.ttft is not None and r.itls]


def waves(recs: list[RequestRecord], gap_s: float) -> list[list[RequestRecord]]:
    """Requests grouped by send time: a wave's sends lie within gap_s of its first."""
    out: list[list[RequestRecord]] = []
    for r in sorted(recs, key=lambda r: r.start):
        if out and r.start - out[-1][0].start < gap_s:
            out[-1].append(r)
        else:
            out.append([r])
    return out


def split_level(recs: list[RequestRecord], pause_s: float) -> dict:
    """Mean milliseconds per request in each part of its life."""
    n = len(recs)
    later = [x for r in recs for x in r.itls[1:]]
    steady = [x for x in later if x < pause_s]
    return {"requests": n, "e2e_ms": 1e3 * statistics.mean(r.e2e for r in recs),
            "ttft_ms": 1e3 * statistics.mean(r.ttft for r in recs),
            "first_gap_ms": 1e3 * statistics.mean(r.itls[0] for r in recs),
            "steady_ms": 1e3 * sum(steady) / n, "pause_ms": 1e3 * (sum(later) - sum(steady)) / n,
            "step_ms": 1e3 * statistics.mean(steady) if steady else float("nan")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--pause-ms", type=float, default=15.0, help="a gap at least this long is a pause (a prefill)")
    ap.add_argument("--gap-ms", type=float, default=150.0, help="sends further apart start a new wave")
    ap.add_argument("--min-wave", type=int, default=0, help="leave out waves smaller than this (default: C / 2)")
    ap.add_argument("--out", type=Path, help="also write one row per wave as CSV")
    args = ap.parse_args()
    files = sorted((args.run / "requests").glob("*.jsonl*"))
    if not files:
        print(f"wave_split: no per-request records in {args.run / 'requests'}", file=sys.stderr)
        return 2
    kinds = arm_kinds(args.run)
    levels, rows = [], []
    for f in files:
        name = f.name.split(".jsonl")[0]
        # a level is named ARM_<level>_r<repeat> (level_name): its arm is the longest one that prefixes it
        arm = max((a for a in kinds if name.startswith(a + "_")), key=len, default=None)
        kind = kinds[arm] if arm else ("never" if "never" in name else "plain")
        recs = streamed(f)
        if not recs:
            continue
        levels.append({"level": name, "kind": kind, **split_level(recs, args.pause_ms / 1e3)})
        ws = waves(recs, args.gap_ms / 1e3)
        least = args.min_wave or max(len(w) for w in ws) // 2
        for i, w in enumerate(ws[1:-1], 1):  # the first and last waves of a level are ramps
            if len(w) < least:
                continue
            s0 = w[0].start
            firsts = sorted(r.start + r.ttft - s0 for r in w)
            rows.append({"level": name, "kind": kind, "wave": i, "requests": len(w),
                         "first_token_ms": 1e3 * firsts[0], "last_first_token_ms": 1e3 * firsts[-1],
                         "end_ms": 1e3 * max(r.end - s0 for r in w)})
    pd.set_option("display.width", 160)
    lv = pd.DataFrame(levels)
    print(f"per request, mean ms (pause: gaps of {args.pause_ms:g} ms or more after the first):")
    print(lv.groupby("kind").mean(numeric_only=True).round(3).to_string())
    wv = pd.DataFrame(rows)
    if len(wv):
        print("\nper wave, ms from its first send (median over waves):")
        med = wv.groupby("kind")[["first_token_ms", "last_first_token_ms", "end_ms"]].median()
        med["decode_ms"] = med["end_ms"] - med["last_first_token_ms"]
        print(med.assign(waves=wv.groupby("kind").size()).round(1).to_string())
    if args.out:
        wv.to_csv(args.out, index=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
