"""Policies built from one spec string, the same in the CLI, configs and the server's
environment (DYNSPEC_POLICY):

    always | never
    threshold:32 | threshold:on=24,off=32,dwell=50
    table:1-63=on,64-=off[,dwell=N]    (or draft steps per range: table:1-7=5,8-31=3,32-63=1,64-=0)
    sglang-default-tiers[:steps=N]
    goodput[:profile=NAME,KEY=VALUE,...]   (the keys: GoodputParams)
    goodput-k[:...]   (goodput's options; with candidate steps, also the draft length K)
    cycle:spec=2,plain=3   (a switching stress test, not a policy to deploy)
"""

from __future__ import annotations

import math
import typing

from dynspec.policy.base import Policy, PolicySpecError
from dynspec.policy.goodput import Goodput, GoodputParams
from dynspec.policy.goodput.params import spec_options
from dynspec.policy.static import Always, Cycle, Never, Table, Threshold
from dynspec.policy.step_cost import ProfileLoader, StepCost
from dynspec.policy.sync import SyncHook
from dynspec.policy.tiers import SglangTiers

POLICY_NAMES = ("always", "never", "threshold", "table", "sglang-default-tiers", "goodput", "goodput-k", "cycle")


def _int(spec: str, key: str, value: str, lo: int = 0) -> int:
    try:
        v = int(value)
    except ValueError:
        raise PolicySpecError(f"{spec!r}: {key}={value!r} is not an integer") from None
    if v < lo:
        raise PolicySpecError(f"{spec!r}: {key}={v} must be >= {lo}")
    return v


def _float(spec: str, key: str, value: str) -> float:
    try:
        v = float(value)
    except ValueError:
        raise PolicySpecError(f"{spec!r}: {key}={value!r} is not a number") from None
    if not math.isfinite(v):
        raise PolicySpecError(f"{spec!r}: {key}={value!r} is not a finite number")
    return v


def _options(spec: str, body: str, allowed: dict[str, str]) -> dict[str, str]:
    """Parse 'k=v,k=v' checking every key against `allowed` (key -> description)."""
    out: dict[str, str] = {}
    for part in body.split(","):
        if "=" not in part:
            raise PolicySpecError(f"{spec!r}: expected key=value, got {part!r}")
        key, value = (s.strip() for s in part.split("=", 1))
        if key not in allowed:
            raise PolicySpecError(f"{spec!r}: unknown option {key!r} (known: {', '.join(allowed)})")
        if key in out:
            raise PolicySpecError(f"{spec!r}: option {key!r} given twice")
        if not value:
            raise PolicySpecError(f"{spec!r}: option {key!r} has no value")
        out[key] = value
    return out


def _threshold(spec: str, body: str) -> Threshold:
    if not body:
        raise PolicySpecError(f"{spec!r}: threshold needs a batch size, e.g. threshold:32")
    if "=" not in body:
        n = _int(spec, "threshold", body, lo=0)
        return Threshold(n, n)
    o = _options(spec, body, {"on": "", "off": "", "dwell": ""})
    if "on" not in o and "off" not in o:
        raise PolicySpecError(f"{spec!r}: threshold needs on= and/or off=")
    on = _int(spec, "on", o.get("on", o.get("off", "0")))
    off = _int(spec, "off", o.get("off", o.get("on", "0")))
    if off < on:
        raise PolicySpecError(f"{spec!r}: off={off} is below on={on}; hysteresis needs on <= off")
    dwell = _int(spec, "dwell", o["dwell"]) if "dwell" in o else 16
    return Threshold(on, off, dwell)


def _table(spec: str, body: str) -> Table:
    if not body:
        raise PolicySpecError(f"{spec!r}: table needs ranges, e.g. table:1-63=on,64-=off")
    ranges: list[tuple[int, int | None, bool | int]] = []
    dwell = 0
    for part in body.split(","):
        if "=" not in part:
            raise PolicySpecError(f"{spec!r}: expected RANGE=on|off, got {part!r}")
        key, value = (s.strip() for s in part.split("=", 1))
        if key == "dwell":
            dwell = _int(spec, "dwell", value)
            continue
        on: bool | int
        if value in ("on", "off"):
            on = value == "on"
        elif value.isdigit():  # draft steps (0: off)
            on = int(value)
        else:
            raise PolicySpecError(f"{spec!r}: range {key!r} must be =on or =off (or =K draft steps), got {value!r}")
        lo_s, dash, hi_s = key.partition("-")
        lo = _int(spec, "range start", lo_s, lo=1)
        hi = (_int(spec, "range end", hi_s, lo=1) if hi_s else None) if dash else lo
        if hi is not None and hi < lo:
            raise PolicySpecError(f"{spec!r}: range {key!r} ends before it starts")
        ranges.append((lo, hi, on))
    if not ranges:
        raise PolicySpecError(f"{spec!r}: table has no ranges")
    ranges.sort(key=lambda r: r[0])
    expect: int | None = 1  # the next batch size to cover; None after an open-ended range
    for lo, hi, _ in ranges:
        if expect is None:
            raise PolicySpecError(f"{spec!r}: range starting at {lo} follows an open-ended range")
        if lo != expect:
            what = "overlap" if lo < expect else f"a gap at batch sizes {expect}-{lo - 1}"
            raise PolicySpecError(f"{spec!r}: ranges have {what}")
        expect = None if hi is None else hi + 1
    if expect is not None:
        raise PolicySpecError(f"{spec!r}: table does not cover batch sizes {expect}- (end with an open range like {expect}-=off)")
    return Table(ranges, dwell)


