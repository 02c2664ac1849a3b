"""The runtime side of the dynspec patch: what a patched SGLang imports.

The patched EAGLEWorkerV2 calls `load_controller()` once per TP rank at start-up.
With DYNSPEC_POLICY unset it returns None and the patched server takes SGLang's
original code path on every step.  Otherwise it returns a `Controller` that

* asks the policy (wrapped in FailSafePolicy) before every decode step (`decide`),
* learns from the accepted-token counts the scheduler already has on the CPU
  (`observe`, called from scheduler_output_processor_mixin: no extra GPU sync),
* counts steps and switches, logs one line per switch, and reports `stats()`,
  which the patched scheduler merges into /get_server_info (key "dynspec") and,
  with --enable-metrics, exports as Prometheus series on /metrics.

Imports: the standard library and dynspec.policy only (dynspec.sim.profile, and with
it pydantic and yaml, only when DYNSPEC_PROFILE is set).  Never raises out of
`load_controller`: a missing or broken configuration logs one warning and the
server speculates as configured.

Tensor parallelism: every rank runs its own Controller and all must decide alike; how
they agree (at start, on plain-step CUDA graphs, while running) is in
dynspec.sglang.tp_agreement.  The step trace is dynspec.sglang.step_trace, the
Prometheus series dynspec.sglang.metrics.

What the 0.5.9 patch calls, on every TP rank, in `EAGLEWorkerV2.__init__`:

    min_sync = _dynspec_tp_min(worker) if tp_size > 1 else None  # all_reduce(op=MIN), cpu group
    try:
        from dynspec.sglang.hook import load_controller, plain_cuda_graph_enabled
    except Exception:
        if min_sync is not None:
            min_sync([0.0])  # join the start agreement: dynspec off on every rank
        return
    ctl = load_controller(tp_rank=tp_rank, tp_size=tp_size, min_sync=min_sync,
                          sync_factory=lambda: _dynspec_tp_sync(worker), ...)
    if ctl is None:
        return  # None on every rank
    graphs = _dynspec_capture_plain_graphs(worker) if want_graphs else None
    worker._dynspec_graphs = graphs if ctl.agree_plain_graphs(graphs is not None) else None

Environment:
    DYNSPEC_POLICY   policy spec (dynspec.policy.build_policy), e.g. goodput,
                     threshold:32, table:1-63=on,64-=off.  Unset or empty: inert.
    DYNSPEC_PROFILE  optional step-cost profile (shipped name or YAML path) that
                     seeds the goodput policy.
    DYNSPEC_PLAIN_CUDA_GRAPH  1 (default) capture CUDA graphs for plain steps;
                     0 run plain steps eagerly (read by the patch, see docs).
    DYNSPEC_STEP_TRACE  optional file: one line per result the scheduler processed
                     (StepTrace), to see where a server's wall time goes.
    DYNSPEC_POLICY_CONTROL  optional file holding a policy spec; writing another spec into
                     it swaps the running server's policy between steps (checked at most
                     every 0.25 s; dynspec.sglang.policy_control).  One TP rank only.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Callable, Mapping, Sequence

from dynspec.policy import FailSafePolicy, Policy, PolicySpecError, StepCost, StepRecord, SyncHook, build_policy
from dynspec.sglang.metrics import PromExporter
from dynspec.sglang.policy_control import ENV_POLICY_CONTROL, PolicyControl, Shelf
from dynspec.sglang.step_trace import ENV_STEP_TRACE, StepTrace
from dynspec.sglang.tp_agreement import MinSyncHook, TPAgreement, agree_start, warn_rank0

ENV_POLICY = "DYNSPEC_POLICY"
ENV_PROFILE = "DYNSPEC_PROFILE"
ENV_PLAIN_GRAPH = "DYNSPEC_PLAIN_CUDA_GRAPH"
ENV_CATCH_UP_WINDOW = "DYNSPEC_CATCHUP_WINDOW"
# 32: at batch 1 a pass costs about 0.15 ms on an H200 (Llama-3.1-8B head, mostly reading the
# fc and K/V weights; experiments/h200-real-sglang/data/h200-census), so 8 steps per pass left 0.019 ms on every
# plain step; 32 leaves about a quarter of that.  The ring caps rows at 1024 (window x batch).
DEFAULT_CATCH_UP_WINDOW = 32

_log = logging.getLogger("dynspec.sglang.hook")

# Decisions the interval between two results can hold under SGLang's overlap scheduler: the
# step before, the step itself, and the one launched before its result is read.
OVERLAP_WINDOW = 3

# A step interval longer than this is a pause (no traffic), not a step time.
MAX_STEP_TIME_S = 10.0


def plain_cuda_graph_enabled(env: Mapping[str, str] | None = None) -> bool:
    """Whether plain steps should use their own CUDA graphs (DYNSPEC_PLAIN_CUDA_GRAPH)."""
    env = os.environ if env is None else env
    return env.get(ENV_PLAIN_GRAPH, "1").strip().lower() not in ("0", "false", "no", "off")


def catch_up_window(env: Mapping[str, str] | None = None, log=None) -> int:
    """How many plain steps the draft's KV-only catch-up batches into one pass
    (DYNSPEC_CATCHUP_WINDOW, 1..64; 1 writes every step).  A bad value logs one line and
    takes the default: the knob tunes cost, never correctness."""
    env = os.environ if env is None else env
    raw = env.get(ENV_CATCH_UP_WINDOW, "").strip()
    if not raw:
        return DEFAULT_CATCH_UP_WINDOW
    try:
        window = int(raw)
        if not 1 <= window <= 64:
            raise ValueError
    except ValueError:
        if log is not None:
            log.warning(f"dynspec: {ENV_CATCH_UP_WINDOW}={raw!r} is not an integer in 1..64; "
                        f"using {DEFAULT_CATCH_UP_WINDOW}")
        return DEFAULT_CATCH_UP_WINDOW
    return window


def _output_budgets(reqs: Sequence) -> list[int] | None:
    """What each request may still generate (SGLang's Req: sampling_params.max_new_tokens less its
    output_ids); None when a request does not say."""
    out = []
    for r in reqs:
        cap = getattr(getattr(r, "sampling_params", None), "max_new_tokens", None)
        done = getattr(r, "output_ids", None)
        if not isinstance(cap, int) or done is None:
            return None
        out.append(cap - len(done))
    return out


def _request_ids(reqs: Sequence, up_to: int | None = None) -> list | None:
    """The requests' rids (when there are at most up_to of them); None otherwise, or when a
    request has none (the policy's population estimate stands: the server must not fail here)."""
    try:
        return [r.rid for r in reqs] if 0 < len(reqs) and (up_to is None or len(reqs) <= up_to) else None
    except Exception:  # noqa: BLE001 - a batch of objects without rid
        return None


class Controller(TPAgreement):
    """One TP rank's view of the policy: decisions, counters, switch log, stats.

    Every input to a decision is rank-identical (batch size, accepted-token counts,
    the step counter, a profile, and step times only after `sync` agreed on them),
    so every rank switches at the same step.  With more than one rank and a `sync`
    hook the controller runs the agreements itself, on a schedule that depends only
    on the step stream (`SyncSchedule`), so a rank whose policy failed still joins
    them; each carries the policy's values, a "failed" flag and a checksum of the
    decision state, and if any rank failed or the checksums differ every rank falls
    back to speculating as configured at the same step (those agreements: TPAgreement,
    dynspec.sglang.tp_agreement).
    """

    def __init__(
        self,
        policy: Policy,
        *,
        spec: str,
        tp_rank: int = 0,
        tp_size: int = 1,
        sync: SyncHook | None = None,
        min_sync: MinSyncHook | None = None,
        logger: logging.Logger | None = None,
        profile_name: str | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ):
        self.policy = policy if isinstance(policy, FailSafePolicy) else FailSafePolicy(policy, logger or _log)
        self.spec = spec
        self.tp_rank = tp_rank
        self.tp_size = tp_size
        self.min_sync = min_sync
        self.profile_name = profile_name
        self.log = logger or _log
        self._clock = clock
        self.plain_step_kind = "eager"  # set by agree_plain_graphs: "cuda_graph" or "eager"
        # Set when the ranks agreed to stop deciding (a policy failed somewhere, or their
        # decision states differ): every rank speculates as configured from then on.
        self.fallback: str | None = None
        self._use_sync(sync)

        self.step = 0  # decode steps decided
        self.steps_spec = 0
        self.steps_plain = 0
        self.switches = 0
        self.forced_spec = 0  # policy said plain, the batch could not run plain
        self.resumes = 0  # full draft forwards that restarted the draft after a plain stretch
        self.kv_only_prefills = 0  # prefills in a plain stretch: the draft wrote its KV only
        self.steps_with_requests = 0  # decisions told which requests the step runs (per-request acceptance)
        self.budgets_told = 0  # decisions told their requests' output budgets (a first wave's lockstep)
        self.prefills = 0  # prefill (extend) results the policy was told of (note_prefill)
        self.prompts_prefilled = 0  # requests whose prompts those finished
        self.idle_prefills = 0  # of those, launched on a server with nothing decoding (not priced)
        self.mode = "spec"  # the server starts speculating, as configured
        self.last_switch: dict | None = None
        self._spec_steps_observed = 0
        self._accepted_sum = 0
        self._accepted_n = 0
        # Draft lengths the server can run (set_candidate_steps; empty: one count, decide only)
        # and the steps run at each (decide_steps).
        self.candidate_steps: tuple[int, ...] = ()
        self.on_steps = 0
        self.steps_by_k: dict[int, int] = {}
        self.accepted_by_k: dict[int, list[int]] = {}  # K -> [drafts accepted, request-steps] (observe)

        self._last_obs_t: float | None = None
        self._other_launched: float | None = None  # when note_other_forward last came
        self._dirty = False  # a prefill was launched since the last decode result
        self._gap = False  # the next result's step was launched after the last result (note_gap)
        self._lock = threading.Lock()  # stats() may be read from another thread
        self._prom: PromExporter | None = None
        self.trace: StepTrace | None = None  # DYNSPEC_STEP_TRACE (load_controller)
        # DYNSPEC_POLICY_CONTROL (enable_control): None keeps decide() to one attribute test.
        self._control: PolicyControl | None = None
        self._make_policy: Callable[[str], Policy] | None = None
        self._poll_clock: Callable[[], float] = time.monotonic
        self._next_poll = 0.0
        self.policy_swaps = 0
        self._shelf: Shelf[FailSafePolicy] = Shelf()  # policies swapped out, by spec

    # --- before a step ------------------------------------------------------------
    def decide(self, batch_size: int, can_plain: bool = True, reqs: Sequence | None = None) -> bool:
        """True: speculate this step.  Call exactly once per non-idle decode step.  reqs: the
        step's requests (objects with a .rid, as SGLang's Req), for a policy that tracks them."""
        pol = self._before_decision(reqs)
        want = True if self.fallback else pol.decide(batch_size)
        spec = want or not can_plain
        if not want and not can_plain:
            self.forced_spec += 1
        self._count_step(spec, batch_size)
        return spec

    def _before_decision(self, reqs: Sequence | None) -> FailSafePolicy:
        """What decide and decide_steps do first: a due look at the control file, then the
        step's requests for a policy that tracks them.  The policy in force, after any swap."""
        if self._control is not None and self._poll_clock() >= self._next_poll:
            self._poll_control()
        pol = self.policy
        if reqs is not None and pol.wants_budgets and not self.fallback:
            budgets = _output_budgets(reqs)
            if budgets is not None:
                pol.note_budgets(budgets)
                self.budgets_told += 1
        if reqs is not None and pol.requests_up_to and not self.fallback:
            ids = _request_ids(reqs, pol.requests_up_to)
            pol.set_batch(ids)
            self.steps_with_requests += ids is not None
        return pol

    def set_candidate_steps(self, steps: Sequence[int], on_steps: int) -> None:
        """The server runs any of `steps` draft steps (SGLang 0.5.23's states), `on_steps` as
        configured: the policy is told once, and decide_steps answers among them."""
        self.policy.set_candidate_steps(steps, on_steps)
        self.candidate_steps, self.on_steps = tuple(self.policy.candidate_steps), self.policy.on_steps

    def decide_steps(self, batch_size: int, can_plain: bool = True, reqs: Sequence | None = None) -> int:
        """Draft steps for this step, one of the candidates (set_candidate_steps first): the
        policy's decide_steps; after a fallback the server's own count."""
        pol = self._before_decision(reqs)
        k = self.on_steps if self.fallback else pol.decide_steps(batch_size)
        if not k and not can_plain:
            self.forced_spec += 1
            k = self.on_steps
        self.steps_by_k[k] = self.steps_by_k.get(k, 0) + 1
        self._count_step(k > 0, batch_size)
        return k

    def _count_step(self, spec: bool, batch_size: int) -> None:
        self.step += 1
        if spec:
            self.steps_spec += 1
        else:
            self.steps_plain += 1
        mode = "spec" if spec else "plain"
        if self.trace is not None:
            self.trace.add("s" if spec else "p", batch_size, 0)
        if mode != self.mode:
            self._switch(mode, batch_size)
        if self._prom is not None:
            self._prom.step(spec, self.switches)

    def _switch(self, mode: str, batch_size: int) -> None:
        old = self.mode
        self.mode = mode
        self.switches += 1
        reason = self.fallback or self.policy.reason(batch_size)
        with self._lock:
            self.last_switch = {
                "step": self.step,
                "batch_size": batch_size,
                "from": old,
                "to": mode,
                "reason": reason,
                "time": time.time(),
            }
        if self.tp_rank == 0:
            self.log.info(
                "dynspec: switch %s -> %s at step %d, batch size %d: %s",
                old, mode, self.step, batch_size, reason,
            )

    # --- the policy control file ----------------------------------------------------
    def enable_control(self, control: PolicyControl, make_policy: Callable[[str], Policy] | None = None,
                       poll_clock: Callable[[], float] = time.monotonic) -> bool:
        """Watch `control` for a new policy spec (one rank only: ranks would read the file at
        different steps and decide apart).  `make_policy` builds a policy from a spec as the
        server's own was built (profile, window); default: as load_controller with no profile."""
        if self.tp_size > 1:
            warn_rank0(self.log, self.tp_rank, "dynspec: %s=%s refused with %d TP ranks (they could read it "
                       "at different steps); policy %s stays for the run", ENV_POLICY_CONTROL, control.path,
                       self.tp_size, self.spec)
            return False
        self._make_policy = make_policy or _policy_maker(None, None, 3)
        self._poll_clock = poll_clock
        self._next_poll = poll_clock()  # the first decision looks at the file
        self._control = control
        return True

    def _new_policy(self, make: Callable[[str], Policy], spec: str) -> FailSafePolicy:
        """A control file's policy, told the server's candidate step counts (it chooses among the same states)."""
        policy = FailSafePolicy(make(spec), self.log)
        if self.candidate_steps:
            policy.set_candidate_steps(self.candidate_steps, self.on_steps)
        return policy

    def _poll_control(self) -> None:
        """A poll is due: swap in the file's policy if it changed, is valid and differs."""
        control, make = self._control, self._make_policy
        assert control is not None and make is not None
        self._next_poll = self._poll_clock() + control.interval_s
        spec = control.read()
        if spec is None or spec == self.spec:
            return
        try:
            policy = self._shelf.swap(self.spec, self.policy, spec, lambda s: self._new_policy(make, s))
        except Exception as exc:  # noqa: BLE001 - a bad spec (PolicySpecError) or profile: keep serving
            self.log.warning("dynspec: policy control file %s holds %r, which is not a usable policy (%s); "
                             "policy %s stays", control.path, spec, exc, self.spec)
            return
        old = self.spec
        self.policy = policy
        self.spec = spec
        self.policy_swaps += 1
        self._use_sync(self.sync)  # the new policy's TP plumbing (a no-op on one rank)
        self.log.info("dynspec: policy %s -> %s at step %d (from %s); mode stays %s until it decides",
                      old, spec, self.step, control.path, self.mode)

    # --- after a step -------------------------------------------------------------
    def note_resume(self) -> None:
        """The patch resumed the draft (one 1-token draft forward) before a speculative step."""
        self.resumes += 1

    def note_kv_only_prefill(self) -> None:
        """The patch prefilled in a plain stretch: draft KV only, the draft state waits for a resume."""
        self.kv_only_prefills += 1

    def note_other_forward(self) -> None:
        """A prefill/extend batch was launched: the interval of the next decode result holds
        its host work too (the overlap scheduler launches before it reads the last result)."""
        self._dirty = True
        self._other_launched = self._clock()
        if self.trace is not None:
            self.trace.add("f", 0, 0)

    def note_gap(self) -> None:
        """The next result's step was launched after the last result was read (an idle pause,
        a scheduler without overlap): its interval is not what a step costs."""
        self._gap = True

    def _interval(self, start: float | None) -> float | None:
        """Seconds from start (None: untimed) to this result, if a plausible forward's time (an
        idle pause is not); this result starts the next interval."""
        now = self._clock()
        dt = None if start is None else now - start
        self._last_obs_t = now
        return dt if dt is not None and 0.0 < dt <= MAX_STEP_TIME_S else None

    def note_prefill(self, requests: int, tokens: int) -> None:
        """A prefill (extend) batch's result: `requests` whose prompts it finished and its
        `tokens` (both rank-identical).  Its time runs from the previous result, or from its
        launch when that came later (after an idle pause), to now; the next decode step's
        interval starts here."""
        start = self._last_obs_t
        idle = start is not None and self._other_launched is not None and self._other_launched > start
        if idle:
            start = self._other_launched
        seconds = self._interval(start)
        self.prefills += 1
        self.prompts_prefilled += requests
        self.idle_prefills += idle
        if self.trace is not None:
            self.trace.add("F", requests, tokens)
        if not self.fallback:
            self.policy.note_prefill(requests, tokens, seconds if self.times_agreed else None, idle)

    def observe(self, batch_size: int, speculated: bool, accepted: Sequence[int] = (),
                reqs: Sequence | None = None, steps: int | None = None, kv_tokens: int | None = None) -> None:
        """Feed one decode step's outcome (accepted draft tokens per request, in the order of reqs,
        the step's requests when the caller has them; `steps`: the draft steps it ran, None on a
        one-count server; `kv_tokens`: its requests' contexts summed, when the caller knows) to the
        policy."""
        step_time = self._interval(self._last_obs_t)
        clean, self._dirty = not self._dirty, False
        if self._gap:
            step_time, self._gap = None, False
        if self.trace is not None:
            self.trace.add("S" if speculated else "P", batch_size, sum(accepted) if speculated else 0)
        if speculated:
            self._spec_steps_observed += 1
            if accepted:
                total, n = sum(accepted), len(accepted)
                self._accepted_sum += total
                self._accepted_n += n
                if steps is not None:  # a server of several draft lengths: acceptance by each
                    row = self.accepted_by_k.setdefault(steps, [0, 0])
                    row[0] += total
                    row[1] += n
        if self.fallback:
            return
        pol = self.policy
        rids = _request_ids(reqs) if speculated and reqs is not None and pol.wants_requests(batch_size) else None
        pol.observe(
            StepRecord(
                batch_size,
                speculated,
                tuple(accepted) if speculated else (),
                step_time if self.times_agreed else None,
                rids,
                clean,
                steps,
                kv_tokens,
            )
        )
        if self.agreeing and self._schedule.due(self.step, batch_size, speculated):
            self._agree()

    # --- reporting ----------------------------------------------------------------
    def stats(self) -> dict:
        """Counters for /get_server_info (internal_states[i]["dynspec"])."""
        with self._lock:
            last = dict(self.last_switch) if self.last_switch else None
        return {
            "policy": self.spec,  # the policy in force (after any control-file swap)
            "policy_swaps": self.policy_swaps,
            "policy_control": self._control.path if self._control is not None else None,
            "profile": self.profile_name,
            "mode": self.mode,
            "steps": self.step,
            "steps_spec": self.steps_spec,
            "steps_plain": self.steps_plain,
            "switches": self.switches,
            "forced_spec": self.forced_spec,
            "resumes": self.resumes,
            "kv_only_prefills": self.kv_only_prefills,
            "steps_with_requests": self.steps_with_requests,
            "budgets_told": self.budgets_told,
            "prefills": self.prefills,
            "prompts_prefilled": self.prompts_prefilled,
            "idle_prefills": self.idle_prefills,
            "policy_failed": bool(getattr(self.policy, "failed", False)),
            "fallback": self.fallback,
            "plain_step": self.plain_step_kind,
            "step_times_used": self.times_agreed,
            "tp_size": self.tp_size,
            # the running TP agreements (tp_agreement): how many, and their host time on this rank
            "tp_agreements": self.agreements,
            "tp_agreement_ms": round(self.agreement_s * 1e3, 3),
            # The sums behind the mean: acceptance over any stretch of traffic is a difference.
            "drafts_accepted": self._accepted_sum,
            "request_steps_speculated": self._accepted_n,
            "mean_accepted_when_speculating": (
                round(self._accepted_sum / self._accepted_n, 4) if self._accepted_n else None
            ),
            "last_switch": last,
            # A server of several draft lengths (SGLang 0.5.23): its candidates and steps run at each.
            "candidate_steps": list(self.candidate_steps) or None,
            "steps_by_k": {str(k): n for k, n in sorted(self.steps_by_k.items())} or None,
            # K -> [drafts accepted, request-steps] at that K (sums, so any stretch is a difference):
            # a draft gone cold after a stretch at another K shows here, the mean over every K hides it
            "accepted_by_k": {str(k): list(v) for k, v in sorted(self.accepted_by_k.items())} or None,
            # What the policy believes, per batch-size bucket (goodput): why it decides as it does.
            "estimates": _estimates(getattr(self.policy, "inner", self.policy)),
            # What it reads from prefill forwards: whether finishes come in lockstep (goodput).
            "prefill_estimates": _estimates(getattr(self.policy, "inner", self.policy), "prefill_estimates"),
            # How requests differ in acceptance, and the regime the batch formed in (goodput).
            "acceptance_estimates": _estimates(getattr(self.policy, "inner", self.policy), "acceptance_estimates"),
        }

    def enable_prometheus(self, labels: Mapping[str, str] | None = None, registry=None) -> bool:
        """Export the counters on /metrics (needs prometheus_client; SGLang has it).

        SGLang's scheduler runs prometheus_client in multiprocess mode and its HTTP
        server collects every process's series, so the default registry is right."""
        try:
            self._prom = PromExporter(dict(labels or {}), registry)
        except Exception as exc:  # noqa: BLE001 - metrics are optional
            self.log.warning("dynspec: Prometheus metrics unavailable (%s); /get_server_info still reports", exc)
            self._prom = None
        return self._prom is not None


def load_controller(
    *,
    tp_rank: int = 0,
    tp_size: int = 1,
    sync: SyncHook | None = None,
    sync_factory: Callable[[], SyncHook | None] | None = None,
    min_sync: MinSyncHook | None = None,
    initial_steps: int = 3,
    env: Mapping[str, str] | None = None,
    logger: logging.Logger | None = None,
) -> Controller | None:
    """Build the controller from the environment; None when DYNSPEC_POLICY is unset.

    `sync`: an all-reduce-mean hook over the TP ranks, or `sync_factory` that builds
    one (called only when a policy is configured); needed for measured step times
    to count, and for the ranks' agreements, when tp_size > 1.
    `min_sync`: an all-reduce-min hook over the TP ranks.  With it (and tp_size > 1)
    every rank that gets here joins one MIN at the end (`agree_start`): if any rank
    could not start, every rank returns None; if any rank has no sync hook, none uses
    one.  Without it each rank decides that alone.
    Any failure here logs one warning (rank 0) and returns None: the server then
    speculates on every step exactly as configured.
    """
    env = os.environ if env is None else env
    logger = logger or _log
    spec = (env.get(ENV_POLICY) or "").strip()
    if not spec:
        return None
    ctl = _build(spec, env, tp_rank, tp_size, sync, sync_factory, min_sync, initial_steps, logger)
    if tp_size > 1 and min_sync is not None:
        ctl = agree_start(ctl, min_sync, tp_rank, logger)
    control = (env.get(ENV_POLICY_CONTROL) or "").strip()
    if ctl is not None and control:
        ctl.enable_control(PolicyControl(control, logger), ctl._make_policy)
    trace = (env.get(ENV_STEP_TRACE) or "").strip()
    if ctl is not None and trace:
        try:
            ctl.trace = StepTrace(trace, tp_rank)
        except OSError as exc:
            warn_rank0(logger, tp_rank, "dynspec: cannot write the step trace %s (%s); serving without it", trace, exc)
    if ctl is not None and tp_rank == 0:
        logger.info(
            "dynspec: policy %s is live (profile: %s, TP ranks: %d, step times: %s); "
            "one log line per speculate/plain switch follows",
            spec, ctl.profile_name or "none", tp_size,
            "used" if ctl.times_agreed else "unused (no TP sync)",
        )
    return ctl


def _load_profile(name: str) -> StepCost:
    """A profile a spec names (goodput:profile=NAME): pydantic and yaml load only then."""
    from dynspec.sim.profile import load_profile

    return load_profile(name)


def _build(spec, env, tp_rank, tp_size, sync, sync_factory, min_sync, initial_steps, logger) -> Controller | None:
    try:
        profile = None
        profile_name = (env.get(ENV_PROFILE) or "").strip() or None
        if profile_name:
            from dynspec.sim.profile import load_profile  # pydantic/yaml only when asked for

            profile = load_profile(profile_name)
        hook: SyncHook | None = None
        if tp_size > 1:
            try:
                hook = sync if sync is not None else (sync_factory() if sync_factory else None)
            except Exception as exc:  # noqa: BLE001
                warn_rank0(logger, tp_rank, "dynspec: cannot build the TP sync hook (%s); step times unused, "
                      "the policy decides from batch size, acceptance and profile", exc)
                hook = None
        make = _policy_maker(profile, hook if tp_size > 1 else None, initial_steps)
        ctl = Controller(make(spec), spec=spec, tp_rank=tp_rank, tp_size=tp_size, sync=hook, min_sync=min_sync,
                         logger=logger, profile_name=profile_name)
        ctl._make_policy = make  # what a control-file swap builds with (enable_control)
        return ctl
    except PolicySpecError as exc:
        warn_rank0(logger, tp_rank, "dynspec: DYNSPEC_POLICY=%r is invalid (%s); dynspec is OFF and the server "
              "speculates on every step as configured", spec, exc)
    except Exception as exc:  # noqa: BLE001 - whatever went wrong, the server must start
        warn_rank0(logger, tp_rank, "dynspec: cannot start policy %r (%s: %s); dynspec is OFF and the server "
              "speculates on every step as configured", spec, type(exc).__name__, exc)
    return None


def _policy_maker(profile: StepCost | None, sync: SyncHook | None, initial_steps: int) -> Callable[[str], Policy]:
    """Build policies from specs as the server's first one was: same profile and sync hook."""
    def make(spec: str) -> Policy:
        # The overlap scheduler launches a step before it reads the last one's result.
        return build_policy(spec, profile=profile, sync=sync, initial_steps=initial_steps,
                            window=OVERLAP_WINDOW, load_profile=_load_profile)
    return make


def _estimates(policy, method: str = "estimates") -> dict | None:
    """A policy's estimates for /get_server_info (its `method`), or None if it keeps none."""
    est = getattr(policy, method, None)
    try:
        return est() if callable(est) else None
    except Exception:  # noqa: BLE001 - reporting must never break serving
        return None
