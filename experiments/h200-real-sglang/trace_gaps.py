"""Where a decode step's time goes, read from a torch profiler trace (Chrome JSON, .gz or not).

For each trace: the GPU's busy and idle time per step, the idle gaps grouped by what the CPU was
doing when it launched the kernel that ended each gap (the innermost SGLang/dynspec Python frame,
when the trace was recorded with stacks), the host waits (synchronize calls and device-to-host
copies) grouped the same way, the GPU time of the kernels each site launched (a graph replay's
kernels count for the site that replayed it), and the kernels that take the most GPU time per step.
--spans NAME,... also sums the GPU time of kernels launched inside each named Python function
(any depth, e.g. _draft_extend_for_prefill): what one phase of a step costs on the GPU.  Two arms'
traces side by side show what the patched plain step adds over a plain server's step.
    python experiments/h200-real-sglang/trace_gaps.py --steps 30 plain=DIR_OR_FILE patched-never=DIR_OR_FILE
    python experiments/h200-real-sglang/trace_gaps.py --steps 12 --spans _draft_extend_for_prefill,_dynspec_plain_step A=DIR
"""

from __future__ import annotations

import argparse
import bisect
import collections
import gzip
import json
from pathlib import Path

GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
WAITS = ("Synchronize", "cudaMemcpy ", "cudaMemcpy")  # host calls that block until the GPU catches up
GAP_SIZES = (("< 0.1 ms", 100.0), ("0.1-1 ms", 1000.0), ("1-10 ms", 10000.0), (">= 10 ms", float("inf")))


def load(path: Path) -> list[dict]:
    if path.is_dir():
        files = sorted(path.rglob("*.trace.json*"))
        if not files:
            raise SystemExit(f"trace_gaps: no *.trace.json[.gz] under {path}")
        path = max(files, key=lambda p: p.stat().st_size)  # the TP-0 scheduler's, the largest
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    return [e for e in events if e.get("ph") == "X" and "dur" in e]


def frame_at(py: list[tuple[float, float, str]], starts: list[float], ts: float) -> str:
    """The innermost sglang/dynspec Python frame running at ts (py sorted by start)."""
    best, best_start = "?", -1.0
    i = bisect.bisect_right(starts, ts)
    for start, end, name in py[max(0, i - 4000):i]:
        if start <= ts <= end and start >= best_start and ("sglang" in name or "dynspec" in name):
            best, best_start = name, start
    return best.split("/srt/")[-1].split("/dynspec/")[-1]


def span_time(events: list[dict], launches: dict, gpu: list, names: list[str]) -> dict[str, float]:
    """GPU microseconds of the kernels launched inside a python_function span whose name
    contains each of `names` (a kernel counts once per name, however deep the nesting)."""
    out = {}
    for name in names:
        spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                       if e.get("cat") == "python_function" and name in e["name"])
        merged: list[list[float]] = []
        for a, b in spans:  # nested or repeated spans: their union
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        starts = [m[0] for m in merged]
        total = 0.0
        for _, _, e in gpu:
            launch = launches.get(e.get("args", {}).get("correlation"))
            if launch is None:
                continue
            i = bisect.bisect_right(starts, launch["ts"]) - 1
            if i >= 0 and launch["ts"] <= merged[i][1]:
                total += e["dur"]
        out[name] = total
    return out


def analyse(events: list[dict], steps: int, min_gap_us: float = 5.0, spans: list[str] = ()) -> dict:
    gpu = sorted((e["ts"], e["ts"] + e["dur"], e) for e in events if e.get("cat") in GPU_CATS)
    if not gpu:
        raise SystemExit("trace_gaps: the trace holds no GPU events (recorded without CUDA?)")
    launches = {e.get("args", {}).get("correlation"): e for e in events if e.get("cat") == "cuda_runtime"}
    py = sorted((e["ts"], e["ts"] + e["dur"], e["name"]) for e in events if e.get("cat") == "python_function")
    starts = [p[0] for p in py]
    busy, idle, end = 0.0, collections.Counter(), gpu[0][0]
    gaps: list[tuple[float, str]] = []  # every idle gap: (us, site that ended it)
    work, sites = collections.Counter(), {}
    for start, stop, e in gpu:
        corr = e.get("args", {}).get("correlation")
        if corr not in sites:
            launch = launches.get(corr)
            sites[corr] = frame_at(py, starts, launch["ts"]) if launch else "?"
        work[sites[corr]] += e["dur"]
        if start - end > min_gap_us:
            idle[sites[corr]] += start - end
            gaps.append((start - end, sites[corr]))
        busy += max(0.0, stop - max(start, end))
        end = max(end, stop)
    waits = collections.Counter()
    for e in events:
        if e.get("cat") == "cuda_runtime" and any(w in e["name"] for w in WAITS) and e["dur"] > 20:
            waits[f"{e['name']} @ {frame_at(py, starts, e['ts'])}"] += e["dur"]
    kernels = collections.Counter()
    for _, _, e in gpu:
        kernels[e["name"][:90]] += e["dur"]
    span = end - gpu[0][0]
    per = 1000.0 * steps  # us -> ms per step
    # Idle by gap size (ms per step): many short gaps (per-step host work) or a few long ones
    # (a stall around a prefill, or no work queued at all).
    sizes = collections.Counter()
    for us, _ in gaps:
        sizes[next(label for label, top in GAP_SIZES if us < top)] += us
    return {"span_ms": span / per, "busy_ms": busy / per, "idle_ms": sum(idle.values()) / per,
            "idle_by_site": {k: v / per for k, v in idle.most_common(12)},
            "idle_by_gap_size": {label: sizes[label] / per for label, _ in GAP_SIZES},
            "longest_gaps_ms": {f"{i + 1:2d}. {site}": us / 1000.0
                                for i, (us, site) in enumerate(sorted(gaps, reverse=True)[:10])},
            "waits_by_site": {k: v / per for k, v in waits.most_common(12)},
            "gpu_by_site": {k: v / per for k, v in work.most_common(25)},
            "kernels": {k: v / per for k, v in kernels.most_common(40)},
            "gpu_by_span": {k: v / per for k, v in span_time(events, launches, gpu, list(spans)).items()}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, required=True, help="decode steps the traces hold")
    ap.add_argument("--out", help="also write the summaries as JSON")
    ap.add_argument("--spans", default="", help="comma-separated Python function names: GPU time launched inside each")
    ap.add_argument("arms", nargs="+", metavar="NAME=PATH")
    args = ap.parse_args()
    summaries = {}
    for spec in args.arms:
        name, _, path = spec.partition("=")
        s = summaries[name] = analyse(load(Path(path)), args.steps,
                                      spans=[x for x in args.spans.split(",") if x])
        print(f"\n== {name}: per step {s['span_ms']:.3f} ms traced, GPU busy {s['busy_ms']:.3f} ms, "
              f"idle {s['idle_ms']:.3f} ms")
        for title in ("idle_by_site", "idle_by_gap_size", "longest_gaps_ms", "waits_by_site", "gpu_by_site",
                      "gpu_by_span", "kernels"):
            print(f"  {title} ({'ms each' if title == 'longest_gaps_ms' else 'ms per step'}):")
            for k, v in s[title].items():
                print(f"    {v:8.3f}  {k}")
    if args.out:
        Path(args.out).write_text(json.dumps(summaries, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
