"""The engine on the wall clock: one asyncio task steps it, sleeps out each step (profile
time / time_scale), then publishes the step's tokens to every request's Stream.  Its counters
and what they report: /get_server_info's body and /metrics' Prometheus text.

If the loop falls behind the scaled profile, the virtual clock is re-based to the wall clock
and the delay is counted (lag_s, dynspec_emulator_lag_seconds_total): it never bursts to catch up.
Nothing here speaks HTTP.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time

from pydantic import Field, field_validator

from dynspec.sim.engine import Engine, Request
from dynspec.models import Model
from dynspec.policy import FailSafePolicy, Policy, build_policy
from dynspec.sim.profile import load_profile
from dynspec.sim.run import arm_policy_spec
from dynspec.sglang.policy_control import ENV_POLICY_CONTROL, PolicyControl, Shelf

log = logging.getLogger("dynspec.sim.emulator")

API_VERSION = "0.5.9"  # the SGLang release whose API is emulated
GEN_THROUGHPUT_INTERVAL = 40  # decode steps per gen_throughput sample (SGLang's decode_log_interval)


class EmulatorConfig(Model):
    """What the emulator runs; served at /get_server_info under dynspec_emulator."""

    profile: str
    arm: str
    host: str = "127.0.0.1"
    port: int = Field(30000, ge=0, le=65535)
    time_scale: float = Field(1.0, gt=0, allow_inf_nan=False)  # X: X times faster than the profile
    seed: int = 0
    model_name: str | None = None  # default: the profile's model
    context_length: int = Field(131072, ge=2)
    max_running_requests: int | None = Field(None, ge=1)
    # The draft lengths the server runs (SGLang 0.5.23's candidate steps; the policy picks one per
    # step); None: on/off at the profile's num_steps.
    candidate_steps: list[int] | None = None

    @field_validator("arm")
    @classmethod
    def _arm(cls, arm: str) -> str:
        arm_policy_spec(arm)
        return arm


class Stream:
    """A request's channel from the engine loop to its HTTP handler."""

    __slots__ = ("req", "visible", "finished", "waiter", "rid", "prompt_tokens", "created")

    def __init__(self, rid: str, prompt_tokens: int):
        self.req: Request | None = None
        self.visible = 0  # tokens published so far (at their step's end)
        self.finished = False
        self.waiter: asyncio.Future | None = None
        self.rid = rid
        self.prompt_tokens = prompt_tokens
        self.created = time.time()

    def wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def wait(self) -> None:
        self.waiter = asyncio.get_running_loop().create_future()
        try:
            await self.waiter
        finally:
            self.waiter = None


