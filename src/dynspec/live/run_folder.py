"""A sweep's run folder and its bookkeeping: a new folder or one to --resume checked before anything is
written (its config must still mean the same rows), config.yaml and run.json, the rows kept and the
failed ones moved to failures.csv, provenance.json per session."""

from __future__ import annotations

import csv
import io
import os
import time
from pathlib import Path

from dynspec.io.atomic import open_append, write_json, write_text
from dynspec.io.jsonl import read_json
from dynspec.io.typed_yaml import read_yaml
from dynspec.live.config import SweepConfig, resolved_yaml, run_id_problem
from dynspec.results import ResultsWriter, level_key, read_rows

# Settings that change what a row means: a resumed run must keep them.
_MEASUREMENT_KEYS = ("model", "draft_model", "profile", "num_prompts", "input_len", "output_len", "prompts",
                     "warmup_requests", "seed", "burstiness", "max_concurrency", "rate_duration_s", "metrics")
_ARM_KEYS = ("sim_arm", "launch", "env", "api")


class SweepError(RuntimeError):
    """The sweep cannot start (run folder conflict, resume mismatch, bad config for the backend)."""


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


class _Run:
    """The run folder and its bookkeeping files."""

    def __init__(self, run_dir: Path):
        self.dir = run_dir
        self.info: dict = {}

    def save_info(self) -> None:
        write_json(self.dir / "run.json", self.info)

    def requests_path(self, name: str) -> Path:
        return self.dir / "requests" / f"{name}.jsonl"

    def keep_old(self, path: Path) -> None:
        """An earlier attempt's file is renamed, never overwritten."""
        if path.exists():
            k = 1
            while path.with_name(f"{path.stem}.attempt{k}{path.suffix}").exists():
                k += 1
            os.replace(path, path.with_name(f"{path.stem}.attempt{k}{path.suffix}"))


def _compare_for_resume(old: dict, new: dict) -> list[str]:
    diffs = [k for k in _MEASUREMENT_KEYS if old.get(k) != new.get(k)]
    if old.get("emulate") != new.get("emulate"):
        diffs.append("emulate")
    old_arms = {a["name"]: a for a in old.get("arms", [])}
    for i, arm in enumerate(new.get("arms", [])):
        prev = old_arms.get(arm["name"])
        if prev is not None:
            diffs += [f"arms.{i}.{k}" for k in _ARM_KEYS if prev.get(k) != arm.get(k)]
    return diffs


