"""The step engine: acceptance model, batching, policy feedback, determinism."""

from __future__ import annotations

import math

import pytest

from dynspec.sim.acceptance import expected_accept_length, solve_mean_rate
from dynspec.sim.engine import Engine
from dynspec.policy import Policy, StepRecord, build_policy
from dynspec.sim.profile import parse_profile


def make_profile(**over):
    data = {
        "name": "t",
        "speculative": {"num_steps": 3},
        "acceptance": {"accept_length": 2.5, "concentration": 10},
        "steps": {"batch_size": [1, 8, 64], "plain_ms": [10.0, 12.0, 40.0], "spec_ms": [15.0, 20.0, 90.0]},
        "prefill": {"fixed_ms": 5.0, "per_token_ms": 0.01, "chunk_tokens": 512},
        "provenance": {"kind": "derived", "source": "test"},
    }
    for k, v in over.items():
        data[k] = {**data[k], **v} if isinstance(v, dict) else v
    return parse_profile(data)


def run(engine: Engine, max_steps: int = 10**6) -> list:
    steps = []
    while (s := engine.step()) is not None and len(steps) < max_steps:
        steps.append(s)
    return steps


class Recorder(Policy):
    """Speculates while batch <= limit; keeps every StepRecord it is shown."""

    def __init__(self, limit: int):
        self.limit, self.records = limit, []

    def decide(self, batch_size):
        return batch_size <= self.limit

    def observe(self, rec):
        self.records.append(rec)


@pytest.mark.parametrize("steps,conc", [(1, 5.0), (3, 10.0), (5, 2.0), (7, 50.0)])
def test_solved_rate_reproduces_accept_length(steps, conc):
    for target in (1.2, 1.0 + steps / 2, 0.5 + steps):
        r = solve_mean_rate(target, conc, steps)
        assert 0 < r < 1
        assert expected_accept_length(r, conc, steps) == pytest.approx(target, rel=1e-6)


def test_accept_length_rises_with_rate_and_is_bounded():
    xs = [expected_accept_length(r / 10, 10, 3) for r in range(11)]
    assert xs[0] == 1.0 and xs[-1] == 4.0
    assert all(a < b for a, b in zip(xs, xs[1:]))


def test_long_run_accept_length_matches_profile():
    # Many long requests speculating every step: the engine's SGLang-style average
    # (tokens per request per verify step) must land on the profile's accept length.
    p = make_profile()
    eng = Engine(p, build_policy("always"), seed=3)
    for _ in range(200):
        eng.submit(16, 400)
    run(eng)
    assert eng.stats.accept_length == pytest.approx(2.5, rel=0.04)


def test_requests_get_exactly_their_tokens_and_spec_steps_stay_in_bounds():
    p = make_profile()
    eng = Engine(p, build_policy("always"), seed=1)
    reqs = [eng.submit(100, n) for n in (1, 2, 3, 17, 64)]
    steps = run(eng)
    for r in reqs:
        assert r.generated == r.output_len and r.finished
        assert r.first_token_time <= r.last_token_time == r.finish_time
    decode = [s for s in steps if s.kind == "decode"]
    assert all(s.speculated for s in decode)
    assert eng.stats.tokens_out == sum(r.output_len for r in reqs)
    # No request ever got more than num_steps + 1 tokens from one verify step.
    assert all(r.spec_tokens <= r.spec_steps * 4 for r in reqs)


def test_policy_sees_batch_sizes_accepted_counts_and_profile_step_times():
    p = make_profile()
    pol = Recorder(limit=2)
    eng = Engine(p, pol, seed=0)
    for n in (20, 30, 50, 50):
        eng.submit(10, n)
    steps = run(eng)
    decode = [s for s in steps if s.kind == "decode"]
    assert len(pol.records) == len(decode)
    for s, rec in zip(decode, pol.records):
        assert isinstance(rec, StepRecord)
        assert rec.batch_size == s.batch_size
        assert rec.speculated == (s.batch_size <= 2) == s.speculated
        want = p.spec_time(s.batch_size) if rec.speculated else p.plain_time(s.batch_size)
        assert rec.step_time_s == pytest.approx(want) == pytest.approx(s.duration)
        if rec.speculated:
            assert len(rec.accepted) == rec.batch_size
            assert all(0 <= k <= 3 for k in rec.accepted)
        else:
            assert rec.accepted == ()
    assert eng.stats.switches >= 1  # it went plain at 4 and back to spec as requests finished


