"""Draft length K in the simulator: a step's cost by K, the chain cut at K, per-position acceptance,
and the policy interface that answers a step count (Policy.decide_steps)."""

from __future__ import annotations

import math

import pytest

from dynspec.policy import Always, FailSafePolicy, Policy, StepRecord
from dynspec.sim.draft_steps import chain_survival, spec_time_k
from dynspec.sim.engine import Engine
from dynspec.sim.profile import parse_profile
from tests.test_engine import make_profile, run


def parts_profile(**over):
    steps = {"batch_size": [1, 64], "plain_ms": [10.0, 40.0], "draft_ms": [3.0, 9.0],
             "verify_ms": [11.0, 70.0], "extend_ms": [1.0, 4.0]}
    p = make_profile()
    data = p.model_dump(mode="json", exclude_none=True)
    data["steps"] = {**steps, **over}
    return parse_profile(data)


class FixedK(Policy):
    """Answers the same step count every step; keeps what it is shown."""

    def __init__(self, k: int):
        self.k, self.records = k, []

    def decide(self, batch_size):
        return self.k > 0

    def decide_steps(self, batch_size):
        return self.k

    def observe(self, rec):
        self.records.append(rec)


def test_spec_time_is_the_profiles_at_its_own_n_and_grows_with_k():
    for p in (make_profile(), parts_profile()):
        assert spec_time_k(p, 8, 3) == p.spec_time(8)  # N = 3: as measured, exactly
        ts = [spec_time_k(p, 64, k) for k in (1, 2, 3, 5, 7)]
        assert all(a < b for a, b in zip(ts, ts[1:])), ts
        assert ts[0] > p.plain_time(64)


def test_spec_only_profile_scales_the_overhead_over_plain_with_k():
    p = make_profile()  # bs 64: plain 40 ms, spec(N=3) 90 ms: 50 ms for 3 steps
    assert spec_time_k(p, 64, 1) == pytest.approx((40 + 50 / 3) / 1000)
    assert spec_time_k(p, 64, 6) == pytest.approx((40 + 100) / 1000)


def test_parts_profile_scales_draft_per_step_and_verify_per_token():
    p = parts_profile()  # bs 1: plain 10, draft 3 (3 steps), verify 11 over 4 tokens, extend 1
    # K = 1: one draft step (1 ms), verify over 2 tokens (10 + 1/3), extend 1
    assert spec_time_k(p, 1, 1) == pytest.approx((1.0 + 10 + 1 / 3 + 1.0) / 1000)
    # a measured forward over K+1 tokens is the verify
    q = parts_profile(forward_ms={2: [20.0, 60.0]})
    assert spec_time_k(q, 1, 1) == pytest.approx((1.0 + 20.0 + 1.0) / 1000)


def test_engine_runs_the_policys_k_at_its_cost_and_cuts_the_chain_there():
    p = make_profile(acceptance={"accept_length": 3.5, "concentration": 50})
    got = {}
    for k in (1, 3, 5):
        pol = FixedK(k)
        eng = Engine(p, pol, seed=1, candidate_steps=[0, 1, 3, 5])
        for _ in range(8):
            eng.submit(16, 400)
        steps = [s for s in run(eng) if s.kind == "decode"]
        assert all(r.steps == k and r.speculated for r in pol.records)
        assert max(max(r.accepted) for r in pol.records) == k  # the chain stops at K drafts
        # each step costs K's time at its batch size (the first after none: no resume here)
        assert all(math.isclose(s.duration, spec_time_k(p, s.batch_size, k)) for s in steps)
        got[k] = sum(sum(r.accepted) for r in pol.records) / sum(len(r.accepted) for r in pol.records)
        assert eng.stats.mean_draft_steps == k
    r = eng.mean_rate
    for k, acc in got.items():  # requests alike (concentration 50): about r + ... + r^k
        assert acc == pytest.approx(sum(chain_survival(r, k)), rel=0.08), (k, acc)
    assert got[1] < got[3] < got[5]


def test_engine_k0_is_a_plain_step_and_legacy_records_carry_no_k():
    p = make_profile()
    pol = FixedK(0)
    eng = Engine(p, pol, candidate_steps=[0, 3])
    eng.submit(16, 20)
    run(eng)
    assert pol.records and all(not r.speculated and r.steps == 0 for r in pol.records)
    rec = []
    legacy = Always()
    legacy.observe = rec.append  # type: ignore[method-assign]
    eng = Engine(p, legacy)
    eng.submit(16, 20)
    run(eng)
    assert rec and all(r.steps is None for r in rec)  # one N: records as before


