"""Step-cost profiles: what a decode step costs on one machine, plain and speculative.

One YAML format serves the goodput policy (its priors), the simulator, the emulator
and GPU calibration.  Times are in milliseconds in the file and seconds in code.
The format is documented in the README ("Profile format").
"""

from __future__ import annotations

import bisect
from functools import cached_property
from importlib import resources
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from dynspec.typed_yaml import parse_model, read_yaml


class ProfileError(ValueError):
    """A profile that cannot be loaded; the message names the file, key and problem."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Speculative(_Strict):
    algorithm: str = "EAGLE3"
    num_steps: int = Field(3, ge=1, le=64)
    topk: int = Field(1, ge=1)
    num_draft_tokens: int = Field(4, ge=2)


class Acceptance(_Strict):
    # SGLang's avg_spec_accept_length: tokens per request per verify, bonus token included.
    accept_length: float = Field(gt=1.0)
    # Spread across requests: per-request draft acceptance rates ~ Beta with this
    # concentration around the mean rate (larger = requests more alike).
    concentration: float = Field(10.0, gt=0)

    @property
    def mean_accepted(self) -> float:
        """Accepted draft tokens per request per speculative step."""
        return self.accept_length - 1.0


class Steps(_Strict):
    batch_size: list[int] = Field(min_length=2)
    plain_ms: list[float]
    spec_ms: list[float] | None = None
    # Or the speculative step in parts, summed: draft forward(s), target verify, draft extend.
    draft_ms: list[float] | None = None
    verify_ms: list[float] | None = None
    extend_ms: list[float] | None = None

    @model_validator(mode="after")
    def _check(self) -> "Steps":
        bs = self.batch_size
        if any(b < 1 for b in bs) or any(a >= b for a, b in zip(bs, bs[1:])):
            raise ValueError("batch_size must be positive and strictly increasing")
        parts = [self.draft_ms, self.verify_ms, self.extend_ms]
        if self.spec_ms is None and any(p is None for p in parts):
            raise ValueError("give spec_ms, or all of draft_ms, verify_ms and extend_ms")
        for key in ("plain_ms", "spec_ms", "draft_ms", "verify_ms", "extend_ms"):
            v = getattr(self, key)
            if v is None:
                continue
            if len(v) != len(bs):
                raise ValueError(f"{key} has {len(v)} values but batch_size has {len(bs)}")
            if any(not (t >= 0) for t in v) or (key in ("plain_ms", "spec_ms") and any(t <= 0 for t in v)):
                raise ValueError(f"{key} must hold positive times in milliseconds")
        return self

    @cached_property
    def spec_total_ms(self) -> list[float]:
        if self.spec_ms is not None:
            return self.spec_ms
        return [d + v + e for d, v, e in zip(self.draft_ms, self.verify_ms, self.extend_ms)]


class Prefill(_Strict):
    fixed_ms: float = Field(5.0, ge=0)
    per_token_ms: float = Field(0.02, ge=0)
    chunk_tokens: int = Field(8192, ge=1)

    def time_s(self, tokens: int) -> float:
        return (self.fixed_ms + self.per_token_ms * tokens) / 1000.0


class Provenance(_Strict):
    kind: Literal["measured", "fitted", "derived"]
    source: str
    command: str | None = None
    assumptions: list[str] = []


class Profile(_Strict):
    model_config = ConfigDict(extra="forbid", frozen=True, ignored_types=(cached_property,))

    name: str
    description: str = ""
    hardware: str = ""
    model: str = ""
    speculative: Speculative = Speculative()
    acceptance: Acceptance
    steps: Steps
    prefill: Prefill = Prefill()
    provenance: Provenance

    @model_validator(mode="after")
    def _check(self) -> "Profile":
        if self.acceptance.mean_accepted > self.speculative.num_steps:
            raise ValueError(
                f"acceptance.accept_length {self.acceptance.accept_length} exceeds "
                f"1 + speculative.num_steps = {1 + self.speculative.num_steps}"
            )
        return self

    # Interpolation ------------------------------------------------------------------
    def _interp(self, ys: list[float], bs: float) -> float:
        xs = self.steps.batch_size
        i = bisect.bisect_right(xs, bs)
        if i == 0:
            return ys[0]  # below the first point: no cheaper than it
        i = min(i, len(xs) - 1)  # beyond the last point: extend the last segment
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return max(y0 + (y1 - y0) * (bs - x0) / (x1 - x0), ys[0] * 0.5)

    def extrapolates(self, bs: float) -> bool:
        return bs > self.steps.batch_size[-1] or bs < self.steps.batch_size[0]

    def plain_time(self, bs: float) -> float:
        """Seconds for one plain decode step at batch size bs."""
        return self._interp(self.steps.plain_ms, bs) / 1000.0

    def spec_time(self, bs: float) -> float:
        """Seconds for one speculative step (draft + verify + draft-extend) at bs."""
        return self._interp(self.steps.spec_total_ms, bs) / 1000.0


def shipped_profiles() -> list[str]:
    root = resources.files("dynspec") / "profiles"
    if not root.is_dir():
        return []
    return sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".yaml"))


def parse_profile(data: object, src: str = "<profile>") -> Profile:
    return parse_model(Profile, data, src, ProfileError, "profile")


def load_profile(name_or_path: str | Path) -> Profile:
    """Load a shipped profile by name, or a YAML file by path."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        return parse_profile(read_yaml(path, ProfileError, "profile"), str(path))
    res = resources.files("dynspec") / "profiles" / f"{name_or_path}.yaml"
    if not res.is_file():
        known = ", ".join(shipped_profiles()) or "none"
        raise ProfileError(f"{name_or_path}: no such profile (shipped: {known}; or give a path to a .yaml file)")
    return parse_profile(yaml.safe_load(res.read_text()), f"profile {name_or_path}")
