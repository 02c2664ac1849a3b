"""An arm's server process: start it, wait until healthy, scrape it, stop it.

The same code runs a real `python -m sglang.launch_server ...` on a GPU node and
`python -m dynspec emulate ...` anywhere.  The server gets its own process group (so
stopping it reaches every worker it forked), its output goes straight into the run
folder's log file (nothing is lost if dynspec itself dies), and on Linux it is told to
receive SIGTERM should dynspec die without stopping it.
"""

from __future__ import annotations

import http.client
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from dynspec.io.atomic import open_append
from dynspec.live.server_info import dynspec_state, server_state

DYNSPEC_COUNTERS = {  # /metrics name -> /get_server_info dynspec key
    "dynspec_steps_speculative_total": "steps_spec",
    "dynspec_steps_plain_total": "steps_plain",
    "dynspec_switches_total": "switches",
}


class ServerError(RuntimeError):
    """The server could not be started, never became healthy, or died."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


_HANDED_OUT: set[int] = set()


def quiet_port(host: str = "127.0.0.1", lo: int = 20000, hi: int = 32000) -> int:
    """A free port below Linux's ephemeral range (32768-60999) that this process has not handed
    out before.  Servers started side by side bind their ports seconds after they are chosen;
    a port from the ephemeral range can be taken meanwhile by an outgoing connection or by
    another server's own "any free port" pick (seen: SGLang's NCCL store port, EADDRINUSE)."""
    import random

    for _ in range(500):
        p = random.randrange(lo, hi)
        if p in _HANDED_OUT:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, p))
            except OSError:
                continue
        _HANDED_OUT.add(p)
        return p
    raise ServerError(f"no free port in {lo}-{hi} on {host}")


def fill_placeholders(argv: list[str], values: dict[str, str]) -> list[str]:
    """Put model paths, host and port into the launch line; every other argument passes untouched."""
    out = []
    for a in argv:
        for k, v in values.items():
            a = a.replace("{" + k + "}", v)
        out.append(a)
    return out


def emulator_argv(profile: str, sim_arm: str, host: str, port: int, time_scale: float, seed: int) -> list[str]:
    return [sys.executable, "-m", "dynspec", "emulate", "--profile", profile, "--arm", sim_arm,
            "--host", host, "--port", str(port), "--time-scale", repr(time_scale), "--seed", str(seed)]


def _die_with_parent() -> None:
    # Runs in the child before exec: SIGTERM it if the sweep process dies (Linux only).
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def _get(url: str, timeout: float) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, b""


_CATEGORY = re.compile(r'category="([^"]*)"')


def parse_prometheus(text: str) -> dict[str, float]:
    """Prometheus text format -> {metric name: value summed over label sets}.

    A series labelled with a `category` (SGLang's GPU time per forward mode, with
    SGLANG_ENABLE_METRICS_DEVICE_TIMER=1) is also kept per category, as `name{category}`."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        try:
            head, value = line.rsplit(None, 1) if "}" not in line else (line[: line.rindex("}") + 1],
                                                                       line[line.rindex("}") + 1:].split()[0])
            v = float(value)
        except (ValueError, IndexError):
            continue
        name = head.split("{", 1)[0].strip()
        out[name] = out.get(name, 0.0) + v
        if (category := _CATEGORY.search(head)) is not None:
            key = f"{name}{{{category.group(1)}}}"
            out[key] = out.get(key, 0.0) + v
    return out


@dataclass
class Snapshot:
    """What the server said about itself at one moment."""

    time: float
    server_info: dict | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    error: str = ""

    @property
    def accept_length(self) -> float:
        value = server_state(self.server_info).get("avg_spec_accept_length")
        return float(value) if value is not None else math.nan

    def counter(self, key: str) -> float:
        """A dynspec counter (steps_spec, steps_plain, switches): server info first, then /metrics."""
        block = dynspec_state(self.server_info)
        if block is not None and block.get(key) is not None:
            return float(block[key])
        for metric, k in DYNSPEC_COUNTERS.items():
            if k == key and metric in self.metrics:
                return self.metrics[metric]
        return math.nan

    @property
    def running(self) -> float:
        return self.metrics.get("sglang:num_running_reqs", math.nan)

    def to_dict(self) -> dict:
        return {"time": self.time, "server_info": self.server_info, "metrics": self.metrics, "error": self.error}


