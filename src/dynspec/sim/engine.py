"""The step engine: continuous batching with speculative acceptance, on a virtual clock.

One engine serves the simulator (virtual time, as fast as it computes) and the
emulator (the same steps, slept out in real time).  It models SGLang's default
scheduler as far as throughput depends on it:

- a step is either a prefill batch or a decode step, never both (SGLang runs
  them separately unless --enable-mixed-chunk);
- waiting requests go first: while any wait, the next step is a prefill batch of up
  to `prefill.chunk_tokens` prompt tokens, FIFO, the last request possibly cut
  (chunked prefill); a request whose prompt is done emits its first token then;
- otherwise one decode step over every running request.  Before it the policy
  decides plain or speculative; after it the policy observes a StepRecord with the
  accepted draft tokens per request and the step's time from the profile;
- KV-cache capacity is not modelled (no retraction): enough memory is assumed.

Acceptance: each request draws its own draft-acceptance rate r ~ Beta with the
profile's concentration, around a mean chosen so that chains of num_steps drafts
(topk=1, each accepted with probability r until the first rejection) give
profile.acceptance.accept_length as SGLang measures it (tokens per request per
verify step, bonus included, averaged over steps: dynspec.sim.acceptance).  A speculative
step then accepts K ~ truncated geometric (P(K >= k) = r^k, K <= num_steps) per
request, never past the request's remaining output, and emits K + 1 tokens.

Draft length: with `candidate_steps` (SGLang 0.5.23's candidate step counts) the policy answers
a step count K per decode step (Policy.decide_steps; 0 is a plain step), the chain is cut at K
drafts and the step costs what K draft steps and K + 1 verified tokens cost
(dynspec.sim.draft_steps; the profile's num_steps N exactly as measured).  Without them, as
before: on/off, every speculative step at N.
"""

from __future__ import annotations

import bisect
import math
import random
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Sequence

from dynspec.sim.acceptance import GOLDEN, beta_quantile_table, solve_mean_rate
from dynspec.sim.draft_steps import spec_time_k
from dynspec.policy import Policy, StepRecord

if TYPE_CHECKING:
    from dynspec.sim.profile import Profile


class Request:
    """One request inside the engine.  Times are on the engine's clock (seconds)."""

    __slots__ = ("rid", "input_len", "output_len", "prefilled", "generated", "accept_rate", "_inv_log_rate",
                 "submit_time", "first_token_time", "last_token_time", "finish_time", "itls",
                 "aborted", "context", "spec_steps", "spec_tokens", "_random")

    def __init__(self, rid: int, input_len: int, output_len: int, accept_rate: float, now: float,
                 seed: int = 0, context: Any = None):
        self.rid = rid
        self.input_len = input_len
        self.output_len = output_len
        self.prefilled = 0
        self.generated = 0
        self.accept_rate = accept_rate
        # K = floor(log(u) / log(r)) has P(K >= k) = r^k; r = 0 never accepts, r = 1 always.
        self._inv_log_rate = 0.0 if accept_rate <= 0 else (-math.inf if accept_rate >= 1 else 1.0 / math.log(accept_rate))
        self.submit_time = now
        self.first_token_time: float | None = None
        self.last_token_time: float | None = None
        self.finish_time: float | None = None
        self.itls: list[float] | None = None
        self.aborted = False
        self.spec_steps = 0  # speculative (verify) steps this request took part in
        self.spec_tokens = 0  # tokens those steps gave it
        self.context = context  # the caller's own handle (the emulator's stream)
        # Its own draw stream: the request's n-th speculative step accepts the same in every
        # arm (common random numbers), so arms differ by their decisions, not by luck.
        self._random = random.Random(f"dynspec-request-{seed}-{rid}").random

    @property
    def finished(self) -> bool:
        return self.finish_time is not None


class Step(NamedTuple):
    """What one engine step did.  Its tokens become visible at start + duration."""

    kind: str  # "prefill" or "decode"
    start: float
    duration: float
    batch_size: int  # requests in the step (decode) or prompt tokens (prefill)
    speculated: bool
    emitted: list[Request]  # requests that received tokens in this step
    finished: list[Request]  # requests that completed in this step
    extrapolated: bool  # the profile was extrapolated for this step's batch size

    @property
    def end(self) -> float:
        return self.start + self.duration


