"""Host-sync candidates per decode step: a plain SGLang 0.5.9 server against the patched EAGLE-3
server with speculation off (DYNSPEC_POLICY=never), on this CPU with the tiny crafted models.

Counts every call that would wait for the GPU on a GPU (`item`, `tolist`, `cpu`, `bool(t)`,
`nonzero`, `Event.synchronize`, `.to("cpu")`) per call site, over the same greedy requests at
concurrency 1 in both arms, divided by the decode steps, and prints the sites whose rate
differs.  Which are real syncs depends on where each tensor lives on the GPU: read the site.
    python experiments/h200-real-sglang/sync_census.py [--requests 4] [--tokens 64] [--out census.json]
    python experiments/h200-real-sglang/sync_census.py --gpu --dummy llama-3.1-8b --profile-steps 30 --out DIR/census.json
    python experiments/h200-real-sglang/sync_census.py --gpu --dummy llama-3.1-8b --concurrency 64 --requests 384 \
        --tokens 128 --prompt-len 256 --profile-steps 160 --profile-after 3 --no-census --out DIR/c64.json

On a GPU only calls on tensors that live on the GPU count, and `--profile-steps N` also has
each arm's scheduler write a torch profiler trace of N decode steps (SGLang's /start_profile)
beside --out: where the CPU waits, and what the GPU does between the target's graphs.
`--concurrency C --profile-after S` traces a running load instead: C requests in flight, the
profile started S seconds in, so the trace holds prefills that interrupt (or follow) a batch of C;
`--no-census` leaves the call counters out of the servers, so their CPU time is the server's own.
`--host-times` times the scheduler's host functions instead of counting calls (per decode step,
ms and calls, and calls by duration, dynspec.realsglang.hosttime): how long the CPU works on a step
without a profiler; `--device-timer` (GPU) adds each forward's GPU time the same way.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import threading
import time
from pathlib import Path

import urllib.request

from dynspec.realsglang import census, hosttime
from dynspec.realsglang.arms import Arm, greedy, shrinking_prompts, start_arms
from dynspec.realsglang.tinymodels import make_dummy_models, make_models


def start_profile(server, folder: Path, steps: int, gpu: bool) -> None:
    body = json.dumps({"output_dir": str(folder), "num_steps": steps, "with_stack": True,
                       "activities": ["CPU", "GPU"] if gpu else ["CPU"], "profile_prefix": server.name})
    req = urllib.request.Request(server.base_url + "/start_profile", data=body.encode(),
                                 headers={"Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=60).read()


def wait_for_trace(folder: Path, timeout: float = 240.0) -> None:
    """Until the scheduler has written its trace (a large one takes a while): a file whose size
    holds still for two seconds."""
    deadline, last = time.monotonic() + timeout, -1
    while time.monotonic() < deadline:
        size = sum(f.stat().st_size for f in folder.rglob("*.trace.json*")) if folder.exists() else 0
        if size and size == last:
            return
        last = size
        time.sleep(2.0)
    print(f"sync_census: no complete trace under {folder} after {timeout:.0f} s")


def print_host_times(args, rates: dict, wall: dict) -> int:
    """Calls and host milliseconds per decode step for each timed function, both arms."""
    print(f"host time per decode step, concurrency {args.concurrency}, {args.requests} requests x "
          f"{args.tokens} tokens (inclusive: a function's time holds its callees' and its waits)")
    print(f"{'calls':>13s} {'ms plain':>9s} {'ms never':>9s} {'diff':>7s}  function")
    zero = (0.0, 0.0, [0.0] * (len(hosttime.BUCKETS_MS) + 1))
    names = sorted(set(rates["plain"]) | set(rates["patched-never"]),
                   key=lambda k: -(rates["patched-never"].get(k, zero)[1] - rates["plain"].get(k, zero)[1]))
    for k in names:
        (cp, tp, _), (cn, tn, _) = rates["plain"].get(k, zero), rates["patched-never"].get(k, zero)
        print(f"{cp:6.2f} {cn:6.2f} {tp:9.3f} {tn:9.3f} {tn - tp:+7.3f}  {k}")
    # Where a difference sits: a few long calls, or many slightly longer ones.  The GPU time of
    # each forward (with --device-timer) and the eight functions whose host time differs most.
    edges = ["<=" + f"{e:g}" for e in hosttime.BUCKETS_MS] + [f">{hosttime.BUCKETS_MS[-1]:g}"]
    shown = [k for k in names if k.startswith("gpu ")] + \
        sorted((k for k in names if not k.startswith("gpu ")),
               key=lambda k: -abs(rates["patched-never"].get(k, zero)[1] - rates["plain"].get(k, zero)[1]))[:8]
    print(f"\n  {'':>13s} {'calls per 1000 decode steps, by ms':40s}" + "  ".join(f"{e:>7s}" for e in edges))
    for k in shown:
        for arm in ("plain", "patched-never"):
            bins = rates[arm].get(k, zero)[2]
            print(f"  {arm:>13s} {k[:40]:40s}" + "  ".join(f"{b:7.1f}" for b in bins))
    ms = ms_per_token(args, wall)
    print(f"wall ms per output token: plain {ms['plain']:.4f}, never {ms['patched-never']:.4f} "
          f"(never / plain = {ms['patched-never'] / ms['plain']:.3f})")
    return write_out(args, {"host_ms_per_step": rates, "ms_per_token": ms})


def ms_per_token(args, wall: dict) -> dict:
    """Wall milliseconds per output token of each arm's load (prefills included)."""
    return {a: 1000 * wall[a] / (args.requests * args.tokens) for a in wall}