def level_counters(before: Snapshot, after: Snapshot, *, accept_reset: bool) -> dict[str, float]:
    """accept_length, spec_step_fraction and switches of one level, from snapshots around it.

    accept_length is SGLang's avg_spec_accept_length after the level; it covers exactly the
    level when the counters were reset just before it (accept_reset), else everything
    since the server started.  The dynspec counters are cumulative, so their deltas are exact.
    """
    spec = after.counter("steps_spec") - before.counter("steps_spec")
    plain = after.counter("steps_plain") - before.counter("steps_plain")
    total = spec + plain
    fraction = spec / total if total > 0 else math.nan  # NaN also when the server has no counters
    return {
        "accept_length": after.accept_length,
        "spec_step_fraction": fraction,
        "switches": after.counter("switches") - before.counter("switches"),
    }


def emulator_lag(snap: Snapshot) -> float:
    """Wall seconds a dynspec emulator has fallen behind its profile since it started (NaN: not one)."""
    block = (snap.server_info or {}).get("dynspec_emulator")
    lag = block.get("lag_s") if isinstance(block, dict) else None
    return float(lag) if isinstance(lag, (int, float)) else math.nan


class ArmServer:
    """One arm's server process.  Use as a context manager, or start()/stop()."""

    def __init__(self, name: str, argv: list[str], *, port: int, host: str = "127.0.0.1",
                 env: dict[str, str] | None = None, log_path: str | Path,
                 startup_timeout: float = 1800.0, shutdown_grace: float = 30.0):
        if not argv:
            raise ValueError(f"arm {name}: empty command line")
        self.name, self.argv, self.host, self.port = name, list(argv), host, port
        self.env = dict(env or {})
        self.log_path = Path(log_path)
        self.startup_timeout, self.shutdown_grace = startup_timeout, shutdown_grace
        self.proc: subprocess.Popen | None = None
        self.started_at = 0.0  # time.monotonic() at start()
        self.healthy_after: float | None = None  # seconds to healthy, where the starter measures it

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    # Lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open_append(self.log_path)  # a planted link would send the server's output elsewhere
        header = (f"# dynspec: arm {self.name} started {time.strftime('%Y-%m-%dT%H:%M:%S')}\n"
                  f"# dynspec command: {' '.join(self.argv)}\n# dynspec env: {json.dumps(self.env)}\n")
        log.write(header.encode())
        log.flush()
        self.started_at = time.monotonic()
        try:
            self.proc = subprocess.Popen(
                self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**os.environ, **self.env}, start_new_session=True,
                preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)
        except OSError as exc:
            raise ServerError(f"arm {self.name}: cannot start {self.argv[0]!r}: {exc.strerror or exc}") from None
        finally:
            log.close()  # the child holds its own copy

    def wait_exit(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for the process to end; True if it has."""
        if self.proc is None:
            return True
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        return True

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def log_tail(self, lines: int = 5) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return " | ".join(t.strip() for t in text[-lines:] if t.strip() and not t.startswith("# dynspec"))

    def wait_healthy(self) -> float:
        """Poll /health until it answers 200; returns seconds waited.  ServerError if it dies or times out."""
        t0 = time.monotonic()
        while True:
            if not self.alive():
                raise ServerError(f"arm {self.name}: server exited with code {self.returncode} before becoming "
                                  f"healthy (log: {self.log_tail()})")
            try:
                status, _ = _get(self.base_url + "/health", timeout=5)
                if status == 200:
                    return time.monotonic() - t0
            except (OSError, urllib.error.URLError, http.client.HTTPException):  # not up, or not speaking HTTP yet
                pass
            if time.monotonic() - t0 > self.startup_timeout:
                raise ServerError(f"arm {self.name}: not healthy after {self.startup_timeout:g}s")
            time.sleep(0.25)

    def health_problem(self, timeout: float) -> str:
        """'' when /health answers 200 within `timeout` seconds, else what it did instead: a hung
        server (stopped, deadlocked) is found in seconds, not after every request's timeout."""
        try:
            status, _ = _get(self.base_url + "/health", timeout=timeout)
        except (OSError, urllib.error.URLError, http.client.HTTPException) as exc:
            reason = getattr(exc, "reason", exc)
            if isinstance(reason, TimeoutError) or "timed out" in str(reason):
                return f"no answer within {timeout:g}s"
            return f"{type(reason).__name__}: {reason}"
        return "" if status == 200 else f"status {status}"

    def stop(self) -> int | None:
        """SIGTERM to the process group, SIGKILL after the grace period; returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self._signal(signal.SIGTERM)
            self._signal(signal.SIGCONT)  # a stopped server handles its SIGTERM only once resumed
            try:
                self.proc.wait(self.shutdown_grace)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                self.proc.wait()
        # Workers the server forked may outlive it; the group goes with it.
        self._signal(signal.SIGKILL)
        return self.proc.returncode

    def _signal(self, sig: int) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def __enter__(self) -> "ArmServer":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # Scraping ----------------------------------------------------------------------------
    def scrape(self, timeout: float = 10.0) -> Snapshot:
        """/get_server_info and /metrics now; what fails is noted in .error, never raised."""
        snap = Snapshot(time=time.time())
        errors = []
        try:
            status, body = _get(self.base_url + "/get_server_info", timeout)
            info = json.loads(body) if status == 200 else None
            if isinstance(info, dict):
                snap.server_info = info
            elif status == 200:
                errors.append("/get_server_info not a JSON object")
            else:
                errors.append(f"/get_server_info HTTP {status}")
        except (OSError, urllib.error.URLError, http.client.HTTPException, ValueError, RecursionError) as exc:
            errors.append(f"/get_server_info {type(exc).__name__}")
        try:
            status, body = _get(self.base_url + "/metrics", timeout)
            if status == 200:
                snap.metrics = parse_prometheus(body.decode(errors="replace"))
            else:
                errors.append(f"/metrics HTTP {status}")  # SGLang serves it only with --enable-metrics
        except (OSError, urllib.error.URLError, http.client.HTTPException) as exc:
            errors.append(f"/metrics {type(exc).__name__}")
        snap.error = "; ".join(errors)
        return snap

    def flush_cache(self, timeout: float = 10.0, tries: int = 10) -> str:
        """Empty the server's prefix cache (POST /flush_cache); '' when done, else why not.  SGLang
        refuses while requests run (an aborted client's requests may still finish): tried again."""
        problem = ""
        for i in range(tries):
            if i:
                time.sleep(0.5)
            req = urllib.request.Request(self.base_url + "/flush_cache", data=b"", method="POST")
            try:
                with urllib.request.urlopen(req, timeout=timeout):
                    return ""
            except urllib.error.HTTPError as exc:
                problem = f"/flush_cache HTTP {exc.code}"
            except (OSError, http.client.HTTPException) as exc:
                problem = f"/flush_cache {type(exc).__name__}: {exc}"
        return problem

    def reset_accept_counters(self, info: dict | None, timeout: float = 10.0) -> bool:
        """Zero SGLang's accept-length accumulators so avg_spec_accept_length covers one level.

        SGLang resets them whenever /set_internal_state succeeds; setting
        speculative_accept_threshold_single to the value it already has changes nothing else.
        """
        if not info or "speculative_accept_threshold_single" not in info:
            return False
        body = json.dumps({"server_args": {
            "speculative_accept_threshold_single": info["speculative_accept_threshold_single"]}}).encode()
        req = urllib.request.Request(self.base_url + "/set_internal_state", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                reply = json.loads(r.read() or b"null")
        except (OSError, urllib.error.URLError, http.client.HTTPException, ValueError, RecursionError):
            return False
        # SGLang 0.5.9 answers one boolean per data-parallel rank.
        replies = reply if isinstance(reply, list) else [reply]
        return bool(replies) and all(x is True or (isinstance(x, dict) and x.get("updated") is True)
                                     for x in replies)
