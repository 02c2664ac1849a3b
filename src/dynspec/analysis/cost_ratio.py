"""What a speculative step costs against a plain one: what goodput acts on, and what the arms imply.

goodput decides on the cost ratio of a speculative to a plain step, each with its share of the
prefills' overhead (Goodput.estimates, "cost_ratio", read from /get_server_info after each level).
A plain and an EAGLE-3 server measured side by side imply the same ratio: the EAGLE-3 server's
accept length times the plain server's output tok/s over its own.  This puts the two beside each
other for every level of a run, and splits a patched server's step trace (DYNSPEC_STEP_TRACE) into
steady steps and the rest.

    python -m dynspec.analysis.cost_ratio RUN_DIR [--plain baseline] [--eagle eagle3] [--policy dynspec-goodput]
        [--metric steady_output_throughput]
    python -m dynspec.analysis.cost_ratio --trace TRACE.csv[.gz] [--prefills]
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import statistics
import sys
from pathlib import Path

from dynspec.policy import bucket_of, BUCKET_EDGES
from dynspec.policy.goodput.params import GoodputConstants

KV_SHIFT_MAX = GoodputConstants.KV_SHIFT_MAX


def _open(path: Path):
    return gzip.open(path, "rt") if path.suffix == ".gz" else open(path)


def _estimates(scrape: Path) -> dict | None:
    """The policy's per-bucket estimates from a level's scrape (after the level)."""
    with _open(scrape) as f:
        data = json.load(f)
    stack = [data.get("after", data)]
    while stack:  # the dynspec block sits in internal_states; find it wherever it is
        node = stack.pop()
        if isinstance(node, dict):
            if "estimates" in node and "policy" in node:
                return node["estimates"]
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return None


def at_plain_point(est: dict, shift_max: float = KV_SHIFT_MAX) -> float | None:
    """A bucket's cost ratio with the spec time moved along its plane to the KV tokens and batch
    the plain time stands at (as the policy moves both to a step's own, by at most shift_max of
    it): the two modes compared at one point.  Where goodput leaves a mode for long, that mode's
    point stays where it was last timed (speculation off at C = 128: its time at the level's
    first, short requests), and the ratio at the two points is not what any step faced.  The move
    d adds d / (plain step + its prefill share) to the ratio; scrapes from before `prefill_ms`
    existed give the share backed out of the ratio, or none where the ratio cannot tell it (then
    the move is read at its largest)."""
    try:
        tp, ts, acc, r = est["plain_ms"], est["spec_ms"], est["accepted"], est["cost_ratio"]
        (kp, ks), (bp, bs) = est["kv_tokens"], est["batch"]
        per_kv, per_req = est["us_per_kv_token"][1] / 1000.0, est["ms_per_request"][1]
    except (KeyError, TypeError, ValueError):
        return None
    if None in (tp, ts, acc, r):
        return None
    if None in (kp, ks, bp, bs):
        return r
    d = per_kv * (kp - ks) + per_req * (bp - bs)
    d = max(-shift_max * ts, min(shift_max * ts, d))
    pf = est.get("prefill_ms")
    if pf is None:  # r = (ts + pf (1 + acc)) / (tp + pf)
        den = r - 1.0 - acc
        pf = max((ts - r * tp) / den, 0.0) if abs(den) > 0.05 else 0.0
    return r + d / (tp + pf)


def ratios(run: Path, plain: str = "baseline", eagle: str = "eagle3", policy: str = "dynspec-goodput",
           metric: str = "output_throughput") -> list[dict]:
    """Per level and repeat: the ratio the arms imply (by `metric`: the whole level's throughput or
    its steady window's) and the one the policy acted on (its bucket)."""
    rows: dict[tuple[int, int], dict[str, dict]] = {}
    with open(run / "results.csv") as f:
        for r in csv.DictReader(f):
            if not r.get("error"):
                rows.setdefault((int(r["concurrency"]), int(r["repeat"])), {})[r["arm"]] = r
    out = []
    for (c, rep), arms in sorted(rows.items()):
        if plain not in arms or eagle not in arms:
            continue
        a = float(arms[eagle]["accept_length"])
        implied = a * float(arms[plain].get(metric) or "nan") / float(arms[eagle].get(metric) or "nan")
        acted = level = None
        for name in (f"{policy}_c{c}_r{rep}.json", f"{policy}_c{c}_r{rep}.json.gz"):
            if (run / "scrapes" / name).exists():
                est = (_estimates(run / "scrapes" / name) or {}).get(f"{BUCKET_EDGES[bucket_of(c)]}+") or {}
                acted, level = est.get("cost_ratio"), at_plain_point(est)
        out.append({"concurrency": c, "repeat": rep, "accept_length": a, "implied": implied, "acted_on": acted,
                    "acted_over_implied": None if acted is None else acted / implied,
                    "one_point_over_implied": None if level is None else level / implied})
    return out


def trace_split(path: Path, gap_s: float = 0.5) -> list[dict]:
    """A step trace cut into busy stretches (a pause over gap_s ends one): per stretch, wall time
    per decode step against the mean steady interval of each mode (a result between two steps of
    its mode, no prefill beside it): what steady step times leave out."""
    with _open(path) as f:
        res = [(float(r["t"]), r["kind"], int(r["batch"])) for r in csv.DictReader(f) if r["kind"] in "SPF"]
    out, start = [], 0
    for i in range(1, len(res) + 1):
        if i < len(res) and res[i][0] - res[i - 1][0] <= gap_s:
            continue
        seg, start = res[start:i], i
        steps = [r for r in seg if r[1] != "F"]
        if len(steps) < 20:
            continue
        steady: dict[str, list[float]] = {"S": [], "P": []}
        for a, b, c in zip(seg, seg[1:], seg[2:]):
            if a[1] == b[1] == c[1] != "F":
                steady[b[1]].append(b[0] - a[0])
        wall = seg[-1][0] - seg[0][0]
        out.append({"batch": statistics.median(r[2] for r in steps), "steps_spec": sum(r[1] == "S" for r in steps),
                    "steps_plain": sum(r[1] == "P" for r in steps), "prefills": len(seg) - len(steps),
                    "wall_ms_per_step": 1000 * wall / len(steps),
                    "steady_spec_ms": 1000 * statistics.mean(steady["S"]) if steady["S"] else None,
                    "steady_plain_ms": 1000 * statistics.mean(steady["P"]) if steady["P"] else None})
    return out


def prefill_split(path: Path, gap_s: float = 0.5) -> list[dict]:
    """A step trace's prefill forwards per busy stretch (cut as trace_split cuts them), by the mode
    in force and by how each was launched, as the Controller times them: one launched while
    decoding from the previous result (what it added), one launched on an idle server from its
    launch (a whole forward's latency).  Milliseconds per prompt."""
    with _open(path) as f:
        res = [(float(r["t"]), r["kind"], int(r["batch"])) for r in csv.DictReader(f) if r["kind"] in "SPFf"]
    out: list[dict] = []
    sums: dict[str, list[float]] = {}
    last = launched = None
    mode, first, batches = "P", None, []

    def close() -> None:
        if first is not None and batches:
            row: dict = {"start_s": first, "batch": statistics.median(batches)}
            for key in ("busy_spec", "busy_plain", "idle_spec", "idle_plain"):
                sec, n = sums.get(key, (0.0, 0))
                row[f"{key}_ms"] = 1000 * sec / n if n else None
                row[f"{key}_prompts"] = int(n)
            out.append(row)

    for t, kind, batch in res:
        if kind == "f":
            launched = t
            continue
        if last is not None and t - last > gap_s:
            close()
            sums, first, batches = {}, None, []
        if first is None:
            first = t
        if kind == "F":
            idle = last is not None and launched is not None and launched > last
            start = launched if idle else last
            if start is not None and 0.0 < t - start <= 1.0:
                s = sums.setdefault(f"{'idle' if idle else 'busy'}_{'spec' if mode == 'S' else 'plain'}", [0.0, 0])
                s[0] += t - start
                s[1] += batch
        else:
            mode = kind
            batches.append(batch)
        last = t
    if last is not None:
        close()
    return out


def _fmt(v) -> str:
    return "-" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dynspec.analysis.cost_ratio", description=__doc__.split("\n\n")[0])
    ap.add_argument("run", nargs="?", help="a run folder (results.csv, scrapes/)")
    ap.add_argument("--plain", default="baseline")
    ap.add_argument("--eagle", default="eagle3")
    ap.add_argument("--policy", default="dynspec-goodput")
    ap.add_argument("--metric", default="output_throughput", choices=["output_throughput", "steady_output_throughput"],
                    help="the arms' throughput the implied ratio comes from (default: the whole level's)")
    ap.add_argument("--trace", help="a step trace (DYNSPEC_STEP_TRACE) to split instead")
    ap.add_argument("--prefills", action="store_true",
                    help="with --trace: prefill ms per prompt by mode, launched while decoding or on an idle server")
    args = ap.parse_args(argv)
    if args.trace:
        path = Path(args.trace)
        if not path.is_file():
            ap.error(f"--trace {path}: no such file")
        rows = prefill_split(path) if args.prefills else trace_split(path)
    elif args.run:
        run = Path(args.run)
        if not (run / "results.csv").is_file():
            ap.error(f"{run}: no results.csv (a run folder)")
        rows = ratios(run, args.plain, args.eagle, args.policy, args.metric)
    else:
        ap.error("give a run folder or --trace")
    if not rows:
        print("nothing to compare")
        return 0
    keys = list(rows[0])
    print("  ".join(keys))
    for r in rows:
        print("  ".join(_fmt(r[k]) for k in keys))
    return 0


if __name__ == "__main__":
    sys.exit(main())
