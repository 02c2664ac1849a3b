"""SGLang 0.5.23's adaptive tiers, reduced to a policy."""

from __future__ import annotations

import bisect

from dynspec.policy.base import Policy, StepRecord

# Behaviour modelled on sglang/srt/speculative/adaptive_spec_params.py (0.5.23):
# per batch-size tier a set of candidate step counts, an EMA of accepted drafts, and
# a step count that moves one candidate down when the EMA falls below
# (next lower step - 0.5 + down_hysteresis) and up when it exceeds (current - 0.5 +
# up_hysteresis), re-evaluated every `update_interval` steps after a warm-up.
# Zero steps means no speculation; from zero it probes the smallest positive step.

SGLANG_DEFAULT_TIERS: dict[int, dict] = {
    1: {"candidate_steps": [1, 3, 5, 7], "down_hysteresis": -0.25},
    8: {"candidate_steps": [0, 1, 3]},
    32: {"candidate_steps": [0, 1]},
    64: {"candidate_steps": [0]},
}


class _Tier:
    __slots__ = ("candidates", "steps", "ema", "count", "alpha", "interval", "warmup", "down", "up")

    def __init__(self, initial_steps: int, cfg: dict):
        self.candidates = sorted(set(cfg["candidate_steps"]))
        self.alpha = cfg.get("ema_alpha", 0.2)
        self.interval = cfg.get("update_interval", 5)
        self.warmup = cfg.get("warmup_batches", 10)
        self.down = cfg.get("down_hysteresis", 0.0)
        self.up = cfg.get("up_hysteresis", 0.0)
        mid = self.candidates[len(self.candidates) // 2]
        self.steps = initial_steps if initial_steps in self.candidates else mid
        self.ema = float(self.steps - 1)
        self.count = 0

    def update(self, mean_accepted: float) -> None:
        if self.steps > 0:
            self.ema += self.alpha * (mean_accepted - self.ema)
        self.count += 1
        if self.count > self.warmup and (self.count - self.warmup) % self.interval == 0:
            self._recompute()

    def _recompute(self) -> None:
        i = self.candidates.index(self.steps)
        if self.steps == 0:
            i = min(i + 1, len(self.candidates) - 1)
            if self.candidates[i] > 0 and self.ema < 0:
                self.ema = float(self.candidates[i] - 1)
            self.steps = self.candidates[i]
            return
        start = i
        while i > 0:
            lower = self.candidates[i - 1]
            drop = (0.5 if lower == 0 else lower - 0.5) + self.down
            if self.ema > drop:
                break
            i -= 1
        if i == start:
            while i < len(self.candidates) - 1 and self.ema > self.candidates[i] - 0.5 + self.up:
                i += 1
        self.steps = self.candidates[i]


class SglangTiers(Policy):
    """SGLang 0.5.23's DEFAULT_ADAPTIVE_CONFIG: its step count (decide_steps), or on/off (steps > 0)."""

    name = "sglang-default-tiers"

    def __init__(self, initial_steps: int = 3, tiers: dict[int, dict] | None = None):
        tiers = tiers or SGLANG_DEFAULT_TIERS
        self._keys = sorted(tiers)
        self._tiers = [_Tier(initial_steps, tiers[k]) for k in self._keys]
        self.initial_steps = initial_steps

    def _tier(self, batch_size: int) -> _Tier:
        return self._tiers[max(bisect.bisect_right(self._keys, batch_size) - 1, 0)]

    def steps_for(self, batch_size: int) -> int:
        return self._tier(batch_size).steps

    def decide(self, batch_size: int) -> bool:
        return self._tier(batch_size).steps > 0

    def decide_steps(self, batch_size: int) -> int:
        """The tier's step count (a server whose candidates lack it: the nearest one it has)."""
        k = self._tier(batch_size).steps
        return k if k == 0 or k in self.candidate_steps else self._nearest_positive(k)

    def observe(self, rec: StepRecord) -> None:
        acc = rec.accepted
        self._tier(rec.batch_size).update(sum(acc) / len(acc) if acc else 0.0)

    def reason(self, batch_size: int) -> str:
        t = self._tier(batch_size)
        return f"sglang tier {self._keys[self._tiers.index(t)]}: steps={t.steps} ema_accepted={t.ema:.2f}"

    def spec(self) -> str:
        return f"sglang-default-tiers:steps={self.initial_steps}"

    def state_key(self) -> tuple:
        return tuple((t.steps, t.count, t.ema) for t in self._tiers)

