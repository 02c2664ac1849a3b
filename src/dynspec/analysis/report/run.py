"""Loading a run for the report: its folder (results, run.json, config, environment), the latest
run of a folder, and the seed's reference measurements.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import yaml

from dynspec.paths import REPO_ROOT
from dynspec.results import DEFAULT_PERCENTILES, METRIC_COLUMNS, read_table, wall_clock_problem


SEED_LABEL = "measured by the seed investigation on 8x RTX PRO 6000 Blackwell, TP 8"


REFERENCE_COLUMNS = ["arm", "concurrency", "output_throughput", "approximate", "level", "source"]


# Where the seed's table lives in a checkout (data/ is not package data).
DEFAULT_REFERENCE = REPO_ROOT / "data" / "reference" / "seed.csv"


_EXTRA_PCT = re.compile(r"p[0-9.]+_(ttft|tpot|itl|e2e)_ms")


EXPERIMENTS_DIR = REPO_ROOT / "experiments"  # in a checkout of the repo: experiments/<study>/data/<run>/


class ReportError(ValueError):
    """A run or reference that cannot be reported on; the message is one line naming it."""


@dataclass
class Run:
    """One run folder as the report sees it."""

    run_dir: Path
    run_id: str
    results: pd.DataFrame
    meta: dict = field(default_factory=dict)  # run.json
    config: dict = field(default_factory=dict)  # config.yaml (resolved)
    environment: dict = field(default_factory=dict)  # environment.json

    @property
    def backend(self) -> str:
        return _one(self.results, "backend") or str(self.meta.get("backend", ""))

    @property
    def profile(self) -> str:
        return _one(self.results, "profile") or str(self.meta.get("profile") or self.config.get("profile", ""))

    @property
    def hardware(self) -> str:
        return str(self.meta.get("hardware") or self.config.get("hardware") or "")

    @property
    def config_name(self) -> str:
        return str(self.meta.get("config") or self.config.get("name") or "")


def _one(df: pd.DataFrame, col: str) -> str:
    vals = sorted({str(v) for v in df[col].dropna() if str(v)}) if col in df else []
    return ", ".join(vals)


def numeric_metrics(df: pd.DataFrame) -> pd.DataFrame:
    """Metric columns as floats whatever the file held (a column with no value at all reads as text)."""
    df = df.copy()
    for col in METRIC_COLUMNS + [c for c in df.columns if _EXTRA_PCT.fullmatch(str(c))]:
        if col != "error" and col in df:
            df[col] = pd.to_numeric(df[col], errors="coerce")
    return df


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ReportError(f"{path}: not valid JSON ({exc.msg}, line {exc.lineno})") from None
    return data if isinstance(data, dict) else {}


def load_run(run_dir: str | Path) -> Run:
    """Read data/runs/<run-id>/: results.csv (required), run.json, config.yaml, environment.json."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ReportError(f"{run_dir}: no such run folder")
    results_path = run_dir / "results.csv"
    if not results_path.is_file():
        raise ReportError(f"{run_dir}: no results.csv (did the sweep start?)")
    try:
        df = read_table(results_path)
    except (ValueError, pd.errors.ParserError) as exc:
        raise ReportError(f"{results_path}: {exc}") from None
    if df.empty:
        raise ReportError(f"{results_path}: no rows yet")
    df = numeric_metrics(df)
    meta = _read_json(run_dir / "run.json")
    config: dict = {}
    if (run_dir / "config.yaml").is_file():
        loaded = yaml.safe_load((run_dir / "config.yaml").read_text())
        config = loaded if isinstance(loaded, dict) else {}
    run_id = str(meta.get("run_id") or _one(df, "run_id") or run_dir.name)
    return Run(run_dir, run_id, df, meta, config, _read_json(run_dir / "environment.json"))


MAKE_REPORT_RUNS = "build/runs"  # where `make report` puts its run (Makefile)


def _repo_root() -> Path:  # read at call time: tests move the checkout
    from dynspec import paths

    return paths.REPO_ROOT