def _prepare(cfg: SweepConfig, backend: str, run_id: str | None, resume: bool, runs_dir: Path,
             config_path) -> tuple[_Run, ResultsWriter, set]:
    if run_id is None:
        if resume:
            raise SweepError("--resume needs the --run-id of the run to continue")
        run_id = f"{cfg.name}-{backend}-{time.strftime('%Y%m%d-%H%M%S')}"
    if run_id_problem(run_id):
        raise SweepError(run_id_problem(run_id))
    run = _Run(runs_dir / run_id)
    new_cfg = cfg.model_dump(mode="json")
    if resume:
        if not (run.dir / "run.json").is_file() or not (run.dir / "config.yaml").is_file():
            raise SweepError(f"{run.dir}: nothing to resume (no run.json/config.yaml there)")
        # Every file the run continues from is checked before anything is written.
        run.info = _read_object(run.dir / "run.json", read_json)
        old_cfg = _read_object(run.dir / "config.yaml", lambda p, e: read_yaml(p, e, "run config"))
        if (run.dir / "results.csv").exists():
            try:
                read_rows(run.dir / "results.csv")
            except ValueError as exc:
                raise SweepError(f"{exc}; repair or move the file, then --resume") from None
        if run.info.get("backend") != backend:
            raise SweepError(f"{run.dir}: was run with backend {run.info.get('backend')}, not {backend}")
        if backend == "emulate" and cfg.emulate.time_scale != 1.0 and run.info.get("clock") != "profile":
            raise SweepError(f"{run.dir}: its rows were measured on the wall clock of an emulator "
                             f"{cfg.emulate.time_scale:g}x faster; new rows are on the profile's clock: start a new run")
        diffs = _compare_for_resume(old_cfg, new_cfg)
        if diffs:
            raise SweepError(f"{run.dir}: the config changed what the measured rows mean "
                             f"({', '.join(diffs)}); start a new run instead of --resume")
    elif run.dir.exists() and any(run.dir.iterdir()):
        raise SweepError(f"{run.dir}: run folder exists; pass --resume to continue it or choose another --run-id")
    _refuse_links(run.dir)
    for sub in ("requests", "scrapes", "logs"):
        (run.dir / sub).mkdir(parents=True, exist_ok=True)
    write_text(run.dir / "config.yaml", resolved_yaml(cfg))

    # drops a half-written last line; a resumed run's older schema is rewritten in this one
    writer = ResultsWriter(run.dir / "results.csv", cfg.result_columns())
    done = _settle_results(run.dir, cfg.result_columns()) if resume else set()
    run.info.update(run_id=run_id, backend=backend, config_name=cfg.name, config_path=str(config_path or ""),
                    profile=cfg.profile if backend != "live" else "", hardware=cfg.hardware,
                    model=cfg.model, draft_model=cfg.draft_model, status="running",
                    # Every time in results.csv is on this clock: the profile's for sim and emulate
                    # (an emulator's time_scale undone), the wall clock for live.
                    clock="wall" if backend == "live" else "profile")
    run.info.setdefault("started", _now())
    run.info.setdefault("sessions", []).append({"started": _now(), "resume": resume, "pid": os.getpid()})
    run.info.setdefault("servers", {})
    run.save_info()
    return run, writer, done


def _write_provenance(run: _Run, cfg: SweepConfig, argv: list[str] | None) -> Path:
    """provenance.json for the session that made the run, provenance.sessionN.json for the N-th (a
    --resume): each session may run other code on another machine, and its record is never rewritten."""
    from dynspec import provenance

    n = len(run.info["sessions"])
    path = provenance.in_folder(run.dir) if n == 1 else run.dir / f"provenance.session{n}.json"
    return provenance.write(path, "sweep", cfg, argv=argv, profile=cfg.profile if cfg.backend != "live" else None)


def _refuse_links(run_dir: Path) -> None:
    """Every write goes into the run folder: a symbolic link in it (or it being one) would send
    a write elsewhere, so the sweep refuses to start."""
    links = [run_dir] if run_dir.is_symlink() else [p for p in run_dir.rglob("*") if p.is_symlink()]
    if links:
        raise SweepError(f"{links[0]}: is a symbolic link; a run folder holds regular files only")


def _read_object(path: Path, read) -> dict:
    data = read(path, SweepError)
    if not isinstance(data, dict):
        raise SweepError(f"{path}: expected a mapping, got {type(data).__name__}; repair or move the file")
    return data


def _settle_results(run_dir: Path, columns: list[str]) -> set:
    """Rows measured cleanly are done; rows with an error move to failures.csv to be measured again."""
    path = run_dir / "results.csv"
    rows = read_rows(path)[0]
    good = [r for r in rows if not r.get("error")]
    bad = [r for r in rows if r.get("error")]
    if bad:
        fail_path = run_dir / "failures.csv"
        new = not fail_path.exists()
        buf = io.StringIO(newline="")
        w = csv.DictWriter(buf, fieldnames=columns, restval="nan", extrasaction="ignore")
        if new:
            w.writeheader()
        w.writerows(bad)
        with open_append(fail_path) as f:
            f.write(buf.getvalue().encode())
            f.flush()
            os.fsync(f.fileno())
        buf = io.StringIO(newline="")
        w = csv.DictWriter(buf, fieldnames=columns, restval="nan", extrasaction="ignore")
        w.writeheader()
        w.writerows(good)
        write_text(path, buf.getvalue())
    return {level_key(r) for r in good}
