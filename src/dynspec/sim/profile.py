"""Step-cost profiles: what a decode step costs on one machine, plain and speculative.

One YAML format serves the goodput policy (its priors), the simulator, the emulator
and GPU calibration.  Times are in milliseconds in the file and seconds in code.
The format is documented in docs/PROFILES.md.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from functools import cached_property
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import yaml
from pydantic import ConfigDict, Field, field_validator, model_validator

from dynspec.models import StrictModel
from dynspec.io.typed_yaml import loads_yaml, parse_model, read_yaml

if TYPE_CHECKING:
    from importlib.abc import Traversable  # importlib.resources.abc from Python 3.11


class ProfileError(ValueError):
    """A profile that cannot be loaded; the message names the file, key and problem."""


class Speculative(StrictModel):
    algorithm: str = "EAGLE3"
    num_steps: int = Field(3, ge=1, le=64)
    topk: int = Field(1, ge=1)
    num_draft_tokens: int = Field(4, ge=2)


class Acceptance(StrictModel):
    # SGLang's avg_spec_accept_length: tokens per request per verify, bonus token included.
    accept_length: float = Field(gt=1.0)
    # Spread across requests: per-request draft acceptance rates ~ Beta with this
    # concentration around the mean rate (larger = requests more alike).
    concentration: float = Field(10.0, gt=0)
    # Optional: the chain's acceptance by position, each the probability that draft i is accepted
    # given drafts 1..i-1 were (the last repeats for longer chains); a request's own rate scales
    # them (dynspec.sim.draft_steps).  Without it every position accepts at the request's rate.
    position_rates: list[float] | None = Field(None, min_length=1)

    @field_validator("position_rates")
    @classmethod
    def _rates(cls, v: list[float] | None) -> list[float] | None:
        if v is not None and any(not 0.0 < q <= 1.0 for q in v):
            raise ValueError("position_rates must lie in (0, 1]")
        return v

    @property
    def mean_accepted(self) -> float:
        """Accepted draft tokens per request per speculative step."""
        return self.accept_length - 1.0


class Steps(StrictModel):
    """One table of step times by batch size, measured at one context length."""

    # Tokens in each request's KV cache when measured; needed when a profile has several tables.
    context_len: int | None = Field(None, ge=1)
    batch_size: list[int] = Field(min_length=2)
    plain_ms: list[float]
    spec_ms: list[float] | None = None
    # Or the speculative step in parts, summed: draft forward(s), target verify, draft extend.
    draft_ms: list[float] | None = None
    verify_ms: list[float] | None = None
    extend_ms: list[float] | None = None
    # Optional, the patch's KV-only draft catch-up (both or neither): what a plain step of a server
    # that can switch back to speculating adds (the KV-only draft catch-up of its 1 token per request),
    # and what each plain-to-speculative switch adds (one full 1-token draft forward).  Without them, a
    # switching server's plain step adds extend_ms (the full draft-extend) and a switch adds nothing.
    catchup_ms: list[float] | None = None
    resume_ms: list[float] | None = None
    # Optional, for reading: the extend without a CUDA graph (0.5.9 on flashinfer).
    extend_eager_ms: list[float] | None = None
    # Optional, for reading not simulating: the target's forward alone with q tokens per request
    # ({q: ms per batch size}), the curve that shows where verifying k+1 tokens turns compute-bound.
    forward_ms: dict[int, list[float]] | None = None

    @model_validator(mode="after")
    def _check(self) -> "Steps":
        bs = self.batch_size
        if any(b < 1 for b in bs) or any(a >= b for a, b in zip(bs, bs[1:])):
            raise ValueError("batch_size must be positive and strictly increasing")
        parts = [self.draft_ms, self.verify_ms, self.extend_ms]
        if self.spec_ms is None and any(p is None for p in parts):
            raise ValueError("give spec_ms, or all of draft_ms, verify_ms and extend_ms")
        if self.spec_ms is not None and (self.draft_ms is not None or self.verify_ms is not None):
            raise ValueError("give spec_ms or its parts, not both (extend_ms alone may go with spec_ms)")
        if (self.catchup_ms is None) != (self.resume_ms is None):
            raise ValueError("give catchup_ms and resume_ms together (a KV-only catch-up needs a resume)")
        for key in ("plain_ms", "spec_ms", "draft_ms", "verify_ms", "extend_ms", "catchup_ms", "resume_ms",
                    "extend_eager_ms"):
            v = getattr(self, key)
            if v is None:
                continue
            if len(v) != len(bs):
                raise ValueError(f"{key} has {len(v)} values but batch_size has {len(bs)}")
            if any(not (t >= 0) for t in v) or (key in ("plain_ms", "spec_ms") and any(t <= 0 for t in v)):
                raise ValueError(f"{key} must hold positive times in milliseconds")
        for q, v in (self.forward_ms or {}).items():
            if q < 1 or len(v) != len(bs) or any(not (t > 0) for t in v):
                raise ValueError(f"forward_ms[{q}] must hold {len(bs)} positive times, for q >= 1 tokens per request")
        return self

    @cached_property
    def spec_total_ms(self) -> list[float]:
        if self.spec_ms is not None:
            return self.spec_ms
        draft, verify, extend = self.draft_ms, self.verify_ms, self.extend_ms
        assert draft is not None and verify is not None and extend is not None  # _check: all parts without spec_ms
        return [d + v + e for d, v, e in zip(draft, verify, extend)]


class Prefill(StrictModel):
    fixed_ms: float = Field(5.0, ge=0)
    per_token_ms: float = Field(0.02, ge=0)
    chunk_tokens: int = Field(8192, ge=1)

    def time_s(self, tokens: int) -> float:
        return (self.fixed_ms + self.per_token_ms * tokens) / 1000.0


class Provenance(StrictModel):
    kind: Literal["measured", "fitted", "derived"]
    source: str
    command: str | None = None
    date: str | None = None  # when it was measured or fitted (YYYY-MM-DD)
    assumptions: list[str] = []


class Profile(StrictModel):
    model_config = ConfigDict(ignored_types=(cached_property,))

    name: str
    description: str = ""
    hardware: str = ""
    model: str = ""
    speculative: Speculative = Speculative()
    acceptance: Acceptance
    # One table, or several at different context lengths (a YAML list, context_len increasing).
    steps: list[Steps] = Field(min_length=1)
    prefill: Prefill = Prefill()
    provenance: Provenance

    @field_validator("steps", mode="before")
    @classmethod
    def _one_table_is_a_list(cls, v: object) -> object:
        return [v] if isinstance(v, dict) else v

    @model_validator(mode="after")
    def _check(self) -> "Profile":
        if self.acceptance.mean_accepted > self.speculative.num_steps:
            raise ValueError(
                f"acceptance.accept_length {self.acceptance.accept_length} exceeds "
                f"1 + speculative.num_steps = {1 + self.speculative.num_steps}"
            )
        from dynspec.sim.acceptance import solve_mean_rate

        try:  # within 1 + num_steps, but requests as unlike as `concentration` says may not reach it
            solve_mean_rate(self.acceptance.accept_length, self.acceptance.concentration, self.speculative.num_steps)
        except ValueError as exc:
            raise ValueError(f"acceptance: {exc}") from None
        ctx = self._contexts()
        if len(self.steps) > 1 and (len(ctx) < len(self.steps) or any(a >= b for a, b in zip(ctx, ctx[1:]))):
            raise ValueError("steps: several tables need each a context_len, strictly increasing")
        if len({t.catchup_ms is None for t in self.steps}) > 1:
            raise ValueError("steps: give catchup_ms and resume_ms in every table or in none")
        return self

    def _contexts(self) -> list[int]:
        """The tables' context lengths (each of several tables has one: _check)."""
        return [t.context_len for t in self.steps if t.context_len is not None]

    # Interpolation ------------------------------------------------------------------
    @staticmethod
    def _interp(xs: list[int], ys: list[float], bs: float) -> float:
        i = bisect.bisect_right(xs, bs)
        if i == 0:
            return ys[0]  # below the first point: no cheaper than it
        i = min(i, len(xs) - 1)  # beyond the last point: extend the last segment
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return max(y0 + (y1 - y0) * (bs - x0) / (x1 - x0), ys[0] * 0.5)

    def _time_ms(self, key: str, bs: float, context: float | None) -> float:
        tables = self.steps
        if len(tables) == 1 or context is None:  # without a context, the first table
            t = tables[0]
            return self._interp(t.batch_size, getattr(t, key), bs)
        # Between two contexts, and beyond them, linear in the context: decode reads the whole
        # KV cache, so a step's cost grows in proportion to it.
        ctx = self._contexts()
        i = min(max(bisect.bisect_right(ctx, context), 1), len(tables) - 1)
        a, b = tables[i - 1], tables[i]
        ya, yb = self._interp(a.batch_size, getattr(a, key), bs), self._interp(b.batch_size, getattr(b, key), bs)
        y = ya + (yb - ya) * (context - ctx[i - 1]) / (ctx[i] - ctx[i - 1])
        return max(y, 0.5 * min(ya, yb))

    def extrapolates(self, bs: float, context: float | None = None) -> bool:
        """True where a time would come from beyond the measured batch sizes (or context lengths)."""
        tables = self.steps[:1]
        if context is not None and len(self.steps) > 1:
            tables = self.steps
            ctx = self._contexts()
            if not ctx[0] <= context <= ctx[-1]:
                return True
        return any(bs > t.batch_size[-1] or bs < t.batch_size[0] for t in tables)

    def plain_time(self, bs: float, context: float | None = None) -> float:
        """Seconds for one plain decode step at batch size bs (requests of `context` tokens on average)."""
        return self._time_ms("plain_ms", bs, context) / 1000.0

    def catch_up_time(self, bs: float, context: float | None = None) -> float:
        """Seconds a plain step costs on top of plain_time inside a server that can switch back to
        speculating, keeping the draft's KV cache current: catchup_ms (the KV-only catch-up) when
        the profile gives it, else extend_ms (the full draft-extend the patch ran before the KV-only catch-up);
        0 when it gives neither."""
        if self.steps[0].catchup_ms is not None:
            return self._time_ms("catchup_ms", bs, context) / 1000.0
        if any(t.extend_ms is None for t in self.steps):
            return 0.0
        return self._time_ms("extend_ms", bs, context) / 1000.0

    def resume_time(self, bs: float, context: float | None = None) -> float:
        """Seconds a switch from plain to speculative steps adds once (to its first speculative
        step): the full 1-token draft forward after KV-only catch-ups.  resume_ms; 0 without it."""
        if self.steps[0].resume_ms is None:
            return 0.0
        return self._time_ms("resume_ms", bs, context) / 1000.0

    def spec_time(self, bs: float, context: float | None = None) -> float:
        """Seconds for one speculative step (draft + verify + draft-extend) at bs."""
        return self._time_ms("spec_total_ms", bs, context) / 1000.0

    @property
    def context_aware(self) -> bool:
        return len(self.steps) > 1

    def crossover_batch(self, accept_length: float | None = None, context: float | None = None,
                        up_to: int | None = None) -> int | None:
        """The smallest batch size at which a speculative step no longer pays: where it costs at
        least accept_length plain steps (it emits accept_length tokens per request, a plain step
        one).  1 when it never pays; None when it pays at every batch size up to `up_to` (default:
        the largest measured)."""
        al = self.acceptance.accept_length if accept_length is None else accept_length
        last = up_to or max(t.batch_size[-1] for t in self.steps)
        for bs in range(1, last + 1):
            if al * self.plain_time(bs, context) <= self.spec_time(bs, context):
                return bs
        return None


