"""What every part of Goodput reads: its constants, its knobs, and the state the parts share."""

from __future__ import annotations

from dynspec.policy.base import Policy
from dynspec.policy.goodput.params import GoodputConstants, GoodputParams
from dynspec.policy.step_cost import StepCost
from dynspec.policy.sync import SyncHook


class GoodputBase(GoodputConstants, Policy):
    # Owned by one part, read by others.
    _window: int  # the last `window` decisions as bits, 1: speculate (decision)
    _buffer_times: bool  # measured times wait for the ranks' agreement (times)
    _last_b: int  # the bucket of the last step observed
    _explore: bool  # both modes are tried in a bucket no prior covers
    _choice: list[bool]  # per bucket: speculate (decision)

    def _set_knobs(self, p: GoodputParams, profile: StepCost | None, sync: SyncHook | None) -> None:
        # Copied to attributes: the hot path reads them on every step.
        self.params = p
        self.merge = p.merge  # count the prefills a spec step merges where finishes come apart (_merge)
        self.profile = profile
        self.sync = sync  # None: one process, whose own step times are agreed by definition
        self.sync_every = p.sync_every
        self.use_times = p.use_times
        self.by_kv = p.by_kv
        self.probe, self.budget, self.margin, self.alpha = p.probe, p.budget, p.margin, p.alpha
        self.lead, self.acc_alpha = p.lead, p.acc_alpha
        self.lead_batch, self.lead_apart = p.lead_batch, min(p.lead_apart, p.lead)
        self.min_samples = p.min_samples
        self.draws = p.draws
        self.window = self.PROBE_STEPS = p.window
        # Explore only what no prior covers: without a profile, both modes everywhere.
        self._explore = profile is None and p.use_times
        self._last_b = 0

    def _refresh(self, b: int) -> None:
        """Re-decide bucket b after its estimates moved (decision.py)."""
        raise NotImplementedError
