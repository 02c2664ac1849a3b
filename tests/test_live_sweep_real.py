"""`dynspec sweep --backend live` and `dynspec report` on real SGLang 0.5.9 servers (CPU).

configs/cpu-tiny-live.yaml as a user runs it, cut to one arm pair for CI time: a plain server
and the patched EAGLE-3 server with threshold:2, launched through `python -m dynspec.realsglang
serve` (the stand-ins of docs/REAL_SGLANG.md), at concurrency 1 and 4, plus the same patched
server with its plain step broken (its target KV one slot off), whose greedy outputs must then
differ from the plain server's where it runs plain steps.  Then the report of that run: a report
made from a real SGLang.
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


def dynspec(*args, cwd, timeout):
    return subprocess.run([sys.executable, "-m", "dynspec", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def test_live_sweep_and_report_on_real_servers(tmp_path):
    from dynspec.live.identity import output_mismatches
    from dynspec.realsglang.tinymodels import make_models
    from sglang_mutants import mutant_site

    make_models(tmp_path / "models")
    cfg = yaml.safe_load((REPO / "configs/cpu-tiny-live.yaml").read_text())
    cfg["model"], cfg["draft_model"] = str(tmp_path / "models/target"), str(tmp_path / "models/draft")
    cfg["arms"] = [a for a in cfg["arms"] if a["name"] in ("baseline", "dynspec-threshold")]
    broken = dict(cfg["arms"][1], name="dynspec-broken", description="threshold:2, plain step's KV one slot off")
    site = mutant_site(tmp_path, "mutant-kv-slot")
    broken["launch"] = broken["launch"].replace("serve --patched --", f"serve --patched --site {site} --")
    assert "--site" in broken["launch"]
    cfg["arms"].append(broken)
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))

    out = dynspec("sweep", "--config", str(tmp_path / "cfg.yaml"), "--run-id", "cpu-live",
                  "--runs-dir", str(tmp_path / "runs"), "--no-progress", cwd=tmp_path, timeout=1200)
    assert out.returncode == 0, out.stderr[-2000:]
    run = tmp_path / "runs/cpu-live"
    rows = list(csv.DictReader((run / "results.csv").open()))
    assert {(r["arm"], r["concurrency"]) for r in rows} == {
        (a, c) for a in ("baseline", "dynspec-threshold", "dynspec-broken") for c in ("1", "4")}
    for r in rows:
        assert r["error"] == "" and int(r["completed"]) == cfg["num_prompts"], r
        assert float(r["output_throughput"]) > 0 and r["backend"] == "live"
    thr = {r["concurrency"]: r for r in rows if r["arm"] == "dynspec-threshold"}
    assert float(thr["1"]["spec_step_fraction"]) == 1.0  # batch 1 <= 2: always speculating
    assert 0 < float(thr["4"]["spec_step_fraction"]) < 1  # plain at batch 4, speculating as it drains
    assert float(thr["4"]["switches"]) >= 1
    log = (run / "logs/dynspec-threshold.log").read_text()
    assert "dynspec: policy threshold:2 is live" in log and "dynspec: switch spec -> plain" in log
    info = json.loads((run / "run.json").read_text())
    assert info["status"] == "complete" and info["backend"] == "live"

    # Greedy outputs, prompt by prompt against the plain server's: identical for the patched
    # server; the broken one differs where it ran plain steps (C=4), not where it always
    # speculated (C=1).
    same = output_mismatches(run).set_index(["arm", "concurrency"])
    assert same.loc[("dynspec-threshold", 1), "compared"] == cfg["num_prompts"]
    assert same.loc[("dynspec-threshold", 4), "compared"] == cfg["num_prompts"]
    assert same.xs("dynspec-threshold")["differ"].sum() == 0
    assert same.loc[("dynspec-broken", 1), "differ"] == 0
    assert same.loc[("dynspec-broken", 4), "differ"] > 0

    rep = dynspec("report", str(run), "--reports-dir", str(tmp_path / "reports"), "--no-reference",
                  cwd=REPO, timeout=600)
    assert rep.returncode == 0, rep.stderr[-2000:]
    html = (tmp_path / "reports/cpu-live/report.html").read_text()
    assert "Measured live" in html and "dynspec-threshold" in html
    assert re.search(r"tokens differ from baseline\S*s: dynspec-broken \(\d+ of 12\)\.", html)  # the report says so
    summary = json.loads((tmp_path / "reports/cpu-live/summary.json").read_text())
    assert summary["backend"] == "live" and summary["failed_rows"] == 0