def write_out(args, summary: dict) -> int:
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(summary, indent=1, sort_keys=True))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=64, help="output tokens per request")
    ap.add_argument("--out", default=None, help="also write every site's counts as JSON")
    ap.add_argument("--gpu", action="store_true", help="serve on the GPU (CUDA graphs, Triton attention)")
    ap.add_argument("--dummy", metavar="PRESET", help="real shapes with --load-format dummy (bf16), e.g. llama-3.1-8b")
    ap.add_argument("--profile-steps", type=int, default=0, help="a torch profiler trace of N decode steps per arm")
    ap.add_argument("--concurrency", type=int, default=1, help="requests in flight (closed loop)")
    ap.add_argument("--profile-after", type=float, default=None, metavar="S",
                    help="start the trace S seconds into the load (default: before it)")
    ap.add_argument("--no-census", action="store_true", help="no call counters in the servers (trace only)")
    ap.add_argument("--host-times", action="store_true",
                    help="time the scheduler's host functions (dynspec.realsglang.hosttime) instead of the census")
    ap.add_argument("--device-timer", action="store_true",
                    help="with --gpu: SGLang's device timer on, each forward's GPU time in the host times too")
    ap.add_argument("--prompt-len", type=int, default=0,
                    help="random prompts of this many tokens (default: the tiny models' short prompts); "
                         "with --profile-steps, the trace then holds each prompt's prefill too")
    args = ap.parse_args()
    if args.device_timer and not args.gpu:
        ap.error("--device-timer needs --gpu (SGLang's device timer records CUDA events)")
    tmp = Path(tempfile.mkdtemp(prefix="dynspec-census-"))
    extra = []
    if args.dummy:
        make_dummy_models(tmp / "models", args.dummy)
        extra = ["--load-format", "dummy", "--dtype", "bfloat16"]
    else:
        make_models(tmp / "models")
    if args.gpu:
        bs = str(max(8, args.concurrency))
        extra += ["--mem-fraction-static", "0.4", "--cuda-graph-max-bs", bs, "--max-running-requests", bs]
    if args.device_timer:  # CUDA events around every forward: a GPU only
        extra += ["--enable-metrics"]
    traces = Path(args.out).parent / "traces" if args.out else tmp / "traces"
    folders = {"plain": tmp / "census-plain", "patched-never": tmp / "census-never"}
    variable = "DYNSPEC_HOST_TIMES" if args.host_times else "DYNSPEC_SYNC_CENSUS"
    counters = {n: {} if args.no_census else {variable: str(f)} for n, f in folders.items()}
    for env in counters.values():
        if args.device_timer:
            env["SGLANG_ENABLE_METRICS_DEVICE_TIMER"] = "1"
    read = hosttime.read if args.host_times else census.read
    arms = [Arm("plain", speculative=False, env=counters["plain"]),
            Arm("patched-never", patched=True, policy="never", env=counters["patched-never"])]
    prompts, _ = shrinking_prompts(args.requests)
    if args.prompt_len:
        rng = random.Random(11)
        prompts = [[rng.randrange(3, 32000 if args.dummy else 256) for _ in range(args.prompt_len)]
                   for _ in range(args.requests)]
    lengths = [args.tokens] * args.requests
    rates, wall = {}, {}
    # One arm at a time: SGLang sizes its KV pool as if alone on the GPU (0.4 of it for weights and
    # KV), so a second server started beside the first finds too little left and exits.
    for arm in arms:
        with start_arms([arm], tmp / "models", tmp / "logs", gpu=args.gpu, extra_args=extra) as servers:
            name, server = arm.name, servers[arm.name]
            greedy(server, prompts[:1], [8], 1)  # warm: first-request paths are not per step
            time.sleep(2.5)  # the census flushes once a second
            before = read(folders[name])
            started = threading.Event()

            def profile(server=server, folder=traces / name, started=started):
                if args.profile_steps:
                    start_profile(server, folder, args.profile_steps, args.gpu)
                    started.set()

            later = threading.Timer(args.profile_after or 0.0, profile)
            if args.profile_after is None:
                profile()
            else:
                later.start()
            t0 = time.perf_counter()
            greedy(server, prompts, lengths, args.concurrency)
            wall[name] = time.perf_counter() - t0
            later.cancel()
            time.sleep(2.5)
            if started.is_set():
                wait_for_trace(traces / name)
            elif args.profile_steps:
                print(f"sync_census: {name}: the load ended before --profile-after; no trace")
            after = read(folders[name])
            # Decode steps: exact at concurrency 1; at C > 1, output tokens / C (a full batch's).
            steps = args.requests * (args.tokens - 1) / args.concurrency
            if args.host_times:  # per decode step: calls, ms, and calls per duration bucket x 1000
                rates[name] = {}
                for k, (c, t, bins) in after.items():
                    c0, t0, bins0 = before.get(k, (0, 0.0, (0,) * len(bins)))
                    rates[name][k] = ((c - c0) / steps, 1000 * (t - t0) / steps,
                                      [1000 * (b - b0) / steps for b, b0 in zip(bins, bins0)])
            else:
                rates[name] = {k: (after[k] - before.get(k, 0)) / steps for k in after if after[k] != before.get(k, 0)}
    if args.host_times:
        return print_host_times(args, rates, wall)
    sites = sorted(set(rates["plain"]) | set(rates["patched-never"]),
                   key=lambda k: -(rates["patched-never"].get(k, 0) - rates["plain"].get(k, 0)))
    where = ("GPU, only tensors on the GPU" if args.gpu else "CPU, every call") + \
        (f", {args.dummy} shapes" if args.dummy else ", tiny models")
    print(f"per decode step, concurrency {args.concurrency}, {args.requests} requests x {args.tokens} tokens ({where})")
    print(f"{'plain':>7s} {'never':>7s}  site")
    for k in sites:
        p, n = rates["plain"].get(k, 0.0), rates["patched-never"].get(k, 0.0)
        if abs(p - n) > 1e-9 or p >= 0.5:
            print(f"{p:7.2f} {n:7.2f}  {k}")
    total = {a: sum(r.values()) for a, r in rates.items()}
    print(f"{total['plain']:7.2f} {total['patched-never']:7.2f}  all sites")
    # Wall time per output token (prefills included, census wrappers included in both unless
    # --no-census): with tiny models most of a step is the server's own CPU work.
    ms = ms_per_token(args, wall)
    print(f"{ms['plain']:7.2f} {ms['patched-never']:7.2f}  ms per output token "
          f"(patched-never / plain = {ms['patched-never'] / ms['plain']:.2f})")
    return write_out(args, {"per_step": rates, "ms_per_token": ms})


if __name__ == "__main__":
    raise SystemExit(main())
