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
"""

from __future__ import annotations

import csv
import io
import logging
import math
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dynspec.io.atomic import open_append, write_json, write_text
from dynspec.live.config import ConfigError, Level, SweepConfig, bench_serving_problem, check_live, level_name, \
    resolved_yaml, run_id_problem
from dynspec.io.jsonl import read_json
from dynspec.results import ResultsWriter, level_key, make_row, read_rows, summarize
from dynspec.live.server_info import dynspec_state
from dynspec.io.typed_yaml import read_yaml

if TYPE_CHECKING:
    from dynspec.live.servers import ArmServer

log = logging.getLogger("dynspec.live.sweep")

# Settings that change what a row means: a resumed run must keep them.
_MEASUREMENT_KEYS = ("model", "draft_model", "profile", "num_prompts", "input_len", "output_len", "prompts",
                     "warmup_requests", "seed", "burstiness", "max_concurrency", "rate_duration_s", "metrics")
_ARM_KEYS = ("sim_arm", "launch", "env", "api")


class SweepError(RuntimeError):
    """The sweep cannot start (run folder conflict, resume mismatch, bad config for the backend)."""


@dataclass
class RunResult:
    run_dir: Path
    failed: bool
    rows: int


def level_seed(seed: int, level: Level | int, repeat: int) -> int:
    """Prompts (and arrivals) differ per level and repeat (no prefix-cache reuse) but are the same
    for every arm."""
    level = Level(level) if isinstance(level, int) else level
    base = seed * 1_000_003 + level.concurrency * 1009 + repeat
    return base if level.closed else base + 7919 * round(level.rate * 1000) + 104_729


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


def _attach_log(run_dir: Path, progress: bool) -> list[logging.Handler]:
    fh = logging.FileHandler(run_dir / "sweep.log")
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


def _expected_policy(cfg: SweepConfig, arm, backend: str) -> str:
    if backend != "live":
        from dynspec.sim.run import arm_policy_spec

        return arm_policy_spec(arm.sim_arm) or "none"
    if arm.env.get("DYNSPEC_POLICY"):
        return arm.env["DYNSPEC_POLICY"]
    return "always" if arm.speculates else "none"


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
    run, writer, done = _prepare(cfg, backend, run_id, resume, Path(runs_dir), config_path)
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
    except Exception:
        status = "crashed"
        log.exception("sweep crashed; measured rows are kept, continue with --resume --run-id %s",
                      run.info["run_id"])
        raise
    finally:
        sweep.stop_servers()
        run.info["status"] = status
        run.info["finished"] = _now()
        run.info["sessions"][-1].update(finished=_now(), status=status, rows=sweep.rows_written)
        run.save_info()
        log.info("run %s %s: %s", run.info["run_id"], status, run.dir)
        if old_term is not None:
            signal.signal(signal.SIGTERM, old_term)
        for h in handlers:
            log.removeHandler(h)
            h.close()
    return RunResult(run.dir, status != "complete", sweep.total_rows())


class _Sweep:
    def __init__(self, cfg: SweepConfig, backend: str, run: _Run, writer: ResultsWriter, done: set, profile,
                 progress: bool):
        self.cfg, self.backend, self.run, self.writer, self.done = cfg, backend, run, writer, done
        self.profile, self.progress = profile, progress
        # An emulator runs time_scale times faster than its profile: rows are written on the
        # profile's clock (requests scaled before they are summarized), offered rates sent faster.
        self.time_scale = cfg.emulate.time_scale if backend == "emulate" else 1.0
        self.server: ArmServer | None = None  # the server of the arm being measured
        self.servers: dict[str, ArmServer] = {}  # every server up now, by arm name
        self.rows_written = 0
        self.failures = 0
        # Progress: "level k/N" and an ETA from the levels measured so far in this session.
        self.to_measure = sum(1 for a in cfg.arms for lv in cfg.levels() for r in range(cfg.repeats)
                              if (a.name, lv.concurrency, lv.rate, r) not in done)
        self.t0 = time.monotonic()

    # Bookkeeping ---------------------------------------------------------------------------
    def any_failed(self) -> bool:
        return self.failures > 0

    def total_rows(self) -> int:
        return len(read_rows(self.run.dir / "results.csv")[0])

    def ids(self, arm, level: Level, repeat: int, policy: str) -> dict:
        return dict(run_id=self.run.info["run_id"], arm=arm.name, policy=policy, backend=self.backend,
                    profile=self.profile.name if self.profile is not None else "", concurrency=level.concurrency,
                    request_rate=level.rate, repeat=repeat)

    def append(self, arm, level: Level, repeat: int, policy: str, metrics: dict) -> None:
        row = make_row(self.ids(arm, level, repeat, policy), metrics)
        self.writer.append(row)
        self.rows_written += 1
        name, progress = level_name(arm.name, level, repeat), f"[level {self.progress_text()}]"
        if row["error"]:
            self.failures += 1
            log.error("%s: %s %s", name, row["error"], progress)
        else:
            log.info("%s: %.1f output tok/s, %d requests, accept_length %s, spec_step_fraction %s %s", name,
                     row["output_throughput"], row["completed"], _fmt(row["accept_length"]),
                     _fmt(row["spec_step_fraction"]), progress)

    def progress_text(self) -> str:
        """'k/N, ETA m:ss' over the levels this session measures (server starts averaged in)."""
        k, n = self.rows_written, max(self.to_measure, self.rows_written)
        left = (time.monotonic() - self.t0) / k * (n - k) if k else 0.0
        return f"{k}/{n}, ETA {int(left // 60)}:{int(left % 60):02d}"

    def fail_levels(self, arm, levels, error: str) -> None:
        policy = _expected_policy(self.cfg, arm, self.backend)
        for c, r in levels:
            self.append(arm, c, r, policy, {**summarize([], **self.cfg.summary_args()), "completed": 0, "failed": 0,
                                            "error": error})

    # Arms -----------------------------------------------------------------------------------
    def run_arm(self, arm) -> None:
        cfg = self.cfg
        pending = [(lv, r) for lv in cfg.levels() for r in range(cfg.repeats)
                   if (arm.name, lv.concurrency, lv.rate, r) not in self.done]
        if not pending:
            log.info("arm %s: every level already measured", arm.name)
            return
        if self.backend == "sim":
            for lv, r in pending:
                self.sim_level(arm, lv, r)
            return
        if not self.start_server(arm, pending):
            return
        try:
            for i, (lv, r) in enumerate(pending):
                if not self.measure_on(arm, lv, r, pending[i:]):
                    break
        finally:
            self.stop_servers()

    def run_interleaved(self) -> None:
        """Every arm's server up at once; repeat r measures each level on every arm in turn, the
        arms in order when r is even and reversed when odd."""
        cfg = self.cfg
        todo = [(a, lv, r) for r in range(cfg.repeats) for lv in cfg.levels() for a in cfg.arms
                if (a.name, lv.concurrency, lv.rate, r) not in self.done]
        arms = [a for a in cfg.arms if any(t[0] is a for t in todo)]
        if not arms:
            log.info("every level already measured")
            return

        def left(arm) -> list:
            return [(lv, r) for a, lv, r in todo if a is arm]

        # Launched together, then waited for one by one: they start side by side.
        launched = [a for a in arms if self.start_server(a, left(a), wait=False)]
        up = [a for a in launched if self.start_server(a, left(a), launch=False)]
        for r in range(cfg.repeats):
            order = up if r % 2 == 0 else up[::-1]
            for lv in cfg.levels():
                for arm in order:
                    if (arm, lv, r) in todo and arm.name in self.servers:
                        if not self.measure_on(arm, lv, r, left(arm)):
                            self.stop_servers(arm.name)
                        todo.remove((arm, lv, r))

    def measure_on(self, arm, lv: Level, r: int, left: list) -> bool:
        """One level on the arm's running server; False (and the rest of `left` failed) if it has died."""
        self.server = server = self.servers[arm.name]
        if not server.alive():
            self.fail_levels(arm, left, f"server exited with code {server.returncode} before this level")
            return False
        try:
            self.server_level(arm, lv, r)
        except Exception as exc:  # a scrape or a level gone wrong is that level's row, not the sweep's end
            log.exception("%s: failed", level_name(arm.name, lv, r))
            self.fail_levels(arm, [(lv, r)], f"level failed: {type(exc).__name__}: {exc}")
        return True

    def start_server(self, arm, pending: list, *, launch: bool = True, wait: bool = True) -> bool:
        """Launch the arm's server and/or wait until it is healthy.  False when it did not start: then
        its `pending` levels are failed rows and the next arm runs."""
        from dynspec.live.servers import ServerError

        try:
            if launch:
                self._launch(arm)
            if wait:
                self._wait_healthy(self.servers[arm.name])
            return True
        except Exception as exc:  # whatever the server did, this arm fails and the next one runs
            msg = str(exc) if isinstance(exc, ServerError) else f"{type(exc).__name__}: {exc}"
            log.error("arm %s: %s", arm.name, msg)
            self.stop_servers(arm.name)
            self.fail_levels(arm, pending, f"server not started: {msg}")
            return False

    def _launch(self, arm) -> None:
        from dynspec.live.servers import (
            ArmServer,
            emulator_argv,
            fill_placeholders,
            free_port,
        )

        cfg = self.cfg
        taken = {s.port for s in self.servers.values()}
        port = free_port(cfg.host)
        while port in taken:  # servers launched together must not be handed one port twice
            port = free_port(cfg.host)
        if self.backend == "emulate":
            argv = emulator_argv(cfg.profile, arm.sim_arm, cfg.host, port, cfg.emulate.time_scale, cfg.seed)
        else:
            argv = fill_placeholders(arm.launch, {"model": cfg.model or "", "draft_model": cfg.draft_model or "",
                                                  "port": str(port), "host": cfg.host, "python": sys.executable})
        server = ArmServer(arm.name, argv, port=port, host=cfg.host, env=arm.env,
                           log_path=self.run.dir / "logs" / f"{arm.name}.log",
                           startup_timeout=cfg.timeouts.startup_s, shutdown_grace=cfg.timeouts.shutdown_grace_s)
        self.servers[arm.name] = server
        log.info("arm %s: starting %s", arm.name, " ".join(argv))
        entry = {"command": argv, "env": arm.env, "port": port, "started": _now()}
        self.run.info["servers"][arm.name] = entry
        server.start()
        assert server.proc is not None  # start() either started it or raised
        entry["pid"] = server.proc.pid
        self.run.save_info()

    def _wait_healthy(self, server: ArmServer) -> None:
        server.wait_healthy()
        assert server.proc is not None  # healthy: it was started
        entry = self.run.info["servers"][server.name]
        entry["healthy_after_s"] = round(time.monotonic() - server.started_at, 2)  # since its launch
        self.run.save_info()
        log.info("arm %s: healthy after %.1fs (pid %d, port %d)", server.name, entry["healthy_after_s"],
                 server.proc.pid, server.port)

    def stop_servers(self, name: str | None = None) -> None:
        """Stop the named arm's server, or every server up (None)."""
        for n in ([name] if name is not None else list(self.servers)):
            server = self.servers.pop(n, None)
            if server is None:
                continue
            code = server.stop()
            entry = self.run.info["servers"].get(n, {})
            entry.update(stopped=_now(), exit_code=code)
            self.run.save_info()
            log.info("arm %s: server stopped (exit code %s)", n, code)
            if self.server is server:
                self.server = None

    def _measured(self) -> ArmServer:
        """The server of the arm being measured (measure_on sets it)."""
        assert self.server is not None, "no arm is being measured"
        return self.server

    # Levels ---------------------------------------------------------------------------------
    def sim_level(self, arm, lv: Level, r: int) -> None:
        from dynspec.live.bench import write_requests
        from dynspec.sim.run import simulate_level

        cfg = self.cfg
        seed = level_seed(cfg.seed, lv, r)
        lengths = None
        if cfg.prompts.source != "random" or cfg.prompts.output_lens != "fixed":
            # the lengths of the prompts a server would get (text counted as the emulator counts it);
            # acceptance stays the profile's
            from dynspec.live.prompts import build_prompts

            ps = build_prompts(cfg.prompts, cfg.prompts_for(lv), cfg.input_len, cfg.output_len, seed)
            lengths = [(p.tokens, p.output_len) for p in ps]
        metrics, records = simulate_level(self.profile, arm.sim_arm, lv.concurrency, num_prompts=cfg.prompts_for(lv),
                                          input_len=cfg.input_len, output_len=cfg.output_len, seed=seed,
                                          request_rate=lv.rate, burstiness=cfg.burstiness, lengths=lengths,
                                          **cfg.summary_args())
        path = self.run.requests_path(level_name(arm.name, lv, r))
        self.run.keep_old(path)
        write_requests(path, records)
        self.append(arm, lv, r, _expected_policy(cfg, arm, "sim"), metrics)

    def server_level(self, arm, lv: Level, r: int) -> None:
        from dynspec.live.bench import write_requests
        from dynspec.live.servers import level_counters

        cfg, server = self.cfg, self._measured()
        name = level_name(arm.name, lv, r)
        driver = cfg.driver_for(arm, self.backend)
        if driver == "dynspec":
            self.warm_up(arm, lv, r, name)
        before = server.scrape()
        reset = server.reset_accept_counters(before.server_info)
        if driver == "dynspec":
            records, error = self.measure_dynspec(arm, lv, r, name)
            metrics = summarize(records, **cfg.summary_args())
        else:
            metrics, records, error = self.measure_bench_serving(arm, lv, r, name)
        if any(not x.ok for x in records) or error:
            # A dying server closes its sockets before it can be reaped: give it a moment, so that
            # a crash is reported as the crash rather than as the failed requests it caused.
            server.wait_exit(2.0)
        after = server.scrape() if server.alive() else before
        counters = level_counters(before, after, accept_reset=reset)
        if not reset and not math.isnan(counters["accept_length"]):
            log.info("%s: accept_length is the server's average since it started (no counter reset)", name)
        errors = [error]
        if not server.alive():
            errors.insert(0, f"server exited with code {server.returncode} during the level")
        for k, v in counters.items():  # the server's own counters; bench_serving's accept length otherwise
            if not (k == "accept_length" and math.isnan(v)):
                metrics[k] = v
        metrics["error"] = "; ".join(e for e in errors if e)
        path = self.run.requests_path(name)
        self.run.keep_old(path)
        write_requests(path, records)
        write_json(self.run.dir / "scrapes" / f"{name}.json",
                    {"before": before.to_dict(), "after": after.to_dict(), "accept_counters_reset": reset,
                     "driver": driver})
        block = dynspec_state(after.server_info) or {}
        policy = block.get("policy") or _expected_policy(cfg, arm, self.backend)
        self.append(arm, lv, r, policy, metrics)

    def _common(self, arm) -> dict:
        cfg, server = self.cfg, self._measured()
        return dict(api=arm.api, model=cfg.model if self.backend == "live" else None,
                    request_timeout=cfg.timeouts.request_s, should_stop=lambda: not server.alive())

    def warm_up(self, arm, lv: Level, r: int, name: str) -> None:
        """The built-in driver's warm-up: requests from other prompts than the level's, not measured."""
        from dynspec.live.bench import build_prompts, run_level

        cfg = self.cfg
        if not cfg.warmup_requests:
            return
        seed = level_seed(cfg.seed, lv, r) + 7919
        warm = build_prompts(cfg.prompts, cfg.warmup_requests, cfg.input_len, cfg.output_len, seed)
        w = run_level(self._measured().base_url, warm, min(len(warm), lv.concurrency or len(warm)), **self._common(arm),
                      level_timeout=cfg.timeouts.level_s)
        if w.failed:
            log.warning("%s: %d of %d warm-up requests failed (%s)", name, w.failed, len(warm),
                        next(x.error for x in w.requests if not x.ok))

    def measure_dynspec(self, arm, lv: Level, r: int, name: str) -> tuple[list, str]:
        """The built-in generator (dynspec.live.bench): closed loop, or arrivals at the level's rate."""
        from dynspec.sim.arrivals import arrival_times
        from dynspec.live.bench import build_prompts, run_level

        cfg = self.cfg
        seed = level_seed(cfg.seed, lv, r)
        prompts = build_prompts(cfg.prompts, cfg.prompts_for(lv), cfg.input_len, cfg.output_len, seed)
        arrivals = None if lv.closed else \
            [t / self.time_scale for t in arrival_times(len(prompts), lv.rate, cfg.burstiness, seed)]
        result = run_level(self._measured().base_url, prompts, lv.concurrency, **self._common(arm),
                           level_timeout=cfg.timeouts.level_s, progress=self.progress, desc=name, arrivals=arrivals)
        records = result.requests
        if self.time_scale != 1.0:
            records = [x.in_profile_time(self.time_scale) for x in records]
        return records, result.error_summary(cfg.timeouts.level_s)

    def measure_bench_serving(self, arm, lv: Level, r: int, name: str) -> tuple[dict, list, str]:
        """The real `python -m sglang.bench_serving` of the server's environment, one run per level."""
        from dynspec.sglang.bench_serving import DriverError, measure_level

        cfg, server = self.cfg, self._measured()
        try:
            metrics, records = measure_level(cfg, arm, lv, host=server.host, port=server.port,
                                             num_prompts=cfg.prompts_for(lv), seed=level_seed(cfg.seed, lv, r),
                                             level_dir=self.run.dir / "bench_serving", name=name,
                                             timeout=cfg.timeouts.level_s)
        except DriverError as exc:
            return {**summarize([], **cfg.summary_args()), "completed": 0, "failed": 0}, [], str(exc)
        bad = [x for x in records if not x.ok]
        error = f"{len(bad)} of {len(records)} requests failed (first: {bad[0].error})" if bad else ""
        return metrics, records, error


def summary_table(run_dir: Path) -> str:
    """Output tok/s by level (rows) and arm (columns), repeats averaged, failed rows left out."""
    from dynspec.results import read_table

    df = read_table(run_dir / "results.csv")
    df = df[df["error"].fillna("").astype(str) == ""]
    if df.empty:
        return "no level measured without error"
    df["level"] = [f"C={int(c)}" if c else f"{r:g} req/s" for c, r in zip(df["concurrency"], df["request_rate"])]
    t = df.pivot_table(index="level", columns="arm", values="output_throughput", aggfunc="mean", sort=False)
    return "output tok/s\n" + t.round(1).to_string()


def _fmt(x) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3g}"


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
