"""The batch a draft length settles into, where requests accept differently.

A request stays in the batch for its output over the tokens a step gives it, so the batch holds
requests in proportion to 1 / tau_K(p), tau_K(p) = 1 + p + ... + p^K the tokens a step at K gives a
request that accepts each draft with probability p (the chain model).  Steadily at K, the batch's
tokens per request-step are then the harmonic mean H_K = 1 / E_arrivals[1 / tau_K].

The position counts are read from the batch as it is, settled at the running K = c, so they
describe the arrivals reweighted by 1 / tau_c: for c itself they give H_c exactly, but for any
other K they give E_batch[tau_K], not H_K.  Requests that accept much finish fast under a long
chain, so a batch settled at c = 5 holds more slow requests than one at K = 3 would: K = 3 reads
about 2% low there, and K = 5 about 3% high from c = 3 (Beta-distributed p of concentration 7).
Since E_arrivals[1 / tau_K] = E_batch[tau_c / tau_K] / H_c, H_K = H_c / E_batch[tau_c / tau_K].

The batch's p is taken as a Beta with the first two moments the position counts give
(E_batch[p] = S_1, E_batch[p^2] = S_2), integrated on a grid; `factors` returns H_K / E_batch[tau_K]
per K under that model, 1 at K = c and everywhere when requests do not differ.
"""

from __future__ import annotations

import math

GRID = 32  # midpoints of p in (0, 1)
KMAX = 16  # the longest chain tabulated
_P = [(i + 0.5) / GRID for i in range(GRID)]
_LOG_P = [math.log(p) for p in _P]
_LOG_Q = [math.log(1.0 - p) for p in _P]
_TAU = [[(1.0 - p ** (k + 1)) / (1.0 - p) for p in _P] for k in range(KMAX + 1)]  # tau_K at each p


def factors(s1: float, s2: float, c: int, ks: list[int]) -> dict[int, float]:
    """H_K / E_batch[tau_K] for each K in ks, the batch settled at c, its p Beta with mean s1 and
    second moment s2; 1 for all where the two say the requests do not differ."""
    var = s2 - s1 * s1
    ones = {k: 1.0 for k in ks}
    if not 0.0 < s1 < 1.0 or var <= 1e-6 * s1 * (1.0 - s1) or c > KMAX or max(ks) > KMAX:
        return ones
    t = s1 * (1.0 - s1) / var - 1.0  # a + b
    if t <= 0.0:
        return ones
    a, b = s1 * t - 1.0, (1.0 - s1) * t - 1.0
    logs = [a * lp + b * lq for lp, lq in zip(_LOG_P, _LOG_Q)]
    top = max(logs)
    w = [math.exp(x - top) for x in logs]
    total = sum(w)
    wc = [wi * x for wi, x in zip(w, _TAU[c])]
    h_c = sum(wc) / total  # E_batch[tau_c]
    out = {}
    for k in ks:
        tk = _TAU[k]
        e_tau = sum(wi * x for wi, x in zip(w, tk)) / total  # E_batch[tau_K]
        e_ratio = sum(x / y for x, y in zip(wc, tk)) / total  # E_batch[tau_c / tau_K]
        out[k] = 1.0 if k == c else h_c / e_ratio / e_tau
    return out
