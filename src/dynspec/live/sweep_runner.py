"""What a sweep measures: each arm's server started, its levels measured in turn (or every arm's
servers up at once, interleaved), each level a row of results.csv; a server that will not start or dies
and a level that fails are rows with their error, and the sweep goes on."""

from __future__ import annotations

import logging
import math
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from dynspec.io.atomic import write_json, write_text
from dynspec.io.disk_full import is_disk_full
from dynspec.live.config import Level, SweepConfig, level_name
from dynspec.live.run_folder import _now, _Run
from dynspec.live.server_info import dynspec_state
from dynspec.sglang.policy_control import ENV_POLICY_CONTROL, POLL_INTERVAL_S
from dynspec.sim.lengths import closed_level_seed
from dynspec.results import EMULATOR_LAG_LIMIT, ResultsWriter, make_row, read_rows, summarize

if TYPE_CHECKING:
    from dynspec.live.servers import ArmServer

log = logging.getLogger("dynspec.live.sweep")
WARM_TOKENS = 16  # output tokens of a warm-up burst's requests: every decode shape, few steps


def level_seed(seed: int, level: Level | int, repeat: int) -> int:
    """Prompts (and arrivals) differ per level and repeat (no prefix-cache reuse) but are the same
    for every arm."""
    level = Level(level) if isinstance(level, int) else level
    base = closed_level_seed(seed, level.concurrency, repeat)
    return base if level.closed else base + 7919 * round(level.rate * 1000) + 104_729