@dataclass(slots=True, eq=False)  # eq=False: compared and hashed by identity, as before
class EngineStats:
    """Counters over an engine's life; what /metrics, /get_server_info and sim rows report."""

    steps_prefill: int = 0
    steps_plain: int = 0
    steps_spec: int = 0
    switches: int = 0
    spec_request_steps: int = 0
    spec_tokens: int = 0
    tokens_out: int = 0
    prompt_tokens: int = 0
    requests_finished: int = 0
    requests_aborted: int = 0
    steps_extrapolated: int = 0
    busy_time: float = 0.0
    draft_steps: int = 0  # draft steps summed over speculative steps (their mean: mean_draft_steps)

    @property
    def mean_draft_steps(self) -> float:
        return self.draft_steps / self.steps_spec if self.steps_spec else math.nan

    @property
    def decode_steps(self) -> int:
        return self.steps_plain + self.steps_spec

    @property
    def accept_length(self) -> float:
        """SGLang's avg_spec_accept_length: tokens per request per verify step, bonus included."""
        return self.spec_tokens / self.spec_request_steps if self.spec_request_steps else math.nan

    @property
    def spec_step_fraction(self) -> float:
        return self.steps_spec / self.decode_steps if self.decode_steps else math.nan


def _advance(req: Request, n: int, end: float, record: bool, finished: list, still: list) -> None:
    """`req` gets n tokens at `end`: into `finished` if that is its last, else `still`."""
    req.generated += n
    if record:
        itls, last = req.itls, req.last_token_time
        assert itls is not None and last is not None  # submit gave it a list; running: a first token
        if n == 1:
            itls.append(end - last)
        else:
            itls.extend([(end - last) / n] * n)  # as bench_serving splits a chunk's gap
    req.last_token_time = end
    if req.generated >= req.output_len:
        req.finish_time = end
        finished.append(req)
    else:
        still.append(req)