def list_runs(runs_dir: str | Path) -> list[Path]:
    """Run folders that hold a results file, oldest first (by modification time)."""
    runs_dir = Path(runs_dir)
    if not runs_dir.is_dir():
        return []
    runs = [p for p in runs_dir.iterdir() if p.is_dir() and (p / "results.csv").is_file()]
    return sorted(runs, key=lambda p: ((p / "results.csv").stat().st_mtime, p.name))


def latest_run(runs_dir: str | Path) -> Path | None:
    runs = list_runs(runs_dir)
    return runs[-1] if runs else None


def open_run(run_dir: str | Path | None, *, runs_dir: str | Path = "data/runs") -> Run:
    """The run to report on: run_dir, else the latest in runs_dir; with none in the checkout's
    data/runs, the latest `make report` left in build/runs.

    A report only reads runs: with none yet, the sweep (`02_sweep`, `dynspec sweep`) makes one.
    """
    if run_dir is not None:
        return load_run(run_dir)
    latest = latest_run(runs_dir)
    if latest is None and Path(runs_dir).resolve() == (_repo_root() / "data" / "runs").resolve():
        latest = latest_run(_repo_root() / MAKE_REPORT_RUNS)
    if latest is None:
        raise ReportError(f"{runs_dir}: no runs yet (run a sweep first: notebooks/02_sweep or `dynspec sweep`)")
    return load_run(latest)


def run_percentiles(run: "Run") -> list[float]:
    """The percentiles the run's config asked for (the default four for runs before they could)."""
    ps = (run.config.get("metrics") or {}).get("percentiles") if isinstance(run.config, dict) else None
    return [float(p) for p in ps] if isinstance(ps, list) and ps else list(DEFAULT_PERCENTILES)


def run_slo(run: "Run") -> dict:
    """The run's SLOs in ms ({"ttft_ms": ..}); empty when it gave none."""
    slo = (run.config.get("metrics") or {}).get("slo") if isinstance(run.config, dict) else None
    return {k: v for k, v in slo.items() if v is not None} if isinstance(slo, dict) else {}


def load_reference(path: str | Path | None = None) -> pd.DataFrame:
    """The seed's measured table (data/reference/seed.csv), validated."""
    path = Path(path) if path is not None else DEFAULT_REFERENCE
    if not path.is_file():
        raise ReportError(f"{path}: no such reference table")
    df = pd.read_csv(path)
    missing = [c for c in REFERENCE_COLUMNS if c not in df.columns]
    if missing:
        raise ReportError(f"{path}: missing reference columns: {', '.join(missing)}")
    thr = pd.to_numeric(df["output_throughput"], errors="coerce")
    conc = pd.to_numeric(df["concurrency"], errors="coerce")
    if thr.isna().any() or (thr <= 0).any() or conc.isna().any() or (conc < 1).any():
        raise ReportError(f"{path}: concurrency and output_throughput must be positive numbers")
    df["output_throughput"], df["concurrency"] = thr.astype(float), conc.astype(int)
    df["approximate"] = df["approximate"].astype(str).str.lower().isin(["true", "1", "yes"])
    return df[REFERENCE_COLUMNS]


def reference_for(run: Run, reference: pd.DataFrame | None) -> pd.DataFrame | None:
    """The seed's measurements, only beside a run of (a model of) the seed's node in the seed's
    time: an emulated run at another time scale, or another machine, gets none."""
    if reference is None or not len(reference):
        return None
    if not run.profile.startswith("seed-blackwell") and "RTX PRO 6000" not in run.hardware:
        return None
    if wall_clock_problem(run.run_dir):  # an old emulated run, X times faster than the seed
        return None
    return reference


def measured_runs(experiments_dir: Path = EXPERIMENTS_DIR) -> list[tuple[str, str]]:
    """(run id, hardware) of every live run committed under experiments/<study>/data/: where the
    patched server has really run, read from the runs themselves."""
    out = []
    for meta in sorted(experiments_dir.glob("*/data/*/run.json")) if experiments_dir.is_dir() else []:
        m = _read_json(meta)
        if m.get("backend") == "live":
            out.append((str(m.get("run_id") or meta.parent.name), str(m.get("hardware") or "?")))
    return out
