"""What a policy reads from a step-cost profile (dynspec.sim.profile.Profile has this shape)."""

from __future__ import annotations

from typing import Callable, Protocol


class AcceptancePrior(Protocol):
    @property
    def mean_accepted(self) -> float:
        """Accepted draft tokens per request per speculative step."""
        ...


class StepCost(Protocol):
    """Seconds per decode step at batch size `bs`, and the draft's acceptance."""

    @property
    def acceptance(self) -> AcceptancePrior: ...

    def plain_time(self, bs: float) -> float: ...

    def spec_time(self, bs: float) -> float: ...

    def catch_up_time(self, bs: float) -> float:
        """What a plain step adds to keep the draft's KV cache current."""
        ...

    def resume_time(self, bs: float) -> float:
        """What the first speculative step after plain ones adds."""
        ...


# A profile named in a spec (goodput:profile=NAME) resolved by the caller, which knows where
# profiles live; it raises ValueError naming what is wrong.
ProfileLoader = Callable[[str], StepCost]