def test_position_rates_shape_the_chain():
    # The second position is rarely accepted: of chains reaching it, about 1 in 5 go on.
    p = make_profile(acceptance={"accept_length": 2.0, "concentration": 200, "position_rates": [0.9, 0.2]})
    pol = FixedK(3)
    eng = Engine(p, pol, seed=3, candidate_steps=[0, 3])
    for _ in range(8):
        eng.submit(16, 400)
    run(eng)
    acc = [a for r in pol.records for a in r.accepted]
    ge1, ge2 = sum(a >= 1 for a in acc), sum(a >= 2 for a in acc)
    scale = 1.0  # concentration 200: requests near the mean rate
    assert ge1 / len(acc) == pytest.approx(0.9 * scale, abs=0.05)
    assert ge2 / ge1 == pytest.approx(0.2, abs=0.05)


def test_position_rates_are_checked():
    from dynspec.sim.profile import ProfileError

    with pytest.raises(ProfileError, match="position_rates"):
        make_profile(acceptance={"accept_length": 2.0, "position_rates": [0.5, 1.5]})


def test_default_decide_steps_is_the_on_off_decision_at_on_steps():
    pol = Always()
    pol.set_candidate_steps([7, 0, 3, 1, 5], on_steps=4)
    assert pol.candidate_steps == (0, 1, 3, 5, 7)
    assert pol.on_steps == 5  # nearest candidate to 4, the larger on a tie
    assert pol.decide_steps(1) == 5
    with pytest.raises(ValueError, match="above 0"):
        Always().set_candidate_steps([0], 3)


def test_failsafe_falls_back_to_on_steps_on_a_step_count_it_cannot_run():
    class Bad(FixedK):
        pass

    f = FailSafePolicy(Bad(4))
    f.set_candidate_steps([0, 1, 3], 3)
    assert f.decide_steps(1) == 3 and f.failed
    g = FailSafePolicy(FixedK(1))
    g.set_candidate_steps([0, 1, 3], 3)
    assert g.decide_steps(1) == 1 and not g.failed
    g.observe(StepRecord(1, True, (1,), 0.01, None, True, 1))
    assert g.inner.records[-1].steps == 1


# --- policies answering a step count ------------------------------------------------------------

def test_a_k_table_answers_its_ranges_steps_and_on_off_tables_stay_on_off():
    from dynspec.policy import PolicySpecError, build_policy

    t = build_policy("table:1-7=5,8-31=3,32-63=1,64-=0")
    t.set_candidate_steps([0, 1, 3, 5, 7], 3)
    assert [t.decide_steps(b) for b in (1, 7, 8, 31, 32, 63, 64, 500)] == [5, 5, 3, 3, 1, 1, 0, 0]
    assert build_policy(t.spec()).spec() == t.spec()
    t2 = build_policy("table:1-4=4,5-=on")  # 4 is no candidate: the nearest (5); on: the server's own
    t2.set_candidate_steps([0, 1, 3, 5, 7], 3)
    assert t2.decide_steps(1) == 5 and t2.decide_steps(9) == 3
    onoff = build_policy("table:1-63=on,64-=off")
    onoff.set_candidate_steps([0, 1, 3, 5, 7], 5)
    assert onoff.decide_steps(63) == 5 and onoff.decide_steps(64) == 0
    with pytest.raises(PolicySpecError, match="or =K draft steps"):
        build_policy("table:1-=many")


def test_sglang_tiers_move_k_with_acceptance_in_the_simulator():
    from dynspec.policy import SglangTiers

    for accept_length, want in ((4.6, 7), (1.2, 1)):  # drafts nearly always right / nearly never
        p = make_profile(speculative={"num_steps": 5, "num_draft_tokens": 6},
                         acceptance={"accept_length": accept_length, "concentration": 50})
        pol = SglangTiers(initial_steps=3)
        eng = Engine(p, pol, candidate_steps=[0, 1, 3, 5, 7])
        eng.submit(16, 600)  # batch 1: tier 1's candidates 1, 3, 5, 7
        run(eng)
        assert pol.decide_steps(1) == want
    pol = SglangTiers(initial_steps=3)
    pol.set_candidate_steps([0, 2, 4], 3)  # a server without the tier's 3: the nearest, larger
    assert pol.decide_steps(1) == 4 and pol.decide_steps(100) == 0