def test_prefill_is_chunked_and_goes_before_decode():
    p = make_profile()  # chunk 512 tokens
    eng = Engine(p, None)
    a = eng.submit(100, 5)
    s1 = eng.step()
    assert s1.kind == "prefill" and s1.batch_size == 100 and s1.emitted == [a]
    assert a.generated == 1 and a.first_token_time == pytest.approx(p.prefill.time_s(100))
    b = eng.submit(1200, 3)  # arrives while a decodes: 3 chunks of at most 512 tokens
    kinds = [eng.step() for _ in range(3)]
    assert [s.kind for s in kinds] == ["prefill"] * 3
    assert [s.batch_size for s in kinds] == [512, 512, 176]
    assert b.generated == 1 and a.generated == 1  # a waited: prefill first
    assert eng.step().kind == "decode"


def test_baseline_times_are_plain_and_extrapolation_is_flagged():
    p = make_profile()
    eng = Engine(p, None)
    for _ in range(80):
        eng.submit(1, 3)
    steps = run(eng)
    decode = [s for s in steps if s.kind == "decode"]
    assert decode and all(not s.speculated for s in decode)
    assert all(s.extrapolated == (s.batch_size > 64) for s in decode)
    assert eng.stats.steps_extrapolated == sum(s.extrapolated for s in decode) > 0
    assert decode[0].duration == pytest.approx(p.plain_time(80))


def test_same_seed_same_run_other_seed_other_run():
    p = make_profile()

    def trace(seed):
        eng = Engine(p, build_policy("goodput"), seed=seed)
        for _ in range(6):
            eng.submit(50, 80)
        return [(s.kind, s.batch_size, s.speculated, round(s.end, 12)) for s in run(eng)], eng.stats.tokens_out

    assert trace(7) == trace(7)
    assert trace(7)[0] != trace(8)[0]


def test_abort_drops_a_request_everywhere():
    p = make_profile()
    eng = Engine(p, None)
    a, b, c = eng.submit(10, 100), eng.submit(10, 100), eng.submit(10, 100)
    eng.step()  # prefill of all three
    eng.abort(b)
    eng.abort(b)  # twice is harmless
    s = eng.step()
    assert s.batch_size == 2 and b not in s.emitted
    d = eng.submit(10, 5)
    eng.abort(d)  # still waiting
    assert d not in eng.waiting and eng.stats.requests_aborted == 2
    run(eng)
    assert a.finished and c.finished and not b.finished


def test_max_running_requests_caps_the_batch():
    p = make_profile()
    eng = Engine(p, None, max_running_requests=3)
    for _ in range(7):
        eng.submit(10, 20)
    steps = run(eng)
    assert max(s.batch_size for s in steps if s.kind == "decode") == 3
    assert eng.stats.requests_finished == 7


def test_bad_arguments_are_refused():
    p = make_profile()
    with pytest.raises(ValueError, match="max_running_requests"):
        Engine(p, None, max_running_requests=0)
    with pytest.raises(ValueError, match="input_len"):
        Engine(p, None).submit(0, 5)
    with pytest.raises(ValueError, match="accept length"):
        solve_mean_rate(5.0, 10, 3)
    with pytest.raises(ValueError, match="out of reach.*concentration"):
        solve_mean_rate(5.95, 0.5, 5)  # requests so unlike that the mean cannot get there
    assert math.isnan(Engine(p, None).stats.accept_length)