_GOODPUT_KNOBS = spec_options()  # option -> (GoodputParams field, what it means)
_GOODPUT_OPTS = {"profile": "step-cost profile (name or path)", **{k: h for k, (_, h) in _GOODPUT_KNOBS.items()}}
_KNOB_TYPES = typing.get_type_hints(GoodputParams)


def _goodput(spec: str, body: str, profile: StepCost | None, sync: SyncHook | None,
             window: int | None = None, load_profile: ProfileLoader | None = None) -> Goodput:
    o = _options(spec, body, _GOODPUT_OPTS) if body else {}
    if "profile" in o:
        if load_profile is None:
            raise PolicySpecError(f"{spec!r}: profile={o['profile']} cannot be loaded here (no profile loader)")
        try:
            profile = load_profile(o["profile"])
        except ValueError as exc:
            raise PolicySpecError(f"{spec!r}: {exc}") from None
    kw: dict[str, typing.Any] = {}
    # Integers first, then numbers, then switches: with several bad options, the first named.
    for kind in (int, float, bool):
        for key, (name, _) in _GOODPUT_KNOBS.items():
            if key not in o or _KNOB_TYPES[name] is not kind:
                continue
            if kind is int:
                kw[name] = _int(spec, key, o[key])
            elif kind is float:
                kw[name] = _float(spec, key, o[key])
            else:
                if o[key] not in ("0", "1"):
                    raise PolicySpecError(f"{spec!r}: {key} must be 0 or 1, got {o[key]!r}")
                kw[name] = o[key] == "1"
    if "window" not in kw and window is not None:
        kw["window"] = window
    if profile is None and not kw.get("use_times", True):
        raise PolicySpecError(f"{spec!r}: goodput with times=0 needs a profile")
    return Goodput(profile, sync=sync, spec_text=spec, **kw)


def build_policy(spec: str, *, profile: StepCost | None = None, sync: SyncHook | None = None,
                 initial_steps: int = 3, window: int | None = None,
                 load_profile: ProfileLoader | None = None) -> Policy:
    """Build a policy from its spec string; raise PolicySpecError naming the bad part.  `window`:
    the decisions a result's interval can hold where the caller knows it (a live server's
    overlap scheduler: 3), unless the spec names one.  `load_profile` resolves a profile the spec
    names (goodput:profile=NAME)."""
    if not isinstance(spec, str) or not spec.strip():
        raise PolicySpecError("empty policy spec (try: goodput, threshold:32, table:1-63=on,64-=off)")
    spec = spec.strip()
    name, _, body = spec.partition(":")
    name, body = name.strip(), body.strip()
    if name in ("always", "never"):
        if body:
            raise PolicySpecError(f"{spec!r}: {name} takes no options")
        return Always() if name == "always" else Never()
    if name == "threshold":
        return _threshold(spec, body)
    if name == "table":
        return _table(spec, body)
    if name == "sglang-default-tiers":
        o = _options(spec, body, {"steps": "initial speculative_num_steps"}) if body else {}
        return SglangTiers(_int(spec, "steps", o.get("steps", str(initial_steps)), lo=1))
    if name == "goodput":
        return _goodput(spec, body, profile, sync, window, load_profile)
    if name == "goodput-k":
        from dynspec.policy.goodput.steps import GoodputK

        return GoodputK(_goodput(spec, body, profile, sync, window, load_profile), spec_text=spec)
    if name == "cycle":
        o = _options(spec, body, {"spec": "speculative steps per cycle", "plain": "plain steps per cycle"}) \
            if body else {}
        return Cycle(_int(spec, "spec", o.get("spec", "1"), lo=1), _int(spec, "plain", o.get("plain", "1"), lo=1))
    raise PolicySpecError(f"{spec!r}: unknown policy {name!r} (known: {', '.join(POLICY_NAMES)})")


def check_spec(spec: str, *, load_profile: ProfileLoader | None = None) -> str:
    """Validate a spec; return the normalized spec string or raise PolicySpecError."""
    return build_policy(spec, load_profile=load_profile).spec()