def _expected_policy(cfg: SweepConfig, arm, backend: str) -> str:
    if backend != "live":
        from dynspec.sim.run import arm_policy_spec

        return arm_policy_spec(arm.sim_arm) or "none"
    if arm.env.get("DYNSPEC_POLICY"):
        return arm.env["DYNSPEC_POLICY"]
    return "always" if arm.speculates else "none"


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
        self.control_spec: dict[str, str] = {}  # a shared server's policy as last written, by arm name
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
            self.warm_servers([arm], [(arm, lv) for lv, _ in pending])
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
        hosts = [cfg.arm(n) for n in dict.fromkeys(self.host_of(a).name for a in arms)]
        launched = [h for h in hosts if self.start_server(h, left(h), wait=False)]
        up = [h for h in launched if self.start_server(h, left(h), launch=False)]
        for h in hosts:
            if h not in up:  # start_server failed its levels; those of arms sharing it fail with them
                for a in arms:
                    if a is not h and self.host_of(a) is h:
                        self.fail_levels(a, left(a), f"server not started: the server of arm {h.name} did not start")
                todo = [t for t in todo if self.host_of(t[0]) is not h]
        self.warm_servers(up, [(a, lv) for a, lv, _ in todo])
        order_of = [a for a in cfg.arms if self.host_of(a) in up]
        for r in range(cfg.repeats):
            order = order_of if r % 2 == 0 else order_of[::-1]
            for lv in cfg.levels():
                for arm in order:
                    host = self.host_of(arm)
                    if (arm, lv, r) not in todo or host.name not in self.servers:
                        continue
                    if self.measure_on(arm, lv, r, left(arm)):
                        todo.remove((arm, lv, r))
                        continue
                    todo = [t for t in todo if t[0] is not arm]  # measure_on failed them
                    self.stop_servers(host.name)
        for arm, lv, r in todo:  # arms whose shared server died before these levels
            self.fail_levels(arm, [(lv, r)], f"server of arm {self.host_of(arm).name} exited before this level")

    def warm_servers(self, hosts: list, todo: list) -> None:
        """Live (warm_servers): on each server just started, for each concurrency its arms have
        left, one closed-loop burst of that many requests of at most WARM_TOKENS output tokens,
        not measured.  A fresh process compiles kernels for each new batch and prefill shape on
        first use; without this the first level at each concurrency pays for it, and with several
        arms on one server, whichever arm comes first.  A server whose policies take turns
        (DYNSPEC_POLICY_CONTROL) is warmed under `never` and `always`, both modes' shapes, and
        never under an adaptive arm's policy: bursts of short requests in step are not the
        workload, and a policy that learns the workload would carry them into its first levels."""
        cfg = self.cfg
        if self.backend != "live" or not cfg.warm_servers:
            return
        for host in hosts:
            server = self.servers.get(host.name)
            arms: list = []
            for a, _ in todo:
                if self.host_of(a) is host and not any(a is x for x in arms) \
                        and cfg.driver_for(a, self.backend) == "dynspec":
                    arms.append(a)
            if server is None or not server.alive() or not arms:
                continue
            self.server = server
            if server.name in self.control_spec:
                concs = sorted({lv.concurrency for a, lv in todo if any(a is x for x in arms) and lv.concurrency > 0})
                for j, spec in enumerate(("never", "always")):
                    self.set_policy(server.name, spec)
                    for c in concs:
                        self._burst(arms[0], c, j, f"server {server.name}: warmed at C={c} under {spec}")
                continue
            for j, arm in enumerate(arms):
                for c in sorted({lv.concurrency for a, lv in todo if a is arm and lv.concurrency > 0}):
                    self._burst(arm, c, j, f"arm {arm.name}: server warmed at C={c}")
        self.server = None

    def _burst(self, arm, c: int, j: int, what: str) -> None:
        """One warm-up burst of c requests on self.server; j keeps each burst's prompts its own,
        so that on a shared server no burst finds another's prompts cached."""
        from dynspec.live.bench import Prompt, build_prompts, run_level

        cfg, server = self.cfg, self._measured()
        ps = build_prompts(cfg.prompts, c, cfg.input_len, cfg.output_len, cfg.seed + 104729 + c + 7919 * j)
        ps = [Prompt(min(p.output_len, WARM_TOKENS), p.input_ids, p.text) for p in ps]
        w = run_level(server.base_url, ps, c, **self._common(arm), level_timeout=cfg.timeouts.level_s)
        log.info("%s (%d of %d requests answered)", what, len(ps) - w.failed, len(ps))

    def host_of(self, arm):
        """The arm whose server measures `arm`: a shared one live, its own on the emulator."""
        return self.cfg.host_of(arm) if self.backend == "live" else arm

    def measure_on(self, arm, lv: Level, r: int, left: list) -> bool:
        """One level on the arm's running server; False (and the rest of `left` failed) if it has died."""
        self.server = server = self.servers[self.host_of(arm).name]
        if not server.alive():
            self.fail_levels(arm, left, f"server exited with code {server.returncode} before this level")
            return False
        problem = server.health_problem(self.cfg.timeouts.health_s)
        if problem and server.wait_exit(2.0):  # a reset socket is often a server dying: say so
            self.fail_levels(arm, left, f"server exited with code {server.returncode} before this level")
            return False
        if problem:  # hung: each of its levels would wait out every request's timeout
            log.error("arm %s: /health before %s: %s; its remaining levels fail", arm.name,
                      level_name(arm.name, lv, r), problem)
            self.fail_levels(arm, left, f"server not answering /health before this level: {problem}")
            return False
        try:
            if server.name in self.control_spec:
                self.set_policy(server.name, arm.env["DYNSPEC_POLICY"])
            self.server_level(arm, lv, r)
        except Exception as exc:  # a scrape or a level gone wrong is that level's row, not the sweep's end
            if is_disk_full(exc):  # but no row can be written: the sweep stops, in one line
                raise
            log.exception("%s: failed", level_name(arm.name, lv, r))
            self.fail_levels(arm, [(lv, r)], f"level failed: {type(exc).__name__}: {exc}")
        return True

    def control_path(self, host: str) -> Path:
        return self.run.dir / "control" / f"{host}.policy"

    def set_policy(self, host: str, spec: str, *, wait: bool = True) -> None:
        """Write the policy the next level of `host`'s server runs; the server swaps it in at its
        first decode step after one poll interval, so a level that starts later runs it throughout."""
        if self.control_spec.get(host) == spec:
            return
        write_text(self.control_path(host), spec + "\n")
        self.control_spec[host] = spec
        log.info("arm %s: policy %s written to %s", host, spec, self.control_path(host))
        if wait:
            time.sleep(1.2 * POLL_INTERVAL_S)

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
            if is_disk_full(exc):
                raise
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
        env = dict(arm.env)
        if self.backend == "live" and cfg.sharers(arm):  # a server whose policy the sweep sets per level
            env[ENV_POLICY_CONTROL] = str(self.control_path(arm.name))
            self.set_policy(arm.name, arm.env["DYNSPEC_POLICY"], wait=False)
        server = ArmServer(arm.name, argv, port=port, host=cfg.host, env=env,
                           log_path=self.run.dir / "logs" / f"{arm.name}.log",
                           startup_timeout=cfg.timeouts.startup_s, shutdown_grace=cfg.timeouts.shutdown_grace_s)
        self.servers[arm.name] = server
        log.info("arm %s: starting %s", arm.name, " ".join(argv))
        entry = {"command": argv, "env": env, "port": port, "started": _now()}
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
                                          caps=cfg.prompt_caps(),
                                          **cfg.summary_args())
        path = self.run.requests_path(level_name(arm.name, lv, r))
        self.run.keep_old(path)
        write_requests(path, records)
        self.append(arm, lv, r, _expected_policy(cfg, arm, "sim"), metrics)

    def server_level(self, arm, lv: Level, r: int) -> None:
        from dynspec.live.bench import write_requests
        from dynspec.live.servers import emulator_lag, level_counters

        cfg, server = self.cfg, self._measured()
        name = level_name(arm.name, lv, r)
        driver = cfg.driver_for(arm, self.backend)
        if self.backend == "live" and any(a.shares for a in cfg.arms):
            # Arms on one server get the level's prompts in turn: without a flush the later ones
            # would find them cached.  Every server is flushed, so that every arm meets a level alike.
            problem = server.flush_cache()
            if problem and server.wait_exit(2.0):  # refused because it died: say so
                raise RuntimeError(f"server exited with code {server.returncode} before this level")
            if problem:
                raise RuntimeError(f"the prefix cache could not be emptied before the level ({problem})")
        if driver == "dynspec":
            self.warm_up(arm, lv, r, name)
        before = server.scrape()
        reset = server.reset_accept_counters(before.server_info)
        if driver == "dynspec":
            records, error = self.measure_dynspec(arm, lv, r, name)
            metrics = summarize(records, concurrency=lv.concurrency if lv.closed and cfg.prompt_caps() is None
                                else None, **cfg.summary_args())
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
        block = dynspec_state(after.server_info) or {}
        wanted = self.control_spec.get(server.name)
        if wanted is not None and server.alive() and block.get("policy") != wanted:
            errors.append(f"the shared server ran policy {block.get('policy')!r}, not {wanted!r} from its control file")
        # on the rows' clock, as duration_s
        counters["emulator_lag_s"] = (emulator_lag(after) - emulator_lag(before)) * self.time_scale
        for k, v in counters.items():  # the server's own counters; bench_serving's accept length otherwise
            if not (k == "accept_length" and math.isnan(v)):
                metrics[k] = v
        lag, took = metrics["emulator_lag_s"], metrics.get("duration_s", math.nan)
        if lag > EMULATOR_LAG_LIMIT * took:  # the machine could not keep the profile's pace
            log.warning("%s: the emulator fell %.2fs behind its profile (%.1f%% of the level): this level "
                        "measured a slower server than the profile", name, lag, 100 * lag / took)
        metrics["error"] = "; ".join(e for e in errors if e)
        path = self.run.requests_path(name)
        self.run.keep_old(path)
        write_requests(path, records)
        write_json(self.run.dir / "scrapes" / f"{name}.json",
                    {"before": before.to_dict(), "after": after.to_dict(), "accept_counters_reset": reset,
                     "driver": driver})
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
                           level_timeout=cfg.timeouts.level_s, progress=self.progress, desc=name, arrivals=arrivals,
                           caps=cfg.prompt_caps())
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


def _fmt(x) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3g}"