def test_step_times_follow_the_batchs_context_when_the_profile_has_several():
    """Two tables, 10 ms at context 1000 and 30 ms at 3000 (any batch): a batch whose requests hold
    about 2000 tokens steps in about 20 ms, and one past 3000 is flagged as extrapolated."""
    tables = [{"context_len": c, "batch_size": [1, 64], "plain_ms": [ms, ms], "spec_ms": [2 * ms, 2 * ms]}
              for c, ms in ((1000, 10.0), (3000, 30.0))]
    p = make_profile(steps=tables)
    eng = Engine(p, None)
    eng.submit(1990, 40)
    eng.submit(2010, 40)
    decode = [s for s in run(eng) if s.kind == "decode"]
    # mean context of the first decode step: (1991 + 2011) / 2 = 2001, rounded to 16 tokens -> 2000;
    # of the last, with 39 tokens generated each: (2029 + 2049) / 2 = 2039 -> 2032
    assert decode[0].duration == pytest.approx(0.020, abs=1e-4)
    assert decode[-1].duration == pytest.approx(0.02032, abs=1e-6) and not decode[0].extrapolated
    eng = Engine(p, None)
    eng.submit(3500, 3)
    decode = [s for s in run(eng) if s.kind == "decode"]
    assert decode[0].extrapolated and decode[0].duration == pytest.approx(0.010 + 0.020 * 2501 / 2000, rel=1e-2)
    # a one-table profile ignores the context: the same step time at any prompt length
    one = make_profile()
    times = []
    for n in (100, 5000):
        eng = Engine(one, None)
        eng.submit(n, 2)
        times.append([s.duration for s in run(eng) if s.kind == "decode"][0])
    assert times[0] == times[1] == pytest.approx(one.plain_time(1))


def test_a_switching_servers_plain_steps_pay_the_draft_catch_up():
    """Inside a server that can speculate, a plain step also runs the draft-extend that keeps the
    draft current (extend_ms); the plain server does not, and catch_up=False is the what-if."""
    p = make_profile(steps={"batch_size": [1, 8, 64], "plain_ms": [10.0, 12.0, 40.0], "spec_ms": [15.0, 20.0, 90.0],
                            "extend_ms": [1.0, 1.5, 4.0]})
    assert p.catch_up_time(8) == pytest.approx(0.0015) and make_profile().catch_up_time(8) == 0.0

    def first_decode(policy, **kw):
        eng = Engine(p, policy, **kw)
        for _ in range(8):
            eng.submit(4, 3)
        return [s for s in run(eng) if s.kind == "decode"][0]

    never = build_policy("never")
    assert first_decode(None).duration == pytest.approx(0.012)  # the plain server
    assert first_decode(never).duration == pytest.approx(0.0135)  # plain + catch-up
    assert first_decode(build_policy("never"), catch_up=False).duration == pytest.approx(0.012)
    assert first_decode(build_policy("always")).duration == pytest.approx(0.020)  # a speculative step: no extra


def test_a_switch_to_speculating_pays_the_resume_once_after_a_kv_only_catch_up():
    """With catchup_ms/resume_ms a plain step of a switching server pays the KV-only catch-up, and
    the first speculative step after plain ones pays one resume; later speculative steps, the
    first step of all, and the plain server pay none."""
    from tests.scripted_policy import Scripted

    p = make_profile(steps={"batch_size": [1, 8, 64], "plain_ms": [10.0, 12.0, 40.0], "spec_ms": [15.0, 20.0, 90.0],
                            "extend_ms": [1.0, 1.5, 4.0], "catchup_ms": [0.1, 0.2, 0.5],
                            "resume_ms": [0.4, 0.6, 2.0]})

    def decodes(policy, **kw):
        eng = Engine(p, policy, **kw)
        for _ in range(8):
            eng.submit(4, 40)
        return [s for s in run(eng) if s.kind == "decode"][:6]

    script = [True, False, False, True, True, False]
    steps = decodes(Scripted(script + [False] * 100))
    assert [s.speculated for s in steps] == script
    assert [s.duration for s in steps] == pytest.approx([0.020, 0.0122, 0.0122, 0.0206, 0.020, 0.0122])
    assert [s.duration for s in decodes(Scripted(script + [False] * 100), catch_up=False)] == pytest.approx(
        [0.020, 0.012, 0.012, 0.020, 0.020, 0.012])
    assert [s.duration for s in decodes(None)] == pytest.approx([0.012] * 6)
