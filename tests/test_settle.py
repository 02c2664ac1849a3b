"""settle.factors: what each draft length's batch settles into, where requests accept differently."""

from __future__ import annotations

import numpy as np
import pytest

from dynspec.policy.goodput.settle import factors


def _beta_batch(mean: float, conc: float, c: int, n: int = 400_000):
    """Requests' acceptance drawn from a Beta at arrival; the batch settled at c holds each in
    proportion to 1 / tau_c.  Returns the batch's first two moments of p and, per K, the batch's
    tokens per request-step settled at K over the batch-at-c's mean of tau_K (the truth)."""
    p = np.random.default_rng(0).beta(mean * conc, (1 - mean) * conc, n)

    def tau(k):
        return (1 - p ** (k + 1)) / (1 - p)

    w = 1 / tau(c)
    w /= w.sum()
    truth = {k: (1 / np.mean(1 / tau(k))) / float((w * tau(k)).sum()) for k in (1, 3, 5, 7)}
    return float((w * p).sum()), float((w * p * p).sum()), truth


@pytest.mark.parametrize("mean,conc,c", [(0.65, 7, 5), (0.65, 7, 3), (0.75, 7, 5), (0.5, 27, 3)])
def test_factors_match_the_batch_a_beta_of_requests_settles_into(mean, conc, c):
    s1, s2, truth = _beta_batch(mean, conc, c)
    f = factors(s1, s2, c, [1, 3, 5, 7])
    assert f[c] == 1.0
    for k in (1, 3, 5, 7):
        assert f[k] == pytest.approx(truth[k], abs=0.002)
    # a batch settled at a long chain holds the slow requests: shorter chains read low there
    assert all(f[k] > 1.0 for k in (1, 3, 5, 7) if k < c) and all(f[k] < 1.0 for k in (1, 3, 5, 7) if k > c)


def test_requests_alike_or_deeper_drafts_accepting_less_leave_the_estimates_alone():
    assert factors(0.6, 0.36, 5, [1, 3, 5, 7]) == {1: 1.0, 3: 1.0, 5: 1.0, 7: 1.0}  # no spread
    assert factors(0.6, 0.30, 5, [1, 3, 5, 7]) == {1: 1.0, 3: 1.0, 5: 1.0, 7: 1.0}  # S2 < S1^2
    assert factors(0.0, 0.0, 3, [1, 3]) == {1: 1.0, 3: 1.0}
