"""Goodput, dynspec's own policy, in parts: parameters, acceptance estimates, prefill
accounting, step times and the decision, each a class the next one builds on."""

from dynspec.policy.goodput.params import GoodputConstants, GoodputParams
from dynspec.policy.goodput.policy import Goodput

__all__ = ["Goodput", "GoodputConstants", "GoodputParams"]
