"""A live server's step trace replayed through a policy's estimates: what goodput would have read.

A goodput server's DYNSPEC_STEP_TRACE holds every launch (f, p, s) and result (F, P, S) with its
wall time, batch size and accepted drafts.  This feeds the results to a fresh policy in order, as
the server fed its own (each step's mode forced to the one it ran, its interval since the last
result, `clean` when no prefill launch came between), and prints per level (a stretch between
idle gaps over a second) the spec/plain gain the policy would weigh at the level's largest batch
and the steps it would leave to its next probe of the other mode there.
Set beside the arms' throughputs, it shows which of the policy's estimates stray from what the
server did, on the server's own timings, without another run.

Approximations, so a check of estimates, not a measurement: a result's accepted drafts are spread
evenly over its requests, and its KV tokens are rebuilt from the prompts' and steps' tokens (the
trace keeps neither).

    python -m dynspec.analysis.replay RUN_DIR/traces.call1/goodput.csv.gz [--spec goodput:window=3]
    python -m dynspec.analysis.replay TRACE --level 3 --tenths

`--level N` starts a fresh policy at level N (a policy built when that level began, as a policy
control file's first switch to it does); `--tenths` then follows that one level, its first k tenths
fed for k = 1..10, and prints what the policy would weigh at the level's largest batch after each:
the plain and speculative step times (moved to the batch's KV tokens), the accepted drafts, the gain.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import statistics
import sys
from pathlib import Path

from dynspec.policy import Goodput, StepRecord, build_policy
from dynspec.policy.buckets import bucket_of
from dynspec.analysis.rank_traces import TraceError
from dynspec.policy.base import PolicySpecError


def read_levels(path: Path) -> list[list[dict]]:
    """The trace's rows, split where the server sat idle for over a second."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt") as f:
            reader = csv.DictReader(f)
            if reader.fieldnames != ["t", "kind", "batch", "count"]:
                raise TraceError(f"{path}: not a step trace (first line should be t,kind,batch,count)")
            rows = list(reader)
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"{path}: cannot read ({exc})") from None
    levels: list[list[dict]] = []
    last = None
    for r in rows:
        t = float(r["t"])
        if last is None or t - last > 1.0:
            levels.append([])
        levels[-1].append(r)
        last = t
    return levels


def _fresh(spec: str) -> Goodput:
    p = build_policy(spec)
    if not isinstance(p, Goodput):
        raise PolicySpecError(f"{spec}: replay reads goodput's estimates")
    return p


def replay(levels: list[list[dict]], spec: str = "goodput:window=3", policy: Goodput | None = None) -> list[dict]:
    """Per level: its largest batch, the share of its steps that speculated, and the median gain
    the policy weighed at that batch (None where it had no estimate).  `policy`: the one fed (by
    default a fresh one of `spec`)."""
    p = policy if policy is not None else _fresh(spec)
    out = []
    for level in levels:
        decodes = [int(r["batch"]) for r in level if r["kind"] in "SP"]
        if not decodes:
            continue
        peak, gains, intervals = max(decodes), [], []
        last: float | None = None
        dirty, ctx, n, decoded = False, 0.0, 0, False
        for r in level:
            kind, b, t = r["kind"], int(r["batch"]), float(r["t"])
            if kind in "fps":  # launches: a prefill's, or a decode step's mode decided
                if kind == "f":
                    dirty = True
                    continue
                if b == peak:
                    g = p._gain(p._last_b)
                    if g is not None:
                        gains.append(g)
                speculate = p.decide(b)
                if b == peak:  # steps to the next probe of the other mode, from the mode decided
                    intervals.append(p._interval[speculate][bucket_of(b)])
                p._window = ((p._window >> 1) << 1) | (kind == "s")  # the mode it ran
                continue
            dt = None if last is None else t - last
            last = t
            c = int(r["count"])
            if kind == "F":
                ctx, n = ctx + c, n + b
                p.note_prefill(b, c, dt, not decoded)
                continue
            decoded = True
            if 0 < b < n:  # requests left: the rest keep their share of the context
                ctx *= b / n
            n = b
            spec_step = kind == "S"
            acc = [c // b + (1 if i < c % b else 0) for i in range(b)] if spec_step and b else ()
            p.observe(StepRecord(b, spec_step, acc, dt, None, not dirty, None, int(ctx)))
            ctx += b + (c if spec_step else 0)
            dirty = False
        share = sum(1 for r in level if r["kind"] == "S") / len(decodes)
        out.append({"peak_batch": peak, "spec_share": round(share, 3),
                    "gain": round(statistics.median(gains), 3) if gains else None,
                    "probe_interval": (min(intervals), int(statistics.median(intervals))) if intervals else None,
                    "overhead_ms_per_request": p.prefill_estimates()["overhead_ms_per_request"]})
    return out


def tenths(level: list[dict], spec: str = "goodput:window=3") -> list[dict]:
    """What a fresh policy would weigh at the level's largest batch after its first k tenths, k = 1..10:
    the step times it would use there (at the KV tokens then), the accepted drafts and the gain."""
    peak = max((int(r["batch"]) for r in level if r["kind"] in "SP"), default=0)
    out = []
    for k in range(1, 11):
        part = level[: len(level) * k // 10]
        if not any(r["kind"] in "SP" for r in part):
            continue
        p = _fresh(spec)
        replay([part], policy=p)
        b = bucket_of(peak)
        (tp, ts), acc, gain = p._times(b), p._accepted(b), p._gain(b)
        out.append({"tenth": k, "peak_batch": peak,
                    "plain_ms": None if tp is None else round(tp * 1e3, 2),
                    "spec_ms": None if ts is None else round(ts * 1e3, 2),
                    "accepted": None if acc is None else round(acc, 3),
                    "gain": None if gain is None else round(gain, 3)})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", type=Path, help="a DYNSPEC_STEP_TRACE file (.csv or .csv.gz)")
    ap.add_argument("--spec", default="goodput:window=3", help="the policy (default goodput:window=3, as a live server runs it)")
    ap.add_argument("--level", type=int, default=0, help="start a fresh policy at this level (default 0, the first)")
    ap.add_argument("--tenths", action="store_true", help="follow that one level tenth by tenth")
    a = ap.parse_args(argv)
    if not a.trace.is_file():
        print(f"{a.trace}: no such file", file=sys.stderr)
        return 2
    try:
        levels = read_levels(a.trace)
        if not 0 <= a.level < len(levels):
            print(f"{a.trace}: --level {a.level}: the trace has levels 0..{len(levels) - 1}", file=sys.stderr)
            return 2
        if a.tenths:
            steps = tenths(levels[a.level], a.spec)
            print("tenth\tpeak batch\tplain ms\tspec ms\taccepted\tgain")
            for r in steps:
                print("\t".join(str(r[k]) for k in ("tenth", "peak_batch", "plain_ms", "spec_ms", "accepted", "gain")))
            return 0
        rows = replay(levels[a.level:], a.spec)
    except (TraceError, PolicySpecError, KeyError, ValueError) as e:
        print(f"{a.trace}: {e}", file=sys.stderr)
        return 2
    print("level\tpeak batch\tspec share\tgain at peak\tprobe interval at peak (least, median)\tprefill ms/request")
    for i, r in enumerate(rows):
        print(f"{i}\t{r['peak_batch']}\t{r['spec_share']}\t{r['gain']}\t{r['probe_interval']}\t{r['overhead_ms_per_request']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