class Engine:
    """Continuous batching over a profile; `policy=None` means a server without speculation."""

    def __init__(self, profile: Profile, policy: Policy | None = None, *, seed: int = 0,
                 max_running_requests: int | None = None, record_itl: bool = False, catch_up: bool = True,
                 candidate_steps: Sequence[int] | None = None):
        if max_running_requests is not None and max_running_requests < 1:
            raise ValueError(f"max_running_requests must be >= 1, got {max_running_requests}")
        self.profile = profile
        self.policy = policy
        self.max_running = max_running_requests or (1 << 62)
        self.record_itl = record_itl
        self.num_steps = profile.speculative.num_steps
        acc = profile.acceptance
        self.concentration = acc.concentration
        self.mean_rate = solve_mean_rate(acc.accept_length, acc.concentration, self.num_steps)
        self.seed = seed
        # Request rates in submission order, alike across arms as the requests are.  They walk
        # the Beta quantiles by a golden-ratio sequence (low discrepancy): any few dozen
        # consecutive requests cover the distribution evenly, so a short level's mean
        # acceptance does not depend on the luck of the seed.
        self._rate_phase = random.Random(f"dynspec-rates-{seed}").random()
        self._rate_quantiles = beta_quantile_table(self.mean_rate, self.concentration)
        self.clock = 0.0
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.stats = EngineStats()
        self.mode: bool | None = None  # speculative mode of the last decode step
        self._next_rid = 0
        self._plain_t: list[float] = []  # step times by batch size, filled on first use
        self._spec_t: list[float] = []
        self._resume_t: list[float] = []
        self._extrap: list[bool] = []
        self._ctx_times: dict[tuple[int, int], tuple[float, float, bool, float]] = {}
        self._context_aware = profile.context_aware  # step times by context too (several tables)
        # A server that can speculate pays a draft catch-up on its plain steps (Profile.catch_up_time)
        # and, after a KV-only catch-up, a resume on each switch to speculating (Profile.resume_time);
        # the plain server (policy None) does not.  catch_up=False: what if both were free.
        self._switchable = policy is not None and catch_up
        # Several draft lengths: the policy picks K per step (decide_steps), K's cost and chain.
        self._by_k = policy is not None and candidate_steps is not None
        if self._by_k:
            assert policy is not None and candidate_steps is not None
            policy.set_candidate_steps(candidate_steps, self.num_steps)
        self._spec_k: dict[tuple[int, int, int], float] = {}
        self._position_rates = acc.position_rates

    # Requests -------------------------------------------------------------------------
    def draw_accept_rate(self) -> float:
        """The next request's acceptance rate: the Beta quantile at the next sequence point."""
        u = (self._rate_phase + self._next_rid * GOLDEN) % 1.0
        cdf, xs = self._rate_quantiles
        if not cdf:
            return self.mean_rate
        i = min(bisect.bisect_left(cdf, u), len(cdf) - 1)
        if i == 0:
            return xs[0]
        c0, c1 = cdf[i - 1], cdf[i]
        return xs[i - 1] + (xs[i] - xs[i - 1]) * ((u - c0) / (c1 - c0) if c1 > c0 else 0.0)

    def submit(self, input_len: int, output_len: int, *, context: Any = None) -> Request:
        """Queue a request at the current clock; it is prefilled at the next step."""
        if input_len < 1 or output_len < 1:
            raise ValueError(f"a request needs input_len >= 1 and output_len >= 1, got {input_len}, {output_len}")
        req = Request(self._next_rid, input_len, output_len, self.draw_accept_rate(), self.clock, self.seed, context)
        if self.record_itl:
            req.itls = []
        self._next_rid += 1
        self.waiting.append(req)
        return req

    def abort(self, req: Request) -> None:
        """Drop a request (its client went away); it gets no more steps."""
        if req.finished or req.aborted:
            return
        req.aborted = True
        self.stats.requests_aborted += 1
        if req in self.running:
            self.running.remove(req)
        else:
            try:
                self.waiting.remove(req)
            except ValueError:
                pass

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def advance_to(self, t: float) -> None:
        """Idle until t (the emulator's wall clock, when nothing was running)."""
        if t > self.clock:
            self.clock = t

    # Step times -------------------------------------------------------------------------
    def _times(self, bs: int) -> tuple[float, float, bool, float]:
        """(plain step, speculative step, extrapolated, resume) at batch size bs."""
        if self._context_aware:
            # Step times by batch size and the batch's mean context (tokens in its KV cache),
            # cached per 16 tokens of context.
            ctx = 16 * round(sum(r.input_len + r.generated for r in self.running) / (16 * bs))
            key = (bs, ctx)
            if key not in self._ctx_times:
                p = self.profile
                plain = p.plain_time(bs, ctx) + (p.catch_up_time(bs, ctx) if self._switchable else 0.0)
                resume = p.resume_time(bs, ctx) if self._switchable else 0.0
                self._ctx_times[key] = (plain, p.spec_time(bs, ctx), p.extrapolates(bs, ctx), resume)
            return self._ctx_times[key]
        while len(self._plain_t) <= bs:
            n = len(self._plain_t)
            catch_up = self.profile.catch_up_time(n) if self._switchable else 0.0
            self._plain_t.append(self.profile.plain_time(n) + catch_up)
            self._spec_t.append(self.profile.spec_time(n))
            self._extrap.append(self.profile.extrapolates(n))
            self._resume_t.append(self.profile.resume_time(n) if self._switchable else 0.0)
        return self._plain_t[bs], self._spec_t[bs], self._extrap[bs], self._resume_t[bs]

    def _spec_time(self, bs: int, k: int) -> float:
        """A speculative step of k draft steps at bs (k != num_steps), cached by (bs, k, context)."""
        ctx = 0
        if self._context_aware:
            ctx = 16 * round(sum(r.input_len + r.generated for r in self.running) / (16 * bs))
        key = (bs, k, ctx)
        t = self._spec_k.get(key)
        if t is None:
            t = self._spec_k[key] = spec_time_k(self.profile, bs, k, ctx if self._context_aware else None)
        return t

    def _accept_positions(self, req: Request, k: int) -> int:
        """Drafts accepted of a k-step chain under per-position rates: one draw, the chain walked
        while it survives (P(>= i accepted) = prod of the first i rates, scaled by the request's)."""
        u, p, rates = 1.0 - req._random(), 1.0, self._position_rates
        assert rates is not None
        scale, last, n = req.accept_rate / self.mean_rate if self.mean_rate > 0 else 1.0, len(rates) - 1, 0
        while n < k:
            q = rates[n if n < last else last] * scale
            p *= q if q < 1.0 else 1.0
            if u >= p:
                break
            n += 1
        return n

    # Stepping ---------------------------------------------------------------------------
    def step(self) -> Step | None:
        """Run one step and advance the clock past it; None when there is nothing to run."""
        if self.waiting and len(self.running) < self.max_running:
            return self._prefill()
        if self.running:
            return self._decode()
        return None

    def _emit_first(self, req: Request, t: float, finished: list[Request]) -> None:
        req.generated = 1
        req.first_token_time = req.last_token_time = t
        if req.output_len == 1:
            req.finish_time = t
            finished.append(req)
        else:
            self.running.append(req)

    def _prefill(self) -> Step:
        budget = self.profile.prefill.chunk_tokens
        tokens = 0
        done: list[Request] = []
        slots = self.max_running - len(self.running)
        while self.waiting and budget > 0 and len(done) < slots:
            req = self.waiting[0]
            take = min(req.input_len - req.prefilled, budget)
            req.prefilled += take
            tokens += take
            budget -= take
            if req.prefilled < req.input_len:
                break  # chunked: the rest of this prompt goes in the next prefill step
            self.waiting.popleft()
            done.append(req)
        start, idle = self.clock, not self.running
        duration = self.profile.prefill.time_s(tokens)
        self.clock = end = start + duration
        finished: list[Request] = []
        for req in done:
            self._emit_first(req, end, finished)
        if self.policy is not None:
            self.policy.note_prefill(len(done), tokens, duration, idle)
        st = self.stats
        st.steps_prefill += 1
        st.prompt_tokens += tokens
        st.tokens_out += len(done)
        st.requests_finished += len(finished)
        st.busy_time += duration
        return Step("prefill", start, duration, tokens, False, done, finished, False)

    def _decode(self) -> Step:
        running = self.running
        bs = len(running)
        t_plain, t_spec, extrap, t_resume = self._times(bs)
        # The batch's KV tokens, told to the policy where step times depend on them (as a live
        # server's seq_lens_sum)
        kv = sum(r.input_len + r.generated for r in running) if self._context_aware else None
        policy = self.policy
        rids = None
        if policy is not None and policy.wants_budgets:  # each request's output left to generate
            policy.note_budgets([r.output_len - r.generated for r in running])
        if policy is not None and policy.requests_up_to:  # it tracks small batches' requests
            rids = [r.rid for r in running] if bs <= policy.requests_up_to else None
            policy.set_batch(rids)
        if self._by_k:
            assert policy is not None
            k_steps = policy.decide_steps(bs)
            spec = k_steps > 0
            if spec and k_steps != self.num_steps:
                t_spec = self._spec_time(bs, k_steps)
        else:
            spec = policy.decide(bs) if policy is not None else False
            k_steps = self.num_steps if spec else 0
        st = self.stats
        if self.mode is not None and spec != self.mode:
            st.switches += 1
        start = self.clock
        duration = t_spec if spec else t_plain
        if spec and self.mode is False:  # the first speculative step after plain ones resumes the draft
            duration += t_resume
        self.mode = spec
        self.clock = end = start + duration
        finished: list[Request] = []
        still: list[Request] = []
        record, advance = self.record_itl, _advance
        if spec:
            log, n_max = math.log, k_steps
            accepted: list[int] = []
            emitted = 0
            by_position = self._position_rates is not None
            for req in running:
                inv = req._inv_log_rate
                if by_position:
                    k = self._accept_positions(req, n_max)
                elif inv == 0.0:
                    k = 0
                elif inv == -math.inf:
                    k = n_max
                else:
                    k = int(log(1.0 - req._random()) * inv)  # 1 - random() lies in (0, 1]
                    if k > n_max:
                        k = n_max
                left = req.output_len - req.generated
                if k >= left:
                    k = left - 1
                accepted.append(k)
                n = k + 1
                emitted += n
                req.spec_steps += 1
                req.spec_tokens += n
                advance(req, n, end, record, finished, still)
            st.steps_spec += 1
            st.spec_request_steps += bs
            st.spec_tokens += emitted
            st.tokens_out += emitted
            st.draft_steps += k_steps
            if rids is None and policy is not None and policy.wants_requests(bs):
                rids = [r.rid for r in running]
            rec = StepRecord(bs, True, accepted, duration, rids, True, k_steps if self._by_k else None, kv)
        else:
            for req in running:
                advance(req, 1, end, record, finished, still)
            st.steps_plain += 1
            st.tokens_out += bs
            rec = StepRecord(bs, False, (), duration, None, True, 0 if self._by_k else None, kv)
        if self.policy is not None:
            self.policy.observe(rec)
        self.running = still
        st.requests_finished += len(finished)
        st.busy_time += duration
        if extrap:
            st.steps_extrapolated += 1
        return Step("decode", start, duration, bs, spec, running, finished, extrap)
