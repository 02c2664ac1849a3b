"""What a steps=0 decode step costs on real SGLang 0.5.23, per output token, on this CPU (or a GPU: --gpu).

Three servers of the tiny crafted models (dynspec.realsglang.tinymodels), started together and
idle except the one being measured (--sleep-on-idle):

* plain:         no speculation;
* upstream-0:    upstream's adaptive speculation held at steps=0 by its own config (candidate
                 steps [0] below batch 4096, [3] above, so 3 is built but never used): a one-token
                 verify through the verify path, and the draft extend still runs (the default);
* dynspec-off:   the 0.5.23 patch with DYNSPEC_POLICY=never behind the AdaptiveController
                 (candidate steps [0, 3]); since 2026-12-04 its steps=0 is dynspec's own plain
                 step (the target's DECODE forward, a KV-only draft catch-up);
* dynspec-off-verify (--with-verify-off): the same with DYNSPEC_PLAIN_STEP=0, dynspec's off
                 state before 2026-12-04 (upstream's steps=0 chosen by dynspec's policy).

--host-times records each server's host seconds per SGLang function (dynspec.realsglang.hosttime)
into results.json: where a step's time goes, arm by arm.

Rounds run the arms in turn (ABC, then CBA, ...), so drift on the shared machine falls on all.
A round sends N prompts with fixed output lengths at concurrency C; the figure is wall seconds
per output token.  Writes results.json (atomically) beside --out.

    PYTHONPATH=src python experiments/cpu-sglang-0523-steps0/measure.py --out experiments/cpu-sglang-0523-steps0/data

On a GPU (--gpu) the servers take Triton attention and SGLang's torch layer bodies
(dynspec.realsglang.server_env) and share the GPU; scripts/h200_probe_0523.sh runs it there.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from dynspec.io import atomic
from dynspec.realsglang.arms import Arm, generate, server_info, shrinking_prompts, start_arms
from dynspec.live.server_info import dynspec_state

VERSION = "0.5.23"


def arms(cfg_dir: Path, skip_extend: bool = False, verify_off: bool = False,
         host_times: Path | None = None, with_059: bool = False) -> list[Arm]:
    up0, dyn = cfg_dir / "upstream-steps0.json", cfg_dir / "dynspec.json"
    atomic.write_json(up0, {"1": {"candidate_steps": [0]}, "4096": {"candidate_steps": [3]}})
    atomic.write_json(dyn, {"1": {"candidate_steps": [0, 3]}})
    adaptive = ("--speculative-adaptive", "--speculative-adaptive-config")
    out = [Arm("plain", speculative=False, version=VERSION),
           Arm("upstream-0", args=(*adaptive, str(up0)), version=VERSION),
           Arm("dynspec-off", patched=True, policy="never", args=(*adaptive, str(dyn)), version=VERSION)]
    if skip_extend:  # what the one-token verify alone costs: upstream's steps=0 without its draft extend
        out.append(Arm("upstream-0-no-extend", args=(*adaptive, str(up0)), version=VERSION,
                       env={"SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND": "1"}))
    if verify_off:  # dynspec's off state through upstream's one-token verify, as before 2026-12-04
        out.append(Arm("dynspec-off-verify", patched=True, policy="never", args=(*adaptive, str(dyn)),
                       version=VERSION, env={"DYNSPEC_PLAIN_STEP": "0"}))
    if with_059:  # 0.5.9's plain server and its patched server with speculation off, in the same rounds
        out += [Arm("plain-0.5.9", speculative=False), Arm("never-0.5.9", patched=True, policy="never")]
    if host_times is not None:
        out = [dataclasses.replace(a, env={**a.env, "DYNSPEC_HOST_TIMES": str(host_times / a.name)})
               for a in out]
    return out


def _gpu_name() -> str:
    import torch

    return torch.cuda.get_device_name(0)


def host_seconds(folder: Path, decode_tokens: int) -> dict:
    """Per function: calls, and host milliseconds per output token (inclusive) over the run."""
    from dynspec.realsglang import hosttime

    return {name: {"calls": calls, "ms_per_token": 1000.0 * sec / decode_tokens}
            for name, (calls, sec, _) in sorted(hosttime.read(folder).items())}


def one_round(server, prompts, out_len: int, concurrency: int) -> dict:
    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        outs = list(pool.map(lambda p: generate(server.base_url, p, out_len), prompts))
    wall = time.perf_counter() - t0
    tokens = sum(len(o["output_ids"]) for o in outs)
    return {"wall_s": wall, "tokens": tokens, "s_per_token": wall / tokens,
            # drafts accepted: 0 proves steps=0 held (spec_num_proposed_drafts counts the configured steps)
            "accepted": sum(o["meta_info"].get("spec_num_correct_drafts") or 0 for o in outs)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder for results.json, logs and models")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--out-len", type=int, default=64)
    ap.add_argument("--models", help="tiny models made before (default: made under --out)")
    ap.add_argument("--with-skip-extend", action="store_true",
                    help="a fourth arm: upstream steps=0 with SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND=1")
    ap.add_argument("--with-verify-off", action="store_true",
                    help="an arm: dynspec off through upstream's one-token verify (DYNSPEC_PLAIN_STEP=0)")
    ap.add_argument("--with-059", action="store_true",
                    help="two more arms: SGLang 0.5.9's plain server and its patched server with DYNSPEC_POLICY=never "
                         "(their ratio is to the 0.5.9 plain server of the same round)")
    ap.add_argument("--gpu", action="store_true", help="serve on the GPU (Triton attention, torch layer bodies)")
    ap.add_argument("--extra-args", default="", help="more sglang.launch_server arguments for every arm")
    ap.add_argument("--host-times", action="store_true",
                    help="record host seconds per SGLang function in each server (results.json: host_times)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    models = Path(args.models) if args.models else out / "models"
    if not (models / "target").is_dir():
        from dynspec.realsglang.tinymodels import make_models

        make_models(models)
    prompts, _ = shrinking_prompts(8, seed=3)
    rows = []
    ht = out / "host-times" if args.host_times else None
    with start_arms(arms(out, args.with_skip_extend, args.with_verify_off, ht, args.with_059), models, out / "logs",
                    gpu=args.gpu, extra_args=args.extra_args.split()) as servers:
        names = list(servers)
        for c in args.concurrency:
            for name in names:  # warm-up, not counted
                one_round(servers[name], prompts[:c], 8, c)
            for r in range(args.rounds):
                order = names if r % 2 == 0 else names[::-1]
                for name in order:
                    row = {"arm": name, "concurrency": c, "round": r,
                           **one_round(servers[name], prompts[:c] * (2 if c == 1 else 1), args.out_len, c)}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
        info = {n: dynspec_state(server_info(s)) for n, s in servers.items()}
        if ht is not None:
            time.sleep(2.0)  # the servers write their host times about once a second
    summary = {}
    for c in args.concurrency:
        med = {n: statistics.median(r["s_per_token"] for r in rows if r["arm"] == n and r["concurrency"] == c)
               for n in names}
        # per round ratios to the plain server of the same round
        def base(n: str) -> str:
            return "plain-0.5.9" if n.endswith("-0.5.9") else "plain"

        ratios = {n: sorted(next(r["s_per_token"] for r in rows if r["arm"] == n and r["concurrency"] == c
                                 and r["round"] == k) /
                            next(r["s_per_token"] for r in rows if r["arm"] == base(n) and r["concurrency"] == c
                                 and r["round"] == k) for k in range(args.rounds))
                  for n in names if n != base(n)}
        summary[c] = {"median_s_per_token": med,
                      "ratio_to_plain_median": {n: statistics.median(v) for n, v in ratios.items()},
                      "ratio_to_plain_range": {n: [v[0], v[-1]] for n, v in ratios.items()}}
    where = "a GPU (" + _gpu_name() + "), Triton attention, SGLang's torch layer bodies" if args.gpu else \
        "this project's 2-core CPU (shared)"
    result = {"kind": f"measured on {where}, real SGLang 0.5.23"
                      + (" and 0.5.9" if args.with_059 else "") + ", tiny crafted models",
              "command": " ".join(sys.argv), "out_len": args.out_len, "rounds": args.rounds,
              "summary": summary, "rows": rows, "dynspec": info}
    if ht is not None:  # warm-up rounds and prefills included: read per call, or as shares
        result["host_times"] = {n: host_seconds(ht / n, sum(r["tokens"] for r in rows if r["arm"] == n))
                                for n in names}
    atomic.write_json(out / "results.json", result)
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
