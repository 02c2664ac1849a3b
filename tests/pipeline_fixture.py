"""The pipeline as a user runs it (`python -m dynspec pipeline`), with papermill executing the
real notebooks, on a tiny simulated config; conftest.py's `pub` runs it once per test session.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

TINY_CONFIG = """\
name: tiny
backend: sim
hardware: CI (simulated)
profile: seed-blackwell
concurrency: [1, 4, 16]
num_prompts: 16
input_len: 128
output_len: 32
arms:
  - {name: baseline, sim_arm: baseline}
  - {name: eagle3, sim_arm: eagle3}
  - {name: dynamic, sim_arm: dynamic}
"""


@dataclass(frozen=True)
class Published:
    root: Path
    config: Path
    runs: Path
    reports: Path
    run_id: str
    proc: subprocess.CompletedProcess

    @property
    def report_dir(self) -> Path:
        return self.reports / self.run_id


def run_pipeline(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dynspec", "pipeline", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def publish(root: Path) -> Published:
    """Run the pipeline on TINY_CONFIG with everything it writes under root."""
    config = root / "tiny.yaml"
    config.write_text(TINY_CONFIG)
    runs, reports = root / "runs", root / "reports"
    proc = run_pipeline("--config", str(config), "--run-id", "ci-tiny", "--runs-dir", str(runs),
                        "--reports-dir", str(reports))
    return Published(root, config, runs, reports, "ci-tiny", proc)
