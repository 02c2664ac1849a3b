"""The plain arm's TTFT with fixed and with randomized output lengths (simulated, seed-blackwell).

With fixed output lengths in a closed loop a plain server's requests finish in cohorts and
their successors queue behind one another's prefill; randomized lengths (bench_serving's
--random-range-ratio) break the cohorts.  Prints median TTFT and output tok/s per arm and level.
    .venv/bin/python experiments/generated-machines/ttft_lockstep.py [--range-ratio 0.5]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import yaml

from dynspec.live.config import parse_config
from dynspec.paths import REPO_ROOT
from dynspec.analysis.report import level_table, load_run
from dynspec.live.sweep import run_sweep


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--range-ratio", type=float, default=0.5)
    args = ap.parse_args()
    base = yaml.safe_load((REPO_ROOT / "configs" / "seed-blackwell.yaml").read_text())
    base.update(concurrency=[1, 8, 30, 70],
                arms=[a for a in base["arms"] if a["name"] in ("baseline", "eagle3-v2")])
    runs = Path(tempfile.mkdtemp(prefix="dynspec-ttft-"))
    for name, prompts in (("fixed", {}), ("range", {"output_lens": "range", "range_ratio": args.range_ratio})):
        cfg = parse_config({**base, "name": f"ttft-{name}", **({"prompts": prompts} if prompts else {})})
        res = run_sweep(cfg, backend="sim", run_id=name, runs_dir=runs, progress=False)
        lv = level_table(load_run(res.run_dir).results)
        print(f"\noutput lengths {name}" + (f" (uniform in [{args.range_ratio:g} x 256, 256])" if prompts else " (256)"))
        print(lv.pivot_table(index="concurrency", columns="arm",
                             values=["median_ttft_ms", "output_throughput"]).round(1).to_string())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
