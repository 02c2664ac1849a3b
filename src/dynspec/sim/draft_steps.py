"""What a speculative step costs and accepts with K draft steps, from a profile that knows one N.

A profile's step tables are measured (or fitted) at its configured `speculative.num_steps` N.  A
server that moves among candidate step counts (SGLang 0.5.23's tiers) runs other K, so the
simulator needs their cost and acceptance too:

- cost: K draft forwards, a target verify over K+1 tokens per request, and the draft extend.
  With the parts given (draft_ms, verify_ms, extend_ms) the draft costs draft_ms / N per step,
  the verify is forward_ms[K+1] where measured, else linear in the tokens verified between the
  plain step (1 token) and verify_ms (N+1 tokens), and the extend is as measured.  With spec_ms
  alone, what a step costs beyond a plain one (draft steps and verified tokens, both linear in K)
  scales as K / N.
- acceptance: the chain model (topk 1): a request of rate r accepts its i-th draft, having
  accepted the ones before, with probability r (geometric decay, P(>= i accepted) = r^i), or,
  when the profile gives `acceptance.position_rates`, with probability position_rates[i-1]
  scaled by r / mean rate (the request's own quality; capped at 1).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dynspec.sim.profile import Profile


def spec_time_k(profile: Profile, bs: float, k: int, context: float | None = None) -> float:
    """Seconds for one speculative step with k >= 1 draft steps at batch size bs."""
    n = profile.speculative.num_steps
    if k == n:
        return profile.spec_time(bs, context)
    if k < 1:
        raise ValueError(f"a speculative step runs at least 1 draft step, got {k}")
    plain = profile._time_ms("plain_ms", bs, context)
    t = profile.steps[0]
    if t.spec_ms is None:  # the parts, each scaled by what it does
        draft = profile._time_ms("draft_ms", bs, context) * k / n
        fwd = (t.forward_ms or {}).get(k + 1)
        if fwd is not None and len(profile.steps) == 1:
            verify = profile._interp(t.batch_size, fwd, bs)
        else:
            verify = plain + (profile._time_ms("verify_ms", bs, context) - plain) * k / n
        ms = draft + max(verify, plain) + profile._time_ms("extend_ms", bs, context)
    else:
        spec = profile._time_ms("spec_total_ms", bs, context)
        ms = plain + (spec - plain) * k / n
    return max(ms, plain) / 1000.0


def chain_survival(rate: float, k: int, position_rates: list[float] | None = None,
                   mean_rate: float | None = None) -> list[float]:
    """P(at least i drafts accepted), i = 1..k, for a request of acceptance rate `rate`."""
    out, p = [], 1.0
    for i in range(k):
        if position_rates:
            q = position_rates[min(i, len(position_rates) - 1)]
            q = min(1.0, q * rate / mean_rate) if mean_rate else q
        else:
            q = rate
        p *= q
        out.append(p)
    return out


def expected_accepted(rate: float, k: int, position_rates: list[float] | None = None,
                      mean_rate: float | None = None) -> float:
    """Expected accepted drafts of a k-step chain: the sum of the survival probabilities."""
    return sum(chain_survival(rate, k, position_rates, mean_rate))
