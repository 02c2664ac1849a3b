"""`dynspec pipeline`'s settings: what one invocation does (PipelineConfig), saved beside the report
as pipeline.yaml with paths relative to the report's folder, and its provenance record."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

import yaml
from pydantic import Field

from dynspec.io.atomic import write_text
from dynspec.live.config import RUN_ID
from dynspec.models import Model

NOTEBOOKS = ("00_environment", "01_patch", "02_sweep", "03_report")
KERNEL = "dynspec"


class PipelineError(RuntimeError):
    """The pipeline cannot start or go on; the message is one line."""


class PipelineConfig(Model):
    """What one pipeline invocation does, every path absolute; saved as pipeline.yaml."""

    config: Path
    backend: Literal["sim", "emulate", "live"] = "sim"
    run_id: str = Field(pattern=f"^{RUN_ID.pattern}$")
    resume: bool = False
    overwrite: bool = False
    runs_dir: Path
    reports_dir: Path
    notebooks_dir: Path
    reference: Path | None
    compare_runs: list[Path] = []
    kernel: str = KERNEL
    cell_timeout_s: float = Field(gt=0)
    apply_patch: bool = False
    patch_dry_run: bool = True
    sglang_path: str | None = None

    @property
    def report_dir(self) -> Path:
        return self.reports_dir / self.run_id

    @property
    def build_dir(self) -> Path:
        """Where a pipeline builds the report; renamed to report_dir once whole, so an interrupted
        run leaves the published report as it was.  A sibling: paths relative to it are the same."""
        return self.reports_dir / f".{self.run_id}.building"

    @property
    def old_dir(self) -> Path:
        """The published report while the new one is renamed into its place."""
        return self.reports_dir / f".{self.run_id}.old"

    @property
    def run_dir(self) -> Path:
        return self.runs_dir / self.run_id

    def parameters(self) -> dict[str, dict]:
        """Each notebook's papermill parameters (JSON-ready: paths as strings)."""
        return {
            "00_environment": {"probe_torch": self.backend == "live"},
            "01_patch": {"apply": self.apply_patch, "dry_run": self.patch_dry_run, "sglang_path": self.sglang_path},
            "02_sweep": {"config": str(self.config), "backend": self.backend, "run_id": self.run_id,
                         "runs_dir": str(self.runs_dir), "resume": self.resume},
            "03_report": {"run_dir": str(self.run_dir), "runs_dir": str(self.runs_dir),
                          "compare_runs": [str(p) for p in self.compare_runs],
                          "reference": str(self.reference) if self.reference else None},
        }


def _abs(p: str | Path) -> Path:
    return Path(p).expanduser().resolve()


_PATHS = ("config", "runs_dir", "reports_dir", "notebooks_dir", "reference")


def settings_data(pc: PipelineConfig) -> dict:
    """The settings as data, paths relative to the report's folder: a published report carries no
    trace of this machine's layout and still says where everything was."""
    data = pc.model_dump(mode="json")

    def rel(p: str) -> str:
        return os.path.relpath(p, pc.report_dir)

    data.update({k: rel(data[k]) for k in _PATHS if data[k] is not None})
    data["compare_runs"] = [rel(p) for p in data["compare_runs"]]
    return data


def settings_from_data(data: dict, report_dir: str | Path) -> PipelineConfig:
    """settings_data's inverse: its relative paths resolved against the report's folder."""
    data = dict(data)

    def at(p: str) -> Path:
        return _abs(Path(report_dir) / p)

    data.update({k: at(data[k]) for k in _PATHS if data.get(k) is not None})
    data["compare_runs"] = [at(p) for p in data.get("compare_runs", [])]
    return PipelineConfig.model_validate(data)


def save_settings(pc: PipelineConfig) -> Path:
    """pipeline.yaml beside the report (settings_data)."""
    out = pc.build_dir / "pipeline.yaml"
    write_text(out, yaml.safe_dump(settings_data(pc), sort_keys=False))
    return out


def load_settings(path: str | Path) -> PipelineConfig:
    """A saved pipeline.yaml, its relative paths resolved against its folder."""
    path = Path(path)
    return settings_from_data(yaml.safe_load(path.read_text()), path.parent)


def save_provenance(pc: PipelineConfig, command: str, argv: list[str] | None) -> Path:
    """provenance.json beside the report: its config is pipeline.yaml's settings (paths relative to
    the report's folder), its profile the one a sim or emulate sweep models."""
    from dynspec import provenance
    from dynspec.live.config import load_config

    profile = None if pc.backend == "live" else load_config(pc.config).profile
    return provenance.write(provenance.in_folder(pc.build_dir), command, settings_data(pc), argv=argv,
                            profile=profile)