class Emulator:
    """The engine, its clock and its counters; one per server."""

    def __init__(self, profile, cfg: EmulatorConfig):
        self.profile = profile
        self.cfg = cfg
        self.policy_spec = arm_policy_spec(cfg.arm)
        policy = FailSafePolicy(build_policy(self.policy_spec, load_profile=load_profile), log) if self.policy_spec else None
        self.engine = Engine(profile, policy, seed=cfg.seed, max_running_requests=cfg.max_running_requests,
                             candidate_steps=cfg.candidate_steps)
        self.model_name = cfg.model_name or f"dynspec/{profile.name}"
        self.port = cfg.port  # the bound port once serving (the config may say 0)
        self.scale = cfg.time_scale
        self.t0 = 0.0  # loop time at virtual time 0
        self.lag_s = 0.0
        self.healthy = True
        self.requests_total = 0
        self._work: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._accept_base = (0, 0)  # (spec tokens, request-steps) at the last /set_internal_state
        self._gen_mark = (0, 0.0, 0)  # (tokens, loop time, decode steps) of the last sample
        self.gen_throughput = 0.0
        # DYNSPEC_POLICY_CONTROL, as a patched server honours it: a speculating arm swaps in the
        # file's policy before a step, at most once per poll interval.
        path = os.environ.get(ENV_POLICY_CONTROL, "").strip()
        self._control = PolicyControl(path, log) if path and policy is not None else None
        self._next_poll = 0.0
        self._shelf: Shelf[Policy] = Shelf()  # policies swapped out, by spec
        self.policy_swaps = 0

    # Clock and loop ---------------------------------------------------------------------
    def virtual_now(self) -> float:
        return (asyncio.get_running_loop().time() - self.t0) * self.scale

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.t0 = loop.time()
        self._gen_mark = (0, self.t0, 0)
        self._work = asyncio.Event()
        self._task = asyncio.create_task(self._run(), name="dynspec-engine")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001 - shutting down
                pass

    def submit(self, stream: Stream, input_len: int, output_len: int) -> None:
        eng = self.engine
        if not eng.has_work():
            eng.advance_to(self.virtual_now())  # idle: the next step starts now
        stream.req = eng.submit(input_len, output_len, context=stream)
        self.requests_total += 1
        assert self._work is not None, "submit after start()"
        self._work.set()

    def abort(self, stream: Stream) -> None:
        if stream.req is not None and not stream.finished:
            self.engine.abort(stream.req)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        eng, work = self.engine, self._work
        assert work is not None  # start() makes it before this task
        try:
            while True:
                if self._control is not None and time.monotonic() >= self._next_poll:
                    self._poll_control()
                step = eng.step()
                if step is None:  # nothing waiting or running
                    work.clear()
                    await work.wait()
                    continue
                deadline = self.t0 + step.end / self.scale
                delay = deadline - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                else:
                    if delay < -0.002:  # behind: re-base rather than burst to catch up
                        self.t0 -= delay
                        self.lag_s -= delay
                    await asyncio.sleep(0)  # let the streams write before the next step
                for req in step.emitted:
                    s = req.context
                    s.visible = req.generated
                    if req.finish_time is not None:
                        s.finished = True
                    s.wake()
                if step.kind == "decode" and eng.stats.decode_steps - self._gen_mark[2] >= GEN_THROUGHPUT_INTERVAL:
                    now, (tok0, t0, _) = loop.time(), self._gen_mark
                    if now > t0:
                        self.gen_throughput = (eng.stats.tokens_out - tok0) / (now - t0)
                    self._gen_mark = (eng.stats.tokens_out, now, eng.stats.decode_steps)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - an engine bug: fail loudly, stop serving
            log.exception("dynspec emulator: the engine loop failed")
            self.healthy = False
            for req in list(eng.running) + list(eng.waiting):
                req.context.finished = True
                req.context.wake()

    def _poll_control(self) -> None:
        control = self._control
        assert control is not None and self.policy_spec is not None
        self._next_poll = time.monotonic() + control.interval_s
        spec = control.read()
        if spec is None or spec == self.policy_spec:
            return
        assert self.engine.policy is not None  # a control file is only watched on a speculating arm
        try:
            policy = self._shelf.swap(self.policy_spec, self.engine.policy, spec,
                                      lambda s: FailSafePolicy(build_policy(s, load_profile=load_profile), log))
        except Exception as exc:  # noqa: BLE001 - a bad spec: keep serving, as a server does
            log.warning("dynspec emulator: policy control file %s holds %r, which is not a usable policy "
                        "(%s); policy %s stays", control.path, spec, exc, self.policy_spec)
            return
        log.info("dynspec emulator: policy %s -> %s (from %s)", self.policy_spec, spec, control.path)
        self.engine.policy, self.policy_spec = policy, spec
        self.policy_swaps += 1

    # Reports ----------------------------------------------------------------------------
    def accept_length(self) -> float | None:
        st = self.engine.stats
        tok, steps = st.spec_tokens - self._accept_base[0], st.spec_request_steps - self._accept_base[1]
        return tok / steps if steps else None

    def reset_accept_length(self) -> None:
        st = self.engine.stats
        self._accept_base = (st.spec_tokens, st.spec_request_steps)

    def dynspec_block(self) -> dict:
        st, mode = self.engine.stats, self.engine.mode
        return {"policy": self.policy_spec or "none", "steps_spec": st.steps_spec, "steps_plain": st.steps_plain,
                "switches": st.switches, "mode": "spec" if mode else "plain", "policy_swaps": self.policy_swaps}

    def server_info(self) -> dict:
        cfg, prof, spec = self.cfg, self.profile, self.profile.speculative
        speculative = self.policy_spec is not None
        internal = {"last_gen_throughput": self.gen_throughput,
                    "memory_usage": {"weight": 0.0, "kvcache": 0.0, "token_capacity": cfg.context_length * 64,
                                     "graph": 0.0},
                    "effective_max_running_requests_per_dp": cfg.max_running_requests or 4096}
        if speculative and self.accept_length() is not None:
            internal["avg_spec_accept_length"] = self.accept_length()
        internal["dynspec"] = self.dynspec_block()  # where the patched SGLang reports it
        return {
            "model_path": self.model_name, "tokenizer_path": self.model_name, "served_model_name": self.model_name,
            "host": cfg.host, "port": self.port, "context_length": cfg.context_length,
            "max_running_requests": cfg.max_running_requests, "chunked_prefill_size": prof.prefill.chunk_tokens,
            "stream_interval": 1, "stream_output": False, "skip_tokenizer_init": False,
            "speculative_algorithm": spec.algorithm if speculative else None,
            "speculative_num_steps": spec.num_steps if speculative else None,
            "speculative_eagle_topk": spec.topk if speculative else None,
            "speculative_num_draft_tokens": spec.num_draft_tokens if speculative else None,
            "speculative_accept_threshold_single": 1.0, "speculative_accept_threshold_acc": 1.0,
            "internal_states": [internal],
            "version": API_VERSION,
            "dynspec_emulator": {**cfg.model_dump(), "profile_name": prof.name, "lag_s": self.lag_s,
                                 "steps_extrapolated": self.engine.stats.steps_extrapolated},
        }

    def metrics_text(self) -> str:
        eng, st = self.engine, self.engine.stats
        label = '{model_name="%s"}' % self.model_name.replace("\\", "\\\\").replace('"', '\\"')
        acc = self.accept_length()
        rows = [
            ("sglang:num_running_reqs", "gauge", "The number of running requests.", len(eng.running)),
            ("sglang:num_queue_reqs", "gauge", "The number of requests in the waiting queue.", len(eng.waiting)),
            ("sglang:gen_throughput", "gauge", "The generation throughput (token/s).", self.gen_throughput),
            ("sglang:spec_accept_length", "gauge", "The average acceptance length of speculative decoding.",
             acc if acc is not None else 0.0),
            ("sglang:token_usage", "gauge", "The token usage.", 0.0),
            ("sglang:prompt_tokens_total", "counter", "Number of prefill tokens processed.", st.prompt_tokens),
            ("sglang:generation_tokens_total", "counter", "Number of generation tokens processed.", st.tokens_out),
            ("sglang:num_requests_total", "counter", "Number of requests processed.", self.requests_total),
            ("dynspec_steps_speculative_total", "counter", "Decode steps that speculated.", st.steps_spec),
            ("dynspec_steps_plain_total", "counter", "Decode steps without speculation.", st.steps_plain),
            ("dynspec_switches_total", "counter", "Changes between plain and speculative decode steps.", st.switches),
            ("dynspec_mode", "gauge", "1 while speculating, 0 while decoding plainly.", 1 if eng.mode else 0),
            ("dynspec_steps_prefill_total", "counter", "Prefill steps.", st.steps_prefill),
            ("dynspec_steps_extrapolated_total", "counter",
             "Decode steps whose batch size lies beyond the profile's measured range.", st.steps_extrapolated),
            ("dynspec_requests_aborted_total", "counter", "Requests dropped when their client went away.",
             st.requests_aborted),
            ("dynspec_emulator_lag_seconds_total", "counter",
             "Wall time the emulator fell behind the scaled profile.", self.lag_s),
        ]
        out = []
        for name, kind, doc, value in rows:
            out.append(f"# HELP {name} {doc}\n# TYPE {name} {kind}\n{name}{label} {float(value)!r}\n")
        return "".join(out)
