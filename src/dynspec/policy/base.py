"""What every policy is: `decide(batch_size) -> bool` before a decode step, `observe(StepRecord)`
after it, and what the tensor-parallel ranks agree on.  A server that can run several draft lengths
(SGLang 0.5.23's candidate steps) asks `decide_steps(batch_size) -> int` instead: by default the
on/off decision at the server's own step count."""

from __future__ import annotations

from typing import Hashable, NamedTuple, Sequence

from dynspec.policy.sync import SYNC_EVERY, SyncSchedule


class PolicySpecError(ValueError):
    """A policy spec string that cannot be built; the message names the bad part."""


class StepRecord(NamedTuple):
    """What happened in one decode step (a tuple: cheap to build on the hot path)."""

    batch_size: int
    speculated: bool
    accepted: Sequence[int] = ()  # accepted draft tokens per request (bonus token not counted)
    step_time_s: float | None = None  # local wall time since the previous result; not rank-consistent
    requests: Sequence[Hashable] | None = None  # the requests' ids, in accepted's order (rank-identical)
    # No prefill was launched between the previous result and this one (a live server's overlap
    # pipeline: that interval then holds the prefill's host work too).  The simulator's always are.
    clean: bool = True
    # Draft steps the step ran (0 when plain); None: the server's one configured count (0.5.9).
    steps: int | None = None
    # Tokens in the batch's KV cache (its requests' contexts summed); None when the caller does not
    # know.  A step's attention reads all of them, so its time grows with them at one batch size.
    kv_tokens: int | None = None


class Policy:
    """Base class: speculate (True) or decode plainly (False) before each step."""

    name = "policy"
    # Up to this batch size the policy uses the ids of a step's requests: a caller that knows
    # them calls set_batch before every decide (None above it) and fills StepRecord.requests.
    requests_up_to = 0

    def set_batch(self, requests: Sequence[Hashable] | None) -> None:
        """The ids of the requests the next decide()'s step runs (rank-identical, e.g. SGLang's
        rids), or None when the caller does not pass them (a batch above requests_up_to)."""

    # The draft lengths the server can run, ascending (0: no speculation), and the one it speculates
    # with when a policy answers only on/off.  Empty: one configured count, decide() only.
    candidate_steps: tuple[int, ...] = ()
    on_steps = 0

    def set_candidate_steps(self, steps: Sequence[int], on_steps: int) -> None:
        """The server runs any of `steps` draft steps (0 included: no speculation); `on_steps` is
        what decide()'s True means.  Called once, before the first decide_steps."""
        cands = tuple(sorted(set(int(k) for k in steps)))
        if not cands or cands[0] < 0:
            raise ValueError(f"candidate steps must be integers >= 0, got {list(steps)}")
        if cands[-1] == 0:
            raise ValueError("candidate steps need one above 0 (0 alone: never speculate)")
        self.candidate_steps = cands
        self.on_steps = self._nearest_positive(on_steps)

    def _nearest_positive(self, k: int) -> int:
        """The positive candidate nearest to k (the larger one on a tie)."""
        pos = [c for c in self.candidate_steps if c > 0]
        return min(pos, key=lambda c: (abs(c - k), -c))

    def decide(self, batch_size: int) -> bool:
        raise NotImplementedError

    def decide_steps(self, batch_size: int) -> int:
        """Draft steps for the next decode step, one of candidate_steps: by default the on/off
        decision, on meaning on_steps.  A policy that weighs step counts overrides it."""
        return self.on_steps if self.decide(batch_size) else 0

    def wants_requests(self, batch_size: int) -> bool:
        """Whether the next speculative step's StepRecord should carry its requests' ids (a
        caller building them costs O(batch)): always up to requests_up_to, and above it when the
        policy asks (Goodput, now and then, to learn how requests differ)."""
        return batch_size <= self.requests_up_to

    def observe(self, rec: StepRecord) -> None:
        pass

    # While True, a caller that knows the output budgets of the next decide()'s requests (what each
    # may still generate: SGLang's max_new_tokens less its output so far) passes them to
    # note_budgets first.
    wants_budgets = False

    def note_budgets(self, budgets: Sequence[int]) -> None:
        """The output budgets of the next decide()'s requests (rank-identical), asked for through
        wants_budgets."""

    def note_prefill(self, requests: int, tokens: int, seconds: float | None = None, idle: bool = False) -> None:
        """A prefill (extend) forward ran between decode steps: `requests` whose prompts it
        finished and `tokens` prompt tokens (both rank-identical), taking `seconds` (local wall
        time, not rank-consistent; None when unmeasured).  `idle`: it was launched on a server
        with nothing in flight, so `seconds` is the whole forward's latency, not what it added to
        decoding."""

    def reason(self, batch_size: int) -> str:
        """Why the current mode; called only when the mode switches."""
        return self.name

    def spec(self) -> str:
        """The spec string that rebuilds this policy."""
        return self.name

    # Tensor parallelism: what the ranks agree on (see dynspec.sglang.hook.Controller) ---------
    def sync_schedule(self) -> SyncSchedule:
        return SyncSchedule(SYNC_EVERY)

    def sync_values(self) -> list[float]:
        """Local values to all-reduce at an agreement (a fixed length per policy)."""
        return []

    def sync_apply(self, agreed: list[float]) -> None:
        """Take the rank-mean of sync_values()."""

    def defer_sync(self) -> None:
        """The caller runs the agreements (sync_values, sync_apply on sync_schedule())."""

    def state_key(self) -> tuple:
        """Everything decisions depend on, for the ranks' checksum: equal on every rank."""
        return ()
