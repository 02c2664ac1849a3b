"""Host-sync candidates per decode step: a plain SGLang 0.5.9 server against the patched EAGLE-3
server with speculation off (DYNSPEC_POLICY=never), on this CPU with the tiny crafted models.

Counts every call that would wait for the GPU on a GPU (`item`, `tolist`, `cpu`, `bool(t)`,
`nonzero`, `Event.synchronize`, `.to("cpu")`) per call site, over the same greedy requests at
concurrency 1 in both arms, divided by the decode steps, and prints the sites whose rate
differs.  Which are real syncs depends on where each tensor lives on the GPU: read the site.
    python benchmarks/sync_census.py [--requests 4] [--tokens 64] [--out census.json]
    python benchmarks/sync_census.py --gpu --dummy llama-3.1-8b --profile-steps 30 --out DIR/census.json

On a GPU only calls on tensors that live on the GPU count, and `--profile-steps N` also has
each arm's scheduler write a torch profiler trace of N decode steps (SGLang's /start_profile)
beside --out: where the CPU waits, and what the GPU does between the target's graphs.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

import urllib.request

from dynspec.realsglang import census
from dynspec.realsglang.arms import Arm, greedy, shrinking_prompts, start_arms
from dynspec.realsglang.tinymodels import make_dummy_models, make_models


def start_profile(server, folder: Path, steps: int, gpu: bool) -> None:
    body = json.dumps({"output_dir": str(folder), "num_steps": steps, "with_stack": True,
                       "activities": ["CPU", "GPU"] if gpu else ["CPU"], "profile_prefix": server.name})
    req = urllib.request.Request(server.base_url + "/start_profile", data=body.encode(),
                                 headers={"Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=60).read()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=64, help="output tokens per request")
    ap.add_argument("--out", default=None, help="also write every site's counts as JSON")
    ap.add_argument("--gpu", action="store_true", help="serve on the GPU (CUDA graphs, Triton attention)")
    ap.add_argument("--dummy", metavar="PRESET", help="real shapes with --load-format dummy (bf16), e.g. llama-3.1-8b")
    ap.add_argument("--profile-steps", type=int, default=0, help="a torch profiler trace of N decode steps per arm")
    ap.add_argument("--prompt-len", type=int, default=0,
                    help="random prompts of this many tokens (default: the tiny models' short prompts); "
                         "with --profile-steps, the trace then holds each prompt's prefill too")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="dynspec-census-"))
    extra = []
    if args.dummy:
        make_dummy_models(tmp / "models", args.dummy)
        extra = ["--load-format", "dummy", "--dtype", "bfloat16"]
    else:
        make_models(tmp / "models")
    if args.gpu:
        extra += ["--mem-fraction-static", "0.4", "--cuda-graph-max-bs", "8", "--max-running-requests", "8"]
    traces = Path(args.out).parent / "traces" if args.out else tmp / "traces"
    folders = {"plain": tmp / "census-plain", "patched-never": tmp / "census-never"}
    arms = [Arm("plain", speculative=False, env={"DYNSPEC_SYNC_CENSUS": str(folders["plain"])}),
            Arm("patched-never", patched=True, policy="never",
                env={"DYNSPEC_SYNC_CENSUS": str(folders["patched-never"])})]
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
            before = census.read(folders[name])
            if args.profile_steps:
                start_profile(server, traces / name, args.profile_steps, args.gpu)
            t0 = time.perf_counter()
            greedy(server, prompts, lengths, 1)
            wall[name] = time.perf_counter() - t0
            time.sleep(2.5)
            after = census.read(folders[name])
            steps = args.requests * (args.tokens - 1)  # decode steps at concurrency 1
            rates[name] = {k: (after[k] - before.get(k, 0)) / steps for k in after if after[k] != before.get(k, 0)}
    sites = sorted(set(rates["plain"]) | set(rates["patched-never"]),
                   key=lambda k: -(rates["patched-never"].get(k, 0) - rates["plain"].get(k, 0)))
    where = ("GPU, only tensors on the GPU" if args.gpu else "CPU, every call") + \
        (f", {args.dummy} shapes" if args.dummy else ", tiny models")
    print(f"per decode step, concurrency 1, {args.requests} requests x {args.tokens} tokens ({where})")
    print(f"{'plain':>7s} {'never':>7s}  site")
    for k in sites:
        p, n = rates["plain"].get(k, 0.0), rates["patched-never"].get(k, 0.0)
        if abs(p - n) > 1e-9 or p >= 0.5:
            print(f"{p:7.2f} {n:7.2f}  {k}")
    total = {a: sum(r.values()) for a, r in rates.items()}
    print(f"{total['plain']:7.2f} {total['patched-never']:7.2f}  all sites")
    # Wall time per output token at concurrency 1 (prefills included, census wrappers included in
    # both): with tiny models most of a step is the server's own CPU work.
    ms = {a: 1000 * wall[a] / (args.requests * args.tokens) for a in wall}
    print(f"{ms['plain']:7.2f} {ms['patched-never']:7.2f}  ms per output token "
          f"(patched-never / plain = {ms['patched-never'] / ms['plain']:.2f})")
    if args.out:
        Path(args.out).write_text(json.dumps({"per_step": rates, "ms_per_token": ms}, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
