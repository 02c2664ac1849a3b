"""Which arm of a run is which: a plain server, an always-speculating one, or one that switches.

One rule for the report, tune and everything that reads results: an arm's policy column says it
("none": a server without a drafter, "never": a policy that declines -> plain; "always" ->
speculating; any other policy switches).  Results without a policy (imported by hand, from
sglang.bench_serving or vLLM) fall back on the arm's name."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

Role = Literal["plain", "spec", "switching"]
PLAIN_POLICIES = frozenset({"none", "never"})
SPEC_POLICIES = frozenset({"always"})
# The simulator's and emulator's named arms and the policy each runs (None: no drafter); any
# other arm is written policy:SPEC.
ARM_POLICIES = {"baseline": None, "eagle3": "always", "dynamic": "goodput"}
SIM_ARMS = tuple(ARM_POLICIES)
PLAIN_NAMES = frozenset({"baseline", "plain", "nospec", "none", "never"})
SPEC_NAMES = frozenset({"eagle3", "eagle-3", "eagle", "spec", "always"})


def role(arm: str, policies: Iterable = ()) -> Role | None:
    """The arm's role from the policies its rows carry, else from its name; None if neither says."""
    pols = {str(p).strip().lower() for p in policies} - {"", "nan"}
    if pols:
        if pols <= PLAIN_POLICIES:
            return "plain"
        if pols <= SPEC_POLICIES:
            return "spec"
        return "switching"
    name = str(arm).strip().lower()
    return "plain" if name in PLAIN_NAMES else "spec" if name in SPEC_NAMES else None


def arms_by_role(df: Any) -> dict[str, Role | None]:  # a pandas DataFrame (no stubs here)
    """{arm: role} for a results or levels table (columns arm and, if present, policy)."""
    out = {}
    for arm in sorted({str(a) for a in df["arm"]}):
        pols = df.loc[df["arm"].astype(str) == arm, "policy"] if "policy" in df else ()
        out[arm] = role(arm, pols)
    return out