class _FlowNumbers(yaml.SafeDumper):
    """Lists of numbers on one line, so step tables read as tables."""


_FlowNumbers.add_representer(list, lambda d, data: d.represent_sequence(
    "tag:yaml.org,2002:seq", data, flow_style=all(isinstance(x, (int, float)) for x in data)))


def dump_profile(data: dict, comments: Sequence[str] = ()) -> str:
    """A profile (as plain data) as YAML under `# ` comment lines; one step table as a mapping."""
    if isinstance(data.get("steps"), list) and len(data["steps"]) == 1:
        data = {**data, "steps": data["steps"][0]}
    head = "".join(f"# {line}\n" for line in comments)
    return head + yaml.dump(data, Dumper=_FlowNumbers, sort_keys=False, width=100)


def shipped_profiles() -> list[str]:
    root = resources.files("dynspec.sim") / "profiles"
    if not root.is_dir():
        return []
    return sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".yaml"))


def parse_profile(data: object, src: str = "<profile>") -> Profile:
    return parse_model(Profile, data, src, ProfileError, "profile")


def _is_path(name_or_path: str | Path) -> bool:
    path = Path(name_or_path)
    return path.suffix in (".yaml", ".yml") or path.exists()


def _shipped(name: str | Path) -> Traversable:
    res = resources.files("dynspec.sim") / "profiles" / f"{name}.yaml"
    if not res.is_file():
        known = ", ".join(shipped_profiles()) or "none"
        raise ProfileError(f"{name}: no such profile (shipped: {known}; or give a path to a .yaml file)")
    return res


def load_profile(name_or_path: str | Path) -> Profile:
    """Load a shipped profile by name, or a YAML file by path."""
    if _is_path(name_or_path):
        path = Path(name_or_path)
        return parse_profile(read_yaml(path, ProfileError, "profile"), str(path))
    res = _shipped(name_or_path)
    return parse_profile(loads_yaml(res.read_text(), f"profile {name_or_path}", ProfileError), f"profile {name_or_path}")


def profile_bytes(name_or_path: str | Path) -> bytes:
    """The bytes load_profile reads for this name or path (what a provenance record hashes)."""
    if _is_path(name_or_path):
        try:
            return Path(name_or_path).read_bytes()
        except OSError as exc:
            raise ProfileError(f"{name_or_path}: cannot read ({exc.strerror or exc})") from None
    return _shipped(name_or_path).read_bytes()
