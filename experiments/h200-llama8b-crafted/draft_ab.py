"""Which part of SGLang 0.5.9's GPU draft path loses acceptance above batch 1.

Upstream EAGLE-3 servers on the crafted models (MODELS, made by
`python -m dynspec.realsglang models MODELS --crafted llama-3.1-8b ...`), all up at once, one
variant each: spec v2 or v1, CUDA graphs on or off, the draft's attention on Triton or torch_native.
Each gets the same greedy requests at concurrency 1, 4 and 8; per request its accept length
(output tokens after the first, per verify).  Writes OUT (JSON) and prints a table.

usage: python experiments/h200-llama8b-crafted/draft_ab.py MODELS OUT.json [--variants a,b]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
from pathlib import Path

from dynspec.realsglang.arms import Arm, greedy, start_arms

BASE = ("--dtype", "bfloat16", "--cuda-graph-max-bs", "8", "--max-running-requests", "8",
        "--mem-fraction-static", "0.85", "--max-total-tokens", "20480")
NO_GRAPHS = ("--disable-cuda-graph",)
V1 = {"SGLANG_ENABLE_SPEC_V2": "0"}
VARIANTS = {
    "v2-graphs": Arm("v2-graphs", args=BASE),
    "v2-no-graphs": Arm("v2-no-graphs", args=BASE + NO_GRAPHS),
    "v1-graphs": Arm("v1-graphs", env=V1, args=BASE),
    "v1-no-graphs": Arm("v1-no-graphs", env=V1, args=BASE + NO_GRAPHS),
    "v2-torch-draft": Arm("v2-torch-draft", args=BASE + NO_GRAPHS + ("--speculative-draft-attention-backend",
                                                                       "torch_native")),
}


def prompts(n: int, seed: int, lo: int, hi: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(lo, hi) for _ in range(rng.randrange(64, 129))] for _ in range(n)]


def accept(meta: dict) -> float:
    return (meta["completion_tokens"] - 1) / max(1, meta.get("spec_verify_ct", 0))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("models", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--lo", type=int, default=1000)
    ap.add_argument("--hi", type=int, default=5096)
    ap.add_argument("--tokens", type=int, default=96)
    a = ap.parse_args()
    arms = [VARIANTS[v] for v in a.variants.split(",")]
    crafted = json.loads((a.models / "crafted.json").read_text()) if (a.models / "crafted.json").exists() else {}
    result: dict = {"crafted": crafted, "variants": {}}
    levels = [(1, 4), (4, 16), (8, 16)]
    with start_arms(arms, a.models, a.out.parent / "draft_ab_logs", gpu=True) as servers:
        for name, server in servers.items():
            rows = {}
            for c, n in levels:
                outs = greedy(server, prompts(n, c, a.lo, a.hi), [a.tokens] * n, c)
                rows[c] = {"accept": [round(accept(o["meta"]), 3) for o in outs],
                           "ids_digest": hash(tuple(tuple(o["ids"]) for o in outs)) & 0xFFFFFFFF}
            result["variants"][name] = rows
            a.out.write_text(json.dumps(result, indent=1))
    print("variant          " + "  ".join(f"C={c}: mean (min..max)" for c, _ in levels))
    for name, rows in result["variants"].items():
        cells = [f"{statistics.mean(r['accept']):.2f} ({min(r['accept']):.2f}..{max(r['accept']):.2f})"
                 for r in rows.values()]
        print(f"{name:16s} " + "   ".join(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
