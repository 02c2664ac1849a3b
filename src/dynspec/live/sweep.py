"""`dynspec sweep`: every arm x concurrency level x repeat of a config, into one run folder.

    data/runs/<run-id>/
      config.yaml        the resolved config (every default filled in)
      run.json           run id, backend, profile, hardware, sessions, servers, status
      environment.json   GPUs, driver, CUDA, torch/sglang/flashinfer versions
      provenance.json    argv, config, dynspec version, git commit, profile hash (docs/PROVENANCE.md)
      results.csv        one row per (arm, level, repeat), appended + fsynced as each level ends
      requests/<arm>_c<C>_r<R>.jsonl   per-request records of that level
      scrapes/<arm>_c<C>_r<R>.json     /get_server_info and /metrics before and after it
      logs/<arm>.log     the arm's server output
      sweep.log          what happened, failures included
      failures.csv       rows that --resume measured again (an error in them), kept

Backends: live (the arm's launch line), emulate (`dynspec emulate` per arm, started by
the same code), sim (dynspec.sim.run in-process, virtual time).  A server that never gets
healthy or dies, a level that times out, requests that fail: each is a row with its
error, the sweep goes on with the next arm, and the exit status says something failed.

The run folder's checks and bookkeeping are run_folder, the measuring (servers, levels, rows)
sweep_runner.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from dynspec.io.atomic import remove_stale_temps, write_json
from dynspec.io.disk_full import QuietFileHandler, disk_full_error, disk_full_line, save_text_anyway
from dynspec.io.lock import held, lock_file
from dynspec.live.config import ConfigError, SweepConfig, bench_serving_problem, check_live, run_id_problem
from dynspec.live.run_folder import SweepError, _now, _prepare, _write_provenance
from dynspec.live.sweep_runner import _Sweep, level_seed  # noqa: F401  (level_seed re-exported)

log = logging.getLogger("dynspec.live.sweep")


@dataclass
class RunResult:
    run_dir: Path
    failed: bool
    rows: int


def _attach_log(run_dir: Path, progress: bool) -> list[logging.Handler]:
    fh = QuietFileHandler(run_dir / "sweep.log")
    fh.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    handlers: list[logging.Handler] = [fh]
    if progress:
        class _TqdmHandler(logging.Handler):  # log lines that do not break the progress bars
            def emit(self, record):
                from tqdm import tqdm

                tqdm.write(self.format(record), file=sys.stderr)

        th = _TqdmHandler()
        th.setFormatter(logging.Formatter("dynspec sweep: %(message)s"))
        handlers.append(th)
    for h in handlers:
        log.addHandler(h)
    log.setLevel(logging.INFO)
    log.propagate = False
    return handlers


class _Interrupted(KeyboardInterrupt):
    pass


def _on_sigterm(signum, frame):
    raise _Interrupted(f"signal {signum}")


def run_sweep(cfg: SweepConfig, *, backend: str | None = None, run_id: str | None = None, resume: bool = False,
              runs_dir: str | Path = "data/runs", progress: bool = True, config_path=None,
              argv: list[str] | None = None) -> RunResult:
    """Measure every (arm, level, repeat) not yet measured; return where and whether anything failed.
    argv: the command line invoked, for the provenance record (None: called as a library)."""
    backend = backend or cfg.backend
    if backend not in ("live", "sim", "emulate"):
        raise SweepError(f"unknown backend {backend!r} (live, sim, emulate)")
    if backend == "live":
        check_live(cfg, str(config_path or "<config>"))
    if backend != "sim" and any(cfg.driver_for(a, backend) == "bench_serving" for a in cfg.arms):
        problem = bench_serving_problem(cfg)
        if backend == "emulate" and cfg.emulate.time_scale != 1.0:
            problem = (f"emulate.time_scale: the bench_serving driver measures on the wall clock; an emulator "
                       f"{cfg.emulate.time_scale:g}x faster than its profile needs driver dynspec (or time_scale 1)")
        if problem:
            raise ConfigError(f"{config_path or '<config>'}: {problem}")
    profile = None
    if backend != "live":
        from dynspec.sim.profile import load_profile

        profile = load_profile(cfg.profile)  # ProfileError (a ValueError) names the problem
    if cfg.prompts.path is not None:  # a bad prompt file is refused before anything is written
        from dynspec.live.prompts import PromptError, build_prompts

        try:
            build_prompts(cfg.prompts, 1, cfg.input_len, cfg.output_len, cfg.seed)
        except PromptError as exc:
            raise SweepError(str(exc)) from None
    if run_id is None:
        return _measure(cfg, backend, run_id, resume, Path(runs_dir), config_path, profile, progress, argv)
    if run_id_problem(run_id):
        raise SweepError(run_id_problem(run_id))
    # One command per run id: a second --resume would measure the same levels again.
    with held(lock_file("run", Path(runs_dir) / run_id),
              f"run {run_id} is being measured by another dynspec command (pid {{pid}})", SweepError):
        return _measure(cfg, backend, run_id, resume, Path(runs_dir), config_path, profile, progress, argv)


def _measure(cfg: SweepConfig, backend: str, run_id: str | None, resume: bool, runs_dir: Path, config_path,
             profile, progress: bool, argv: list[str] | None) -> RunResult:
    if run_id is not None and resume:  # under the run's lock: no other writer's temporary files
        remove_stale_temps(runs_dir / run_id)
    run, writer, done = _prepare(cfg, backend, run_id, resume, runs_dir, config_path)
    from dynspec.environment import collect_environment

    env_path = run.dir / "environment.json"
    if env_path.exists():  # a resumed run keeps the first session's machine and adds this one's
        env_path = run.dir / f"environment.session{len(run.info['sessions'])}.json"
    write_json(env_path, collect_environment(probe_torch=backend == "live", check_env=backend == "live"))
    _write_provenance(run, cfg.model_copy(update={"backend": backend}), argv)
    handlers = _attach_log(run.dir, progress)
    old_term = None
    if threading.current_thread() is threading.main_thread():
        old_term = signal.signal(signal.SIGTERM, _on_sigterm)
    sweep = _Sweep(cfg, backend, run, writer, done, profile, progress)
    status = "running"
    try:
        log.info("run %s: backend %s, %d arms x %d levels x %d repeats%s; log: %s", run.info["run_id"], backend,
                 len(cfg.arms), len(cfg.levels()), cfg.repeats,
                 f" ({len(done)} already measured)" if resume else "", run.dir / "sweep.log")
        if cfg.schedule == "interleaved" and backend != "sim":
            sweep.run_interleaved()
        else:
            for arm in cfg.arms:
                sweep.run_arm(arm)
        status = "failed" if sweep.any_failed() else "complete"
    except KeyboardInterrupt:
        status = "interrupted"
        log.warning("interrupted; measured rows are kept, continue with --resume --run-id %s", run.info["run_id"])
        raise
    except Exception as exc:
        full = disk_full_error(exc)
        if full is not None:  # one line: every write after it (log, status) would fail the same way
            status = "failed"
            reason = disk_full_line(full)
            run.info["reason"] = reason
            raise SweepError(f"{reason}; measured rows are kept: free some space, then continue with "
                             f"--resume --run-id {run.info['run_id']}") from None
        status = "crashed"
        log.exception("sweep crashed; measured rows are kept, continue with --resume --run-id %s",
                      run.info["run_id"])
        raise
    finally:
        sweep.stop_servers()
        run.info["status"] = status
        run.info["finished"] = _now()
        run.info["sessions"][-1].update(finished=_now(), status=status, rows=sweep.rows_written)
        if "reason" in run.info:
            run.info["sessions"][-1]["reason"] = run.info["reason"]
        save_text_anyway(run.dir / "run.json", json.dumps(run.info, indent=2, default=str) + "\n")
        log.info("run %s %s: %s", run.info["run_id"], status, run.dir)
        if old_term is not None:
            signal.signal(signal.SIGTERM, old_term)
        for h in handlers:
            log.removeHandler(h)
            h.close()
    return RunResult(run.dir, status != "complete", sweep.total_rows())


def summary_table(run_dir: Path) -> str:
    """Output tok/s by level (rows) and arm (columns), repeats averaged, failed rows left out."""
    from dynspec.results import read_table

    df = read_table(run_dir / "results.csv")
    df = df[df["error"].astype(object).fillna("").astype(str) == ""]
    if df.empty:
        return "no level measured without error"
    df["level"] = [f"C={int(c)}" if c else f"{r:g} req/s" for c, r in zip(df["concurrency"], df["request_rate"])]
    t = df.pivot_table(index="level", columns="arm", values="output_throughput", aggfunc="mean", sort=False)
    return "output tok/s\n" + t.round(1).to_string()


# CLI ----------------------------------------------------------------------------------------

def _main(args) -> int:
    from dynspec.live.config import load_config
    from dynspec.sim.profile import ProfileError
    from dynspec.provenance import argv_of

    prog = "dynspec sweep"
    try:
        cfg = load_config(args.config)
        result = run_sweep(cfg, backend=args.backend, run_id=args.run_id, resume=args.resume,
                           runs_dir=args.runs_dir, progress=not args.no_progress, config_path=args.config,
                           argv=argv_of(args))
    except (ConfigError, SweepError, ProfileError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted; continue with --resume --run-id <id> (see sweep.log)", file=sys.stderr)
        return 130
    verdict = "something failed (see results.csv error column and sweep.log)" if result.failed else "complete"
    print(summary_table(result.run_dir))
    print(f"{result.run_dir}: {result.rows} rows, {verdict}")
    print(f"next: dynspec report {result.run_dir}")
    return 1 if result.failed else 0


def add_cli(sub) -> None:
    p = sub.add_parser("sweep", help="measure every arm x concurrency level of a config into data/runs/<run-id>/")
    p.add_argument("--config", required=True, help="sweep config (YAML), e.g. configs/seed-blackwell.yaml")
    p.add_argument("--run-id", help="run folder name (default: <config name>-<backend>-<time>)")
    p.add_argument("--resume", action="store_true",
                   help="continue the run --run-id: skip what is measured, measure failed levels again")
    p.add_argument("--backend", choices=("live", "sim", "emulate"),
                   help="live servers, emulated servers, or in-process simulation (default: the config's)")
    p.add_argument("--runs-dir", default="data/runs", help="where run folders go (default: data/runs)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars or log lines on stderr")
    p.set_defaults(func=_main)
