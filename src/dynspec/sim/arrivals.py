"""When the requests of an open-loop level arrive: gamma-distributed intervals, seeded.

As vLLM's `bench serve --request-rate R --burstiness B` (and sglang.bench_serving's Poisson
arrivals, which are the case B = 1): intervals are Gamma(shape=B, scale=1/(R*B)), so their
mean is 1/R whatever B; B < 1 is burstier than Poisson, B > 1 steadier.  The first request
goes at time 0, each later one after the previous one's interval.
"""

from __future__ import annotations

import math

import numpy as np


def arrival_times(n: int, rate: float, burstiness: float = 1.0, seed: int = 0) -> list[float]:
    """Seconds from the level's start at which each of n requests arrives; all 0 for rate inf."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if not rate > 0:
        raise ValueError(f"request rate must be > 0, got {rate}")
    if not (burstiness > 0 and math.isfinite(burstiness)):
        raise ValueError(f"burstiness must be a finite number > 0, got {burstiness}")
    if math.isinf(rate):
        return [0.0] * n
    rng = np.random.default_rng(seed)
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=max(n - 1, 0))
    return [0.0] + np.cumsum(gaps).tolist() if n else []
