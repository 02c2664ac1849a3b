"""Arms sharing one patched server in `dynspec sweep --backend live` on real SGLang 0.5.9 (CPU).

configs/cpu-tiny-live.yaml's plain server beside one patched server that runs goodput, never and
always in turn (`shares`): each level runs the policy its arm names, greedy output matches the
plain server's on every arm, and no arm finds the level's prompts cached by the arm before it.
"""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytest.importorskip("torch", reason="requirements/sglang-cpu.txt installs the CPU torch")
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]


def test_policies_take_turns_on_one_real_patched_server(tmp_path):
    from dynspec.live.identity import output_mismatches
    from dynspec.realsglang.tinymodels import make_models

    make_models(tmp_path / "models")
    cfg = yaml.safe_load((REPO / "configs/cpu-tiny-live.yaml").read_text())
    cfg["model"], cfg["draft_model"] = str(tmp_path / "models/target"), str(tmp_path / "models/draft")
    cfg["arms"] = [a for a in cfg["arms"] if a["name"] in ("baseline", "dynspec-goodput")]
    cfg["arms"] += [{"name": "never", "sim_arm": "policy:never", "shares": "dynspec-goodput"},
                    {"name": "always", "sim_arm": "policy:always", "shares": "dynspec-goodput"}]
    cfg.update(schedule="interleaved", input_len=32)
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    out = subprocess.run([sys.executable, "-m", "dynspec", "sweep", "--config", str(tmp_path / "cfg.yaml"),
                          "--run-id", "shared", "--runs-dir", str(tmp_path / "runs"), "--no-progress"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=1200)
    assert out.returncode == 0, out.stderr[-2000:]
    run = tmp_path / "runs/shared"
    rows = list(csv.DictReader((run / "results.csv").open()))
    assert len(rows) == 8 and all(r["error"] == "" and int(r["completed"]) == cfg["num_prompts"] for r in rows)
    pol = {r["arm"]: r["policy"] for r in rows}
    assert pol == {"baseline": "none", "dynspec-goodput": "goodput", "never": "never", "always": "always"}
    frac = {(r["arm"], r["concurrency"]): float(r["spec_step_fraction"]) for r in rows if r["arm"] != "baseline"}
    assert frac[("never", "1")] == frac[("never", "4")] == 0.0
    assert frac[("always", "1")] == frac[("always", "4")] == 1.0
    info = json.loads((run / "run.json").read_text())
    assert set(info["servers"]) == {"baseline", "dynspec-goodput"}

    same = output_mismatches(run).set_index(["arm", "concurrency"])
    for arm in ("dynspec-goodput", "never", "always"):
        assert same.xs(arm)["compared"].sum() == 2 * cfg["num_prompts"]
        assert same.xs(arm)["differ"].sum() == 0

    # The level's prompts went to every arm of the shared server in turn; the flush before each
    # level leaves nothing of them cached (without it, `never` and `always` would find them all).
    for name, levels in (("baseline", 2), ("dynspec-goodput", 6)):
        log = (run / "logs" / f"{name}.log").read_text(errors="replace")
        assert log.count("Cache flushed successfully") == levels
        cached = [int(n) for n in re.findall(r"#cached-token: (\d+)", log)]
        assert len(cached) >= levels and sum(cached) < cfg["input_len"], (name, cached)
