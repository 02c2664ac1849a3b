"""Draft acceptance across requests: a Beta spread of per-request rates, and SGLang's accept length.

Each request draws its own draft-acceptance rate r ~ Beta(mean, concentration); a chain of
num_steps drafts (topk 1, each accepted with probability r until the first rejection) then
emits 1 + r + ... + r^num_steps tokens per verify on average.  What SGLang reports
(avg_spec_accept_length) is the step-weighted average over requests: `expected_accept_length`.
`solve_mean_rate` inverts it, so a profile's accept length fixes the mean rate.  Used by the
engine (which draws the rates) and by profiles (which check their acceptance can be reached).
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # at run time numpy is imported where used, on first use
    import numpy as np


def _beta_grid(mean_rate: float, concentration: float, n: int = 6000) -> tuple[np.ndarray, np.ndarray]:
    """Points of (0, 1) and their Beta(mean_rate, concentration) probabilities.

    The grid is uniform in logit(x), where the density times dx = x^a (1-x)^b has no
    singularity, so mass piled against 0 or 1 (small a or b) is still integrated well.
    """
    import numpy as np

    a, b = mean_rate * concentration, (1.0 - mean_rate) * concentration
    u = np.linspace(-40.0, 40.0, n)
    logx, log1mx = -np.logaddexp(0.0, -u), -np.logaddexp(0.0, u)
    logw = a * logx + b * log1mx
    w = np.exp(logw - logw.max())
    return np.exp(logx), w / w.sum()


def expected_accept_length(mean_rate: float, concentration: float, num_steps: int) -> float:
    """SGLang's avg_spec_accept_length for a population of requests with r ~ Beta.

    A request with rate r emits m(r) = 1 + r + ... + r^num_steps tokens per verify
    step on average, so it takes output/m(r) steps: the per-step average that SGLang
    reports (sums over requests and steps) is the harmonic mean of m(r).
    """
    if mean_rate <= 0.0:
        return 1.0
    if mean_rate >= 1.0:
        return 1.0 + num_steps
    x, w = _beta_grid(mean_rate, concentration)
    m = sum(x ** k for k in range(num_steps + 1))
    return float(1.0 / (w / m).sum())


# Requests' rates are drawn at quantiles u_k = (phase + k * GOLDEN) mod 1 (a low-discrepancy
# sequence): a few dozen requests already cover the Beta spread evenly.
GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0


@lru_cache(maxsize=64)
def beta_quantile_table(mean_rate: float, concentration: float) -> tuple[list[float], list[float]]:
    """(CDF, x) of Beta(mean_rate, concentration) on the logit grid; empty at the edges 0 and 1."""
    if not 0.0 < mean_rate < 1.0:
        return [], []
    import numpy as np

    x, w = _beta_grid(mean_rate, concentration)
    return (np.cumsum(w) - 0.5 * w).tolist(), x.tolist()  # each point at the middle of its mass


@lru_cache(maxsize=64)
def solve_mean_rate(accept_length: float, concentration: float, num_steps: int) -> float:
    """The mean per-draft acceptance rate that gives this step-weighted accept length."""
    if not 1.0 <= accept_length <= 1.0 + num_steps:
        raise ValueError(f"accept length {accept_length} is outside 1..1+num_steps={1 + num_steps}")
    lo, hi = 0.0, 1.0
    for _ in range(40):  # bisection: the accept length rises monotonically with the mean rate
        mid = 0.5 * (lo + hi)
        if expected_accept_length(mid, concentration, num_steps) < accept_length:
            lo = mid
        else:
            hi = mid
    rate = 0.5 * (lo + hi)
    got = expected_accept_length(rate, concentration, num_steps)
    if abs(got - accept_length) > 1e-3 * accept_length:
        raise ValueError(f"accept length {accept_length} is out of reach with {num_steps} draft steps and "
                         f"acceptance concentration {concentration} (requests this unlike each other reach "
                         f"about {got:.2f}): raise acceptance.concentration")
    return rate
