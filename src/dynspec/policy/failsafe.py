"""A policy that raises must not stop the server."""

from __future__ import annotations

import logging
from typing import Any, Callable, Hashable, Sequence

from dynspec.policy.base import Policy, StepRecord

log = logging.getLogger("dynspec.policy")


class FailSafePolicy(Policy):
    """Wraps a policy: if it raises, speculate as configured for the rest of the run."""

    def __init__(self, inner: Policy, logger: logging.Logger | None = None):
        self.inner = inner
        self.name = inner.name
        self.requests_up_to = inner.requests_up_to
        self.failed = False
        self._log = logger or log

    def fail(self, where: str, exc: BaseException) -> None:
        """Give up on the inner policy (also called by a caller whose use of it raised)."""
        self.failed = True
        self._log.warning(
            "dynspec policy %s failed in %s (%s: %s); speculating as configured for the rest of the run",
            self.inner.name, where, type(exc).__name__, exc,
        )

    def _guarded(self, where: str, call: Callable[[Any], None], arg: Any) -> None:
        if self.failed:
            return
        try:
            call(arg)
        except Exception as exc:  # noqa: BLE001
            self.fail(where, exc)

    def set_batch(self, requests: Sequence[Hashable] | None) -> None:
        self._guarded("set_batch", self.inner.set_batch, requests)

    def decide(self, batch_size: int) -> bool:
        if self.failed:
            return True
        try:
            return bool(self.inner.decide(batch_size))
        except Exception as exc:  # noqa: BLE001 - any failure must not stop the server
            self.fail("decide", exc)
            return True

    def set_candidate_steps(self, steps: Sequence[int], on_steps: int) -> None:
        super().set_candidate_steps(steps, on_steps)  # bad steps raise here: a caller's error
        self._guarded("set_candidate_steps", lambda a: self.inner.set_candidate_steps(*a), (steps, on_steps))

    def decide_steps(self, batch_size: int) -> int:
        if self.failed:
            return self.on_steps
        try:
            k = int(self.inner.decide_steps(batch_size))
        except Exception as exc:  # noqa: BLE001 - any failure must not stop the server
            self.fail("decide_steps", exc)
            return self.on_steps
        if k not in self.candidate_steps:  # the server cannot run it: as a raise
            self.fail("decide_steps", ValueError(f"{k} draft steps is not a candidate {self.candidate_steps}"))
            return self.on_steps
        return k

    def wants_requests(self, batch_size: int) -> bool:
        if self.failed:
            return False
        try:
            return bool(self.inner.wants_requests(batch_size))
        except Exception as exc:  # noqa: BLE001
            self.fail("wants_requests", exc)
            return False

    def observe(self, rec: StepRecord) -> None:
        self._guarded("observe", self.inner.observe, rec)

    @property
    def wants_budgets(self) -> bool:  # type: ignore[override]
        return not self.failed and bool(getattr(self.inner, "wants_budgets", False))

    def note_budgets(self, budgets: Sequence[int]) -> None:
        self._guarded("note_budgets", self.inner.note_budgets, budgets)

    def note_prefill(self, requests: int, tokens: int, seconds: float | None = None, idle: bool = False) -> None:
        self._guarded("note_prefill", lambda a: self.inner.note_prefill(*a), (requests, tokens, seconds, idle))

    def reason(self, batch_size: int) -> str:
        if self.failed:
            return "fail-safe: policy raised, speculating as configured"
        try:
            return self.inner.reason(batch_size)
        except Exception:  # noqa: BLE001
            return self.inner.name

    def spec(self) -> str:
        return self.inner.spec()

