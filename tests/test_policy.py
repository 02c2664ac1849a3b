"""Policies: the decision before every decode step."""

from __future__ import annotations

import logging
import random
import subprocess
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dynspec.cli import main as cli_main
from dynspec.policy import (
    BUCKET_EDGES,
    FailSafePolicy,
    Goodput,
    Policy,
    PolicySpecError,
    SglangTiers,
    StepRecord,
    Threshold,
    bucket_of,
    build_policy,
)
from dynspec.sim.profile import load_profile
from tp_ranks import FakeAllReduce, run_ranks


# --- a scripted machine ------------------------------------------------------------
class Machine:
    """Step times and acceptance of a made-up server: t in seconds at batch size bs."""

    def __init__(self, plain, spec, accepted_mean: float, seed: int = 0, noise: float = 0.0):
        self.plain, self.spec, self.acc = plain, spec, accepted_mean
        self.rng = random.Random(seed)
        self.noise = noise

    def step(self, bs: int, speculate: bool, rng: random.Random | None = None) -> StepRecord:
        rng = rng or self.rng
        t = self.spec(bs) if speculate else self.plain(bs)
        t *= 1.0 + self.noise * (rng.random() - 0.5)
        accepted = ()
        if speculate:  # 0..3 accepted drafts per request around the mean
            accepted = tuple(min(3, max(0, round(rng.gauss(self.acc, 0.8)))) for _ in range(bs))
        return StepRecord(bs, speculate, accepted, t)


def plateaus(levels, hold: int, repeats: int = 2, seed: int = 1) -> list[int]:
    rng = random.Random(seed)
    out = []
    for _ in range(repeats):
        order = list(levels)
        rng.shuffle(order)
        for bs in order:
            out += [bs] * hold
    return out


def run(policy: Policy, machine: Machine, batches: list[int], totals: dict | None = None) -> list[bool]:
    """Drive a policy over a batch-size stream; `totals` collects tokens and seconds."""
    decisions = []
    tokens = seconds = 0.0
    for bs in batches:
        d = policy.decide(bs)
        rec = machine.step(bs, d)
        policy.observe(rec)
        decisions.append(d)
        tokens += bs + sum(rec.accepted)
        seconds += rec.step_time_s
    if totals is not None:
        totals.update(tokens=tokens, seconds=seconds, goodput=tokens / seconds)
    return decisions


def ms(a: float, b: float):
    return lambda bs: (a + b * bs) / 1000.0


# Spec loses at every batch size (the seed's machine): 2.5x the cost for ~1.3 extra tokens.
LOSING = dict(plain=ms(10, 0.05), spec=ms(25, 0.5), accepted_mean=1.3)
# Spec wins below B = 48: gain = 2.5 (10 + 0.2 bs) / (14 + 0.729 bs) crosses 1 at bs = 48.
B = 48
WINNING_TO_B = dict(plain=ms(10, 0.2), spec=ms(14, 0.7292), accepted_mean=1.5)


# --- goodput -----------------------------------------------------------------------
def test_goodput_turns_spec_off_where_it_always_loses():
    policy = build_policy("goodput")
    machine = Machine(**LOSING, seed=3, noise=0.05)
    steps = 30_000
    batches = [1] * 200 + plateaus(range(1, 129), hold=100)[: steps - 200]
    got, plain = {}, {}
    decisions = run(policy, machine, batches, got)
    run(build_policy("never"), Machine(**LOSING, seed=3, noise=0.05), batches, plain)
    # Off within a bounded number of steps at the first batch size (explore, then decide):
    first_plain = decisions.index(False)
    assert first_plain <= policy.min_samples
    assert sum(decisions[first_plain:200]) <= 200 // policy.PROBE_MIN
    # Stays off apart from probes, whose cost is bounded by the budget (plus exploration).
    assert sum(decisions) / len(decisions) < 0.02
    assert got["goodput"] >= 0.985 * plain["goodput"], (got, plain)


def test_goodput_is_not_fooled_by_one_slow_plain_step():
    """Seen on the H200 (real SGLang, dummy weights, nothing accepted): the first timed plain
    step of the server's life took ~60 spec steps (warm-up), and the policy speculated for
    thousands of steps at 0 accepted tokens, probing plain once per 2000 steps.  A plain step
    does a subset of a speculative step's work (one target token per request instead of k+1,
    a KV-only catch-up instead of a draft), so a plain time above the spec time is an outlier."""
    policy = build_policy("goodput")
    machine = Machine(plain=ms(7.4, 0.05), spec=ms(11.6, 0.2), accepted_mean=0.0, seed=1)
    decisions = []
    for _ in range(3000):
        d = policy.decide(1)
        rec = machine.step(1, d)
        if not d and not any(x is False for x in decisions):
            rec = StepRecord(1, False, (), 0.66)  # the outlier: the first plain step's time
        policy.observe(rec)
        decisions.append(d)
    assert sum(decisions[100:]) / len(decisions[100:]) < 0.05, sum(decisions)


def test_goodput_is_not_held_by_its_first_acceptance_sample():
    """Simulated on the measured H200 profile at C=1: the first speculative step of a request
    whose drafts are usually right accepted nothing, and an EMA of weight 0.02 that starts at
    that sample kept goodput plain for hundreds of steps where speculation gives 1.8x.  Until
    the EMA has seen about 1/weight samples, the estimate is their mean."""
    policy = build_policy("goodput")
    machine = Machine(plain=ms(6.8, 0.0), spec=ms(8.9, 0.0), accepted_mean=1.5, seed=3)
    decisions, first = [], True
    for _ in range(1000):
        d = policy.decide(1)
        rec = machine.step(1, d)
        if d and first:
            rec, first = StepRecord(1, True, (0,), rec.step_time_s), False  # the unlucky first sample
        policy.observe(rec)
        decisions.append(d)
    assert sum(decisions[50:]) / len(decisions[50:]) > 0.9, sum(decisions)


@pytest.mark.parametrize("with_profile", [False, True])
def test_goodput_speculates_below_crossover_and_not_above(with_profile):
    profile = None
    if with_profile:  # a deliberately wrong prior (spec looks cheap): measurement must correct it
        profile = make_profile(plain=[10, 30], spec=[11, 33], accept_length=2.5)
    policy = Goodput(profile)
    machine = Machine(**WINNING_TO_B, seed=5, noise=0.05)
    levels = list(range(1, 129))
    hold = 60
    batches = plateaus(levels, hold=hold, repeats=3)
    decisions = run(policy, machine, batches)
    # Judge the last repeat, bucket by bucket (a probe is PROBE_STEPS steps: one plateau can hold two).
    start = len(batches) - len(levels) * hold
    by_bucket: dict[int, list[bool]] = {}
    for i in range(start, len(batches)):
        by_bucket.setdefault(bucket_of(batches[i]), []).append(decisions[i])
    b_cross = bucket_of(B)
    for b, ds in by_bucket.items():
        frac = sum(ds) / len(ds)
        if b < b_cross - 1:
            assert frac >= 0.85, (BUCKET_EDGES[b], frac)
        elif b > b_cross + 1:
            assert frac <= 0.15, (BUCKET_EDGES[b], frac)


def test_goodput_with_periodic_agreement_does_not_decide_blind():
    """On a TP server times arrive only through the sync hook; a bucket just explored must not
    speculate blindly until the next periodic sync (the seed's node lost ~18% that way)."""
    batches = [1] * 200 + plateaus(range(1, 129), hold=100)[:20_000]
    got, plain = {}, {}
    calls = []
    policy = Goodput(sync=lambda v: calls.append(1) or v, sync_every=64)
    run(policy, Machine(**LOSING, seed=3, noise=0.05), batches, got)
    run(build_policy("never"), Machine(**LOSING, seed=3, noise=0.05), batches, plain)
    assert got["goodput"] >= 0.985 * plain["goodput"], (got, plain)
    assert len(calls) <= len(batches) // 64 + len(BUCKET_EDGES)


def test_goodput_probes_are_bounded_and_happen():
    policy = build_policy("goodput:probe=100")
    machine = Machine(**LOSING, seed=7)
    decisions = run(policy, machine, [64] * 5000)
    spec_steps = sum(decisions[100:])
    # Spec costs ~4x here, so probes (PROBE_STEPS each) hit the 100-step ceiling: it keeps probing, no more.
    k = Goodput.PROBE_STEPS
    assert k * (5000 // 100 - 2) <= spec_steps <= k * (5000 // 100 + 1)


def test_goodput_probes_more_where_the_modes_are_close():
    close = Machine(plain=ms(10, 0.1), spec=ms(20, 0.2), accepted_mean=0.9)  # g ~ 0.95
    far = Machine(**LOSING)  # g ~ 0.5
    probes = []
    for machine in (close, far):
        decisions = run(Goodput(), machine, [16] * 4000)
        probes.append(sum(decisions[100:]))
    assert probes[0] > 3 * probes[1], probes
    # and never more often than every PROBE_MIN steps
    assert probes[0] <= 3900 // Goodput.PROBE_MIN + 1


def test_goodput_profile_prior_decides_before_any_measurement():
    # With a profile that says spec loses, the very first decision is already plain.
    losing = make_profile(plain=[10, 30], spec=[30, 90], accept_length=2.0)
    assert Goodput(losing).decide(8) is False
    winning = make_profile(plain=[10, 30], spec=[12, 36], accept_length=2.5)
    assert Goodput(winning).decide(8) is True


def _rank_stream(policy: Policy, time_scale: float, seed_noise: int, out: list[bool], steps: int):
    """One TP rank: batch sizes and acceptance identical on every rank, local times differ."""
    machine = Machine(**WINNING_TO_B)
    shared = random.Random(11)  # rank-consistent: batch sizes and acceptance draws
    local = random.Random(seed_noise)
    bs = 1
    for _ in range(steps):
        bs = min(max(bs + shared.choice((-3, -1, 0, 1, 3)), 1), 128)
        d = policy.decide(bs)
        rec = machine.step(bs, d, rng=shared)
        local_t = rec.step_time_s * time_scale * (1 + 0.2 * local.random())
        policy.observe(rec._replace(step_time_s=local_t))
        out.append(d)


def test_goodput_ranks_decide_identically_with_agreed_times():
    reduce = FakeAllReduce(2)
    policies = [Goodput(sync=reduce.hook(r), sync_every=16) for r in range(2)]
    results: list[list[bool]] = [[], []]
    steps = 6000
    threads = [threading.Thread(target=_rank_stream, args=(policies[r], 1.0 + 0.6 * r, r, results[r], steps))
               for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(results[0]) == len(results[1]) == steps
    assert results[0] == results[1]
    # Every 16 steps, plus once per bucket as soon as both modes were tried there.
    buckets = len({bucket_of(b) for b in range(1, 129)})
    assert steps // 16 <= reduce.calls <= steps // 16 + buckets
    assert 0 < sum(results[0]) < steps  # the stream really exercises both modes


def test_goodput_without_agreement_would_diverge():
    """The control for the test above: local times fed directly make ranks disagree."""
    results: list[list[bool]] = [[], []]
    for r in range(2):
        _rank_stream(Goodput(), 1.0 + 0.6 * r, r, results[r], 6000)
    assert results[0] != results[1]


def test_goodput_agrees_on_counts_when_a_rank_dropped_a_step_time():
    """Each rank filters its own step times (a pause, a zero interval): the agreed mean is the
    agreed sums over the agreed counts, or the ranks' estimates (and then decisions) part."""
    reduce = FakeAllReduce(2)
    policies = [Goodput(sync=reduce.hook(r), sync_every=64) for r in range(2)]
    k = Goodput.PROBE_STEPS

    def rank(r: int) -> list[bool]:
        p, out = policies[r], []
        for i in range(2 * k):  # exploration: k plain, k spec; then one agreement
            d = p.decide(8)
            t = None if (r, i) == (1, 1) else 0.010 + 0.002 * r  # rank 1 dropped one plain interval
            p.observe(StepRecord(8, d, (1,) * 8 if d else (), t))
            out.append(d)
        return out

    assert run_ranks(rank, 2) == [[False] * k + [True] * k] * 2
    b = bucket_of(8)
    assert policies[0].t_est == policies[1].t_est
    assert policies[0].t_est[0][b] == pytest.approx((0.010 * k + 0.012 * (k - 1)) / (2 * k - 1))
    assert policies[0].t_est[1][b] == pytest.approx(0.011)
    assert reduce.calls == 1


def test_goodput_sync_hook_must_return_every_value():
    policy = Goodput(sync=lambda values: values[:3], sync_every=1)
    policy.decide(4)
    with pytest.raises(RuntimeError, match="expected"):
        policy.observe(StepRecord(4, True, (1, 1, 1, 1), 0.01))


# --- threshold and table ---------------------------------------------------------------
def test_threshold_hysteresis():
    p = Threshold(on=24, off=32, dwell=0)
    assert p.decide(30) is True  # starts speculating, 30 <= off
    assert p.decide(33) is False  # above off
    assert p.decide(28) is False  # between on and off: stays off
    assert p.decide(24) is True  # at on: back on
    assert p.decide(32) is True  # at off: still on


def test_table_lookup_and_spec_round_trip():
    p = build_policy("table:1-7=on,8-31=off,32-63=on,64-=off")
    assert [p.decide(b) for b in (1, 7, 8, 31, 32, 63, 64, 500)] == [True, True, False, False, True, True, False, False]
    again = build_policy(p.spec())
    assert [again.decide(b) for b in range(1, 200)] == [build_policy(p.spec()).decide(b) for b in range(1, 200)]


def _switch_steps(decisions: list[bool]) -> list[int]:
    return [i for i in range(1, len(decisions)) if decisions[i] != decisions[i - 1]]


@settings(max_examples=200, deadline=None)
@given(
    batches=st.lists(st.integers(1, 256), min_size=1, max_size=400),
    on=st.integers(0, 128),
    gap=st.integers(0, 64),
    dwell=st.integers(1, 50),
)
def test_threshold_never_switches_faster_than_dwell(batches, on, gap, dwell):
    p = Threshold(on, on + gap, dwell)
    decisions = [p.decide(b) for b in batches]
    sw = _switch_steps(decisions)
    assert all(b - a >= dwell for a, b in zip(sw, sw[1:]))


@settings(max_examples=200, deadline=None)
@given(
    batches=st.lists(st.integers(1, 256), min_size=1, max_size=400),
    cut=st.integers(2, 200),
    dwell=st.integers(1, 50),
)
def test_table_never_switches_faster_than_dwell(batches, cut, dwell):
    p = build_policy(f"table:1-{cut - 1}=on,{cut}-=off,dwell={dwell}")
    decisions = [p.decide(b) for b in batches]
    sw = _switch_steps(decisions)
    assert all(b - a >= dwell for a, b in zip(sw, sw[1:]))
    # and without dwell pressure it follows the table exactly
    q = build_policy(f"table:1-{cut - 1}=on,{cut}-=off")
    assert [q.decide(b) for b in batches] == [b < cut for b in batches]


# --- sglang-default-tiers ---------------------------------------------------------------
def test_sglang_tiers_static_part():
    p = SglangTiers(initial_steps=3)
    assert p.decide(1) and p.decide(7)  # tier 1: candidates 1,3,5,7
    assert p.decide(64) is False and p.decide(1000) is False  # tier 64: [0]
    assert p.steps_for(40) == 1  # tier 32: [0, 1], 3 not a candidate -> middle


def test_sglang_tiers_acceptance_ema_turns_off_then_probes():
    p = SglangTiers(initial_steps=3)
    seen = []
    for _ in range(21):
        d = p.decide(10)  # tier 8: [0, 1, 3], starts at 3
        p.observe(StepRecord(10, d, (0,) * 10 if d else ()))
        seen.append(p.steps_for(10))
    # Warm-up 10 batches, re-evaluated every 5: at batch 15 the EMA (2 * 0.8**15) is under
    # both drop thresholds, so 3 -> 0; at batch 20 it probes the smallest positive step.
    assert seen[:14] == [3] * 14
    assert seen[14:19] == [0] * 5
    assert seen[19] == 1


# --- fail-safe ----------------------------------------------------------------------------
class Broken(Policy):
    name = "broken"

    def __init__(self):
        self.calls = 0

    def decide(self, batch_size):
        self.calls += 1
        if self.calls > 3:
            raise ZeroDivisionError("boom")
        return False


def test_failsafe_speculates_after_a_failure_and_logs_once(caplog):
    p = FailSafePolicy(Broken())
    with caplog.at_level(logging.WARNING, logger="dynspec.policy"):
        decisions = [p.decide(8) for _ in range(10)]
        p.observe(StepRecord(8, True, (1,) * 8, 0.01))
    assert decisions == [False] * 3 + [True] * 7
    assert p.inner.calls == 4  # never called again after it raised
    warnings = [r for r in caplog.records if "failed" in r.getMessage()]
    assert len(warnings) == 1 and "ZeroDivisionError" in warnings[0].getMessage()


# --- spec strings ---------------------------------------------------------------------------
GOOD_SPECS = ["always", "never", "threshold:32", "threshold:on=24,off=32,dwell=50", "threshold:off=40",
              "table:1-63=on,64-=off", "table:1=on,2-=off,dwell=5", "sglang-default-tiers",
              "sglang-default-tiers:steps=5", "goodput", "goodput:probe=500,dwell=4,margin=0.05",
              "goodput:profile=" + "{profile}"]


@pytest.mark.parametrize("spec", GOOD_SPECS)
def test_good_specs_build(spec, tmp_path):
    path = tmp_path / "p.yaml"
    write_profile(path)
    p = build_policy(spec.format(profile=path), load_profile=load_profile)
    assert isinstance(p.decide(4), bool)


BAD_SPECS = [
    ("", "empty"),
    ("sometimes", "unknown policy 'sometimes'"),
    ("always:1", "takes no options"),
    ("threshold", "needs a batch size"),
    ("threshold:abc", "'abc' is not an integer"),
    ("threshold:-3", "must be >= 0"),
    ("threshold:on=40,off=32", "below on=40"),
    ("threshold:on=4,of=8", "unknown option 'of'"),
    ("threshold:on=4,on=8", "given twice"),
    ("threshold:on=", "has no value"),
    ("threshold:dwell=5", "needs on= and/or off="),
    ("table", "needs ranges"),
    ("table:1-63=on", "does not cover batch sizes 64-"),
    ("table:1-10=on,12-=off", "gap at batch sizes 11-11"),
    ("table:1-10=on,8-=off", "overlap"),
    ("table:1-10=maybe,11-=off", "must be =on or =off"),
    ("table:0-10=on,11-=off", "range start=0 must be >= 1"),
    ("table:10-1=on", "ends before it starts"),
    ("table:1-=on,5-=off", "follows an open-ended range"),
    ("table:1-63", "expected RANGE=on|off"),
    ("goodput:probe=1", "probe>=8"),
    ("goodput:budget=0", "0<budget<1"),
    ("goodput:margin=x", "'x' is not a number"),
    ("goodput:margin=nan", "not a finite number"),
    ("goodput:speed=3", "unknown option 'speed'"),
    ("goodput:times=2", "times must be 0 or 1"),
    ("goodput:merge=yes", "merge must be 0 or 1"),
    ("goodput:lead_batch=0", "lead_batch>=1"),
    ("goodput:lead_batch=2.5", "lead_batch='2.5' is not an integer"),
    ("goodput:lead_apart=1", "0<=lead_apart<1"),
    ("goodput:lead_apart=-0.01", "0<=lead_apart<1"),
    ("goodput:times=0", "needs a profile"),
    ("goodput:profile=/nonexistent/p.yaml", "no such profile file"),
    ("goodput:profile=no-such-profile", "no such profile"),
    ("sglang-default-tiers:steps=0", "steps=0 must be >= 1"),
]


@pytest.mark.parametrize("spec,message", BAD_SPECS)
def test_bad_specs_get_their_error(spec, message):
    with pytest.raises(PolicySpecError) as info:
        build_policy(spec, load_profile=load_profile)
    text = str(info.value)
    assert message in text
    assert "\n" not in text


@pytest.mark.parametrize("spec,message", BAD_SPECS[1:6])
def test_policy_check_cli_exit_codes(spec, message, capsys):
    assert cli_main(["policy", "check", spec]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert cli_main(["policy", "check", "threshold:on=24,off=32,dwell=50"]) == 0
    assert "threshold:on=24,off=32,dwell=50" in capsys.readouterr().out


def test_buckets_cover_every_batch_size():
    assert bucket_of(1) == 0 and bucket_of(0) == 0
    assert bucket_of(10_000) == len(BUCKET_EDGES) - 1
    prev = 0
    for bs in range(1, 2000):
        b = bucket_of(bs)
        assert b in (prev, prev + 1)
        assert BUCKET_EDGES[b] <= bs
        prev = b


# --- helpers shared with the profile tests -------------------------------------------------
def profile_dict(plain=(10, 30), spec=(12, 36), accept_length=2.5, **over) -> dict:
    d = {
        "name": "test",
        "speculative": {"algorithm": "EAGLE3", "num_steps": 3, "topk": 1, "num_draft_tokens": 4},
        "acceptance": {"accept_length": accept_length, "concentration": 10},
        "steps": {"batch_size": [1, 128], "plain_ms": list(plain), "spec_ms": list(spec)},
        "provenance": {"kind": "derived", "source": "unit test"},
    }
    d.update(over)
    return d


def make_profile(**kw):
    from dynspec.sim.profile import parse_profile

    return parse_profile(profile_dict(**kw))


def write_profile(path, **kw):
    import yaml

    path.write_text(yaml.safe_dump(profile_dict(**kw)))
    return path


def _flat_profile(plain, spec, accept_length, resume=None):
    steps = {"batch_size": [1, 128], "plain_ms": [plain, plain], "spec_ms": [spec, spec]}
    if resume is not None:
        steps.update(catchup_ms=[0.0, 0.0], resume_ms=[resume, resume])
    return make_profile(accept_length=accept_length, steps=steps)


def test_goodput_prior_and_probe_costs_include_the_resume():
    """A switch to speculating pays one resume (resume_ms): the prior charges it over the dwell, and
    a probe, PROBE_STEPS steps of the other mode, pays its steps' loss and the switch there and
    back.  (With acceptance known from many request-steps: a prior's few leave the interval to
    its uncertainty, test_goodput_probes_soon_while_the_estimate_is_uncertain.)"""
    from dynspec.policy import bucket_of

    b, k = bucket_of(8), Goodput.PROBE_STEPS

    def known(profile, **kw):
        p = Goodput(profile, **kw)
        p._acc_steps = [p._acc_steps_max] * len(p._acc_steps)
        p._refresh(b)
        return p

    losing, losing_r = _flat_profile(10, 24, 2.0), _flat_profile(10, 24, 2.0, resume=6)
    assert Goodput(losing_r).t_est[1][b] == pytest.approx(0.024 + 0.006 / 8)
    assert Goodput(losing_r, dwell=2).t_est[1][b] == pytest.approx(0.027)
    # from plain: k ((ts / tp) - (1 + acc)) + r / tp plain steps lost per probe, over the 0.005 budget (int() of it)
    assert known(losing, lead=0)._interval[0][b] == int(k * (2.4 - 2) / 0.005)
    assert known(losing_r, lead=0)._interval[0][b] == int((k * (2.475 - 2) + 0.6) / 0.005)
    # with the lead in full (lead_batch=1), speculation's 2 tokens count as 2 / 1.05
    assert known(losing, lead_batch=1)._interval[0][b] == min(int(k * (2.4 - 2 / 1.05) / 0.005), 2000)
    winning, winning_r = _flat_profile(10, 12, 2.5), _flat_profile(10, 12, 2.5, resume=6)
    # from spec: k (g - 1) / (1 + acc) + r / ts spec steps' output, g = 25/12 (25/12.75 with the resume)
    assert known(winning, lead=0)._interval[1][b] == int(k * (25 / 12 - 1) / 2.5 / 0.005)
    assert known(winning_r, lead=0)._interval[1][b] == int((k * (25 / 12.75 - 1) / 2.5 + 6 / 12.75) / 0.005)
    # from plain where speculation wins, a probe still costs its resume: r / tp = 0.6 plain steps / 0.005
    assert known(winning, lead=0)._interval[0][b] == Goodput.PROBE_MIN * k  # probes' steps at most one in PROBE_MIN
    assert known(winning_r, lead=0)._interval[0][b] == int(0.6 / 0.005)
    # and a close call the resume tips: without it speculating gains 5%, with it loses
    close, close_r = _flat_profile(10, 19, 2.0), _flat_profile(10, 19, 2.0, resume=16)
    assert Goodput(close, lead=0).decide(8) is True and Goodput(close_r, lead=0).decide(8) is False
    # a 5% gain is no more than the lead asks in full: plain
    assert Goodput(close, lead_batch=1).decide(8) is False


def test_goodput_lead_grows_with_the_batch_up_to_lead_batch():
    """The lead stands for a prefill's fixed cost per request that speculation's scattered finishes
    add, so it applies in full from lead_batch requests and in proportion below: a 5% per-step gain
    is taken at batch 8 but not at 64, where it is no more than the 5% lead asks."""
    from dynspec.policy import bucket_mid, bucket_of

    close = _flat_profile(10, 19, 2.0)  # 2 tokens per 19 ms against 1 per 10: speculating gains 5.3%
    small, large = bucket_of(8), bucket_of(64)
    p = Goodput(close)  # lead 0.05, lead_batch 32 (the defaults)
    assert p._gain(small) == pytest.approx(2.0 * 10 / 19 / (1 + 0.05 * bucket_mid(small) / 32))
    assert p._gain(large) == pytest.approx(2.0 * 10 / 19 / 1.05)
    assert Goodput(close).decide(8) is True and Goodput(close).decide(64) is False
    # lead_batch=1 is the lead in full at every batch, as before the option existed
    assert Goodput(close, lead_batch=1).decide(8) is False
    assert build_policy("goodput:lead_batch=4").lead_batch == 4
    assert build_policy("goodput:lead_apart=0.01").lead_apart == 0.01


def test_goodput_decides_a_new_bucket_from_a_neighbour_that_clearly_knows():
    """Speculation's relative cost does not fall with the batch: where it clearly loses at batch 8
    it is not tried again at 64, and where it clearly wins at 64 it is not doubted at 8."""
    losing = Machine(**LOSING)
    p = Goodput()
    run(p, losing, [8] * 20)
    assert run(p, losing, [64] * 6) == [False] * 6  # no exploring spec steps in the new bucket
    winning = Machine(plain=ms(10, 0.0), spec=ms(12, 0.0), accepted_mean=1.5)  # g ~ 2
    q = Goodput()
    run(q, winning, [64] * 20)
    assert run(q, winning, [8] * 6) == [True] * 6  # no exploring plain steps either
    # a close call decides nothing for its neighbours: both modes are tried there
    close = Machine(plain=ms(10, 0.1), spec=ms(20, 0.2), accepted_mean=1.0)
    c = Goodput()
    run(c, close, [8] * 20)
    assert set(run(c, close, [64] * 2 * Goodput.PROBE_STEPS)) == {True, False}


def test_goodput_learns_what_a_switch_to_speculating_costs():
    """Without a profile the resume is measured: a spec step right after plain ones costs more,
    and that excess lengthens the interval between probes from plain."""
    class Resuming(Machine):
        def __init__(self, resume_ms, **kw):
            super().__init__(**kw)
            self.resume, self.prev = resume_ms / 1000.0, None

        def step(self, bs, speculate, rng=None):
            rec = super().step(bs, speculate, rng)
            if speculate and self.prev is False:
                rec = rec._replace(step_time_s=rec.step_time_s + self.resume)
            self.prev = speculate
            return rec

    b = bucket_of(16)
    # Speculating (it wins), a plain probe's way back is a resumed step: the excess is the resume,
    # and it makes those probes rarer.
    win = dict(plain=ms(10, 0.0), spec=ms(12, 0.0), accepted_mean=1.5)
    cheap, dear = Goodput(), Goodput()
    run(cheap, Resuming(0.0, **win), [16] * 3000)
    run(dear, Resuming(4.0, **win), [16] * 3000)
    assert cheap._t_resume[b] == pytest.approx(0.0, abs=1e-4)
    assert dear._t_resume[b] == pytest.approx(0.004, rel=0.2)
    # a probe is PROBE_STEPS plain steps: the resume (0.33 spec steps) on 4 x (g - 1) / (1 + acc) = 1.7
    assert dear._interval[1][b] > 1.12 * cheap._interval[1][b]
    # Decoding plainly (it loses), every spec step is a probe and a resumed one: its time carries
    # the resume, which lengthens the interval between probes from plain all the same.
    lose = dict(plain=ms(10, 0.0), spec=ms(12, 0.0), accepted_mean=0.1)
    cheap, dear = Goodput(), Goodput()
    run(cheap, Resuming(0.0, **lose), [16] * 3000)
    run(dear, Resuming(4.0, **lose), [16] * 3000)
    assert dear._interval[0][b] > 1.5 * cheap._interval[0][b]


def test_goodput_keeps_the_resume_out_of_the_spec_step_time():
    """A resumed spec step (right after plain ones) costs the spec step plus the resume.  Counted as
    a spec step, probes from plain would charge the resume to every spec step, and near a tie keep
    speculation off where it wins.  Only the excess goes to the resume estimate."""
    resume = 0.002  # a close call (spec/plain goodput 0.95, 0.87 with the resume on every step)
    p, prev = Goodput(), None
    b = bucket_of(1)
    for _ in range(3000):
        spec = p.decide(1)
        t = 0.020 if spec else 0.010
        if spec and prev is False:
            t += resume
        p.observe(StepRecord(1, spec, (1,) if spec else (), t))
        prev = spec
    # Speculation loses here, so every spec step after the first bucket visit is a probe from
    # plain: the first probe takes two steps to measure a steady one (the call is close enough
    # for the resume to matter).
    assert p.t_est[1][b] == pytest.approx(0.020, rel=1e-6)
    assert p._t_resume[b] == pytest.approx(resume, rel=0.05)


def test_goodput_acceptance_forgets_at_one_pace_in_either_mode():
    """A probe from plain stands for the steps since the last sample: after a low stretch has
    switched speculation off, probes showing it wins again bring it back within a few hundred
    steps, not thousands (a greedy EMA samples densely only the mode it chose)."""
    p = Goodput()
    tp, ts = 0.010, 0.025  # with 2 accepted drafts per request speculation wins by 14% (lead counted)
    back = None
    for i in range(4000):
        spec = p.decide(1)
        acc = 0 if 1000 <= i < 1400 else 2  # a low stretch (one unlucky request) amid good ones
        p.observe(StepRecord(1, spec, (acc,) if spec else (), ts if spec else tp))
        if i == 999:
            assert p._choice[bucket_of(1)]
        if i == 1399:
            assert not p._choice[bucket_of(1)]  # the low stretch turned speculation off
        if i >= 1400 and back is None and p._choice[bucket_of(1)]:
            back = i - 1400
    assert back is not None and back < 800, back  # 511 steps; counting each probe as one step: 1484


def test_goodput_borrows_a_loss_from_a_larger_bucket_by_the_per_request_bound():
    """A request's share of a step does not grow with the batch, so the speedup at most doubles
    when the batch halves.  Where speculation loses 5x at 128, a level draining through 96, 64, 48
    ... is not made to try a speculative step in each bucket; where it loses 1.6x at 16, batch 4
    (inside the bound) is still tried."""
    steep = Machine(plain=ms(8, 0.01), spec=ms(10, 1.0), accepted_mean=1.0)  # G(128) ~ 0.13, G(1) ~ 1.5
    p = Goodput()
    run(p, steep, [128] * 20)
    assert not any(run(p, steep, [bs for bs in (100, 70, 50, 40, 30) for _ in range(4)]))
    assert True in run(p, steep, [2] * 6)  # G(2) = 2 x 8.0 / 12 ~ 1.33 here: not borrowed
    mild = Machine(plain=ms(10, 0.0), spec=ms(4, 1.5), accepted_mean=1.0)  # G(16) ~ 0.71, G(4) ~ 2
    q = Goodput()
    run(q, mild, [16] * 20)
    assert True in run(q, mild, [4] * 6)  # 0.71 x 23 / 4 > 1: the bound decides nothing


def _per_request_run(policy, pattern, steps_each=30, pass_ids=True):
    """Batch-1 requests, one after another, accepting 3 drafts a step ("good") or 0 ("bad"), on a
    machine whose spec step costs 2 plain ones: speculating doubles a good request's output and
    halves a bad one's.  Returns the share of steps speculated during good and during bad requests."""
    spec = {"good": [0, 0], "bad": [0, 0]}
    for i, kind in enumerate(pattern):
        rid = f"req-{i}"
        for _ in range(steps_each):
            if pass_ids:
                policy.set_batch([rid])
            d = policy.decide(1)
            spec[kind][0] += d
            spec[kind][1] += 1
            acc = (3,) if kind == "good" else (0,)
            policy.observe(StepRecord(1, d, acc if d else (), 0.020 if d else 0.010, [rid] if pass_ids and d else None))
    return {k: a / n for k, (a, n) in spec.items() if n}


def test_goodput_follows_each_request_of_the_batch():
    """Told which requests a step runs (SGLang's rids), goodput keeps each one's accepted drafts
    and, once departed requests show they differ (empirical Bayes: within- against
    between-request variance), estimates the batch from its own requests: it speculates through
    good requests and stops within a bad one's life.  By the population's estimate alone (no
    ids) every request looks the same, so it cannot tell them apart."""
    machine = _flat_profile(10, 20, 2.5)  # the profile's prior: 1.5 accepted, the population's mean
    pattern = ["good", "bad"] * 20
    by_request = _per_request_run(Goodput(machine), pattern, steps_each=60)
    pooled = _per_request_run(Goodput(machine), pattern, steps_each=60, pass_ids=False)
    assert by_request["good"] > 0.9 and by_request["bad"] < 0.4, by_request
    assert abs(pooled["good"] - pooled["bad"]) < 0.15, pooled  # the control: no ids, no difference
    # requests that are alike (each draws 0, 3, 1, 2, ... in turn: the same mean, a spread within)
    # teach no spread between them: the batch's estimate stays the population's
    alike = Goodput(machine)
    for i in range(12):
        for j in range(24):
            alike.set_batch([f"a{i}"])
            alike.decide(1)
            alike.observe(StepRecord(1, True, ((0, 3, 1, 2)[j % 4],), 0.02, [f"a{i}"]))
    assert alike._var_within > 1 and alike._var_between < 0.01
    alike.observe(StepRecord(1, True, (3,), 0.02, ["a11"]))  # one lucky step moves the request's own mean
    assert alike._accepted(0) == pytest.approx(alike._population(0), abs=0.02)


def test_goodput_forgets_requests_that_left():
    p = Goodput()
    for i in range(200):
        p.set_batch([f"r{i}", f"r{i + 1}"])
        p.decide(2)
        p.observe(StepRecord(2, True, (1, 2), 0.01, [f"r{i}", f"r{i + 1}"]))
    assert len(p._req) <= 2 + 4 + 1  # the batch, and at most a few departed ones not yet folded in
    from dynspec.policy import bucket_of

    big = Goodput.PER_REQUEST_MAX + 1
    p.set_batch([f"r{i}" for i in range(big)])  # above what it tracks
    assert p._batch is None and p._accepted(bucket_of(big)) == p._population(bucket_of(big))


def test_policy_bench_runs_a_fixed_batch_through_set_batch():
    """`dynspec policy bench --batch B` times what a server calls at one batch size, set_batch
    included for a policy that tracks requests: its stream keeps B requests whose ids turn over."""
    from dynspec.policy.bench import bench_policy, bench_stream

    stream = bench_stream(500, batch=4)
    assert {bs for bs, *_ in stream} == {4} and all(len(rids) == 4 == len(set(rids)) for *_, rids in stream)
    assert len({r for *_, rids in stream for r in rids}) > 4  # requests come and go
    seen = []

    class Spy(Goodput):
        def set_batch(self, requests):
            seen.append(requests)
            super().set_batch(requests)

    import dynspec.policy.bench as bench

    real = bench.build_policy
    bench.build_policy = lambda spec, **kw: Spy()
    try:
        assert len(bench_policy("goodput", steps=50, batch=4)) == 45  # the first tenth is warm-up
    finally:
        bench.build_policy = real
    assert len(seen) == 50 and all(s is not None and len(s) == 4 for s in seen)


def test_failsafe_speculates_after_set_batch_raises(caplog):
    class Broken(Goodput):
        def set_batch(self, requests):
            raise KeyError("no such request")

    p = FailSafePolicy(Broken())
    assert p.requests_up_to == Goodput.PER_REQUEST_MAX  # a caller asks the wrapper what to pass
    with caplog.at_level("WARNING", logger="dynspec.policy"):
        p.set_batch(["r0"])
    assert p.failed and p.decide(1) is True
    assert "failed in set_batch (KeyError" in caplog.text


def test_policy_ab_benches_this_tree_against_a_commit_in_turns(capsys):
    """benchmarks/policy_ab.py runs `dynspec policy bench` for this tree and for a commit's src
    alternately and prints each one's per-run medians and their ratio; a commit that does not
    exist is one clear line, before anything runs."""
    import re

    from benchmark_scripts import load

    ab = load("policy_ab")
    assert ab.main(["HEAD", "--rounds", "2", "--steps", "200", "--spec", "never"]) == 0
    out = capsys.readouterr().out
    rounds = re.findall(r"round \d: this tree ([0-9.]+) us   HEAD ([0-9.]+) us", out)
    assert len(rounds) == 2 and all(float(x) > 0 for r in rounds for x in r)
    assert re.search(r"ratio \(this tree / HEAD\): lowest [0-9.]+, median [0-9.]+", out)
    with pytest.raises(SystemExit, match="'no-such-rev' is not a commit"):
        ab.main(["no-such-rev"])
    # the candidate steps reach both benches: a good list runs, a bad one fails the bench
    k = ["HEAD", "--rounds", "1", "--steps", "200", "--spec", "goodput-k", "--candidate-steps"]
    assert ab.main([*k, "0,1,3,5,7"]) == 0
    with pytest.raises(subprocess.CalledProcessError):
        ab.main([*k, "0,x"])


def test_goodput_probes_soon_while_the_estimate_is_uncertain():
    """An unlucky start where speculating gives 20% more output: the first spec steps accept
    nothing (one step of a whole wave of 8, or the first four at batch 1).  Seen in the
    simulator on generated machines: such a start kept speculation off for hundreds of steps,
    as the probe interval grows where a mode looks clearly better.  A few steps of acceptance
    are weak evidence: the next probe comes before waiting costs more in expectation than the
    probe itself.  (Before that bound: 0.62 and 0.22 of these steps speculated.)"""
    def share(batch: int, unlucky: int, steps: int) -> float:
        machine = Machine(plain=ms(7.0, 0.0), spec=ms(10.0, 0.0), accepted_mean=0.72, seed=4)
        policy, decisions = Goodput(), []
        for _ in range(steps):
            d = policy.decide(batch)
            rec = machine.step(batch, d)
            if d and unlucky:
                rec, unlucky = rec._replace(accepted=(0,) * batch), unlucky - 1
            policy.observe(rec)
            decisions.append(d)
        assert not unlucky
        return sum(decisions) / steps

    assert share(8, 1, 250) > 0.85
    assert share(1, 4, 500) > 0.8


def _closed_loop(policy, steps, batch=8, out_len=20, plain=0.010, spec=0.020, prefill=(0.015, 0.025), after=0.005):
    """A closed loop of `batch` requests of out_len tokens; spec steps accept one draft each.  A
    finish brings a prefill forward (prefill[mode] seconds, the mode in force) and the decode
    interval after it holds `after` more (not clean: the prefill's launch).  Returns
    (output tokens, wall seconds)."""
    left = [out_len - (i * out_len) // batch for i in range(batch)]  # staggered
    tokens = wall = 0.0
    pending = 0
    for _ in range(steps):
        d = policy.decide(batch)
        t = spec if d else plain
        clean = pending == 0
        if pending:
            t += after
            pending = 0
        gain = 2 if d else 1
        policy.observe(StepRecord(batch, d, (1,) * batch if d else (), t, None, clean))
        wall += t
        done = 0
        for i in range(batch):
            g = min(gain, left[i])
            tokens += g
            left[i] -= g
            if left[i] == 0:
                left[i], done = out_len, done + 1
        if done:
            s = prefill[1 if d else 0]
            policy.note_prefill(done, done * 128, s)
            wall += s
            pending = done
    return tokens, wall


def test_goodput_acts_on_what_each_mode_costs_the_servers_throughput():
    """A speculative step costs 2.2 plain ones and gives 2 tokens, but every finish brings a
    prefill (25 ms, and 5 ms in the decode step after it) and a speculative step finishes twice the
    tokens: the two modes' throughput implies a ratio of about 2.1, not the steps' 2.2.  goodput's
    cost ratio must be that ratio: each step with its share of the prefills, per request admitted
    in either mode (the prompts set a prefill's cost, not the mode that ran beside it)."""
    kw = dict(spec=0.022, prefill=(0.025, 0.025))
    never_tok, never_wall = _closed_loop(build_policy("never"), 3000, **kw)
    always_tok, always_wall = _closed_loop(build_policy("always"), 3000, **kw)
    implied = 2.0 * (never_tok / never_wall) / (always_tok / always_wall)
    assert implied < 0.97 * 2.2
    p = Goodput()
    _closed_loop(p, 6000, **kw)
    est = p.estimates()["8+"]
    assert est["cost_ratio"] == pytest.approx(implied, rel=0.02), (est, implied)
    assert est["spec_ms"] / est["plain_ms"] == pytest.approx(2.2, rel=0.02)  # steady steps alone
    # the prefill share it reports is the one the ratio carries (dynspec.analysis.cost_ratio reads it)
    pf, acc = est["prefill_ms"], est["accepted"]
    assert pf > 0.0
    assert (est["spec_ms"] + pf * (1 + acc)) / (est["plain_ms"] + pf) == pytest.approx(est["cost_ratio"], rel=1e-3)


def test_goodput_measures_what_a_switch_costs_on_a_pipelined_server():
    """On a live server the result of the step before a switch already holds the next step's host
    work: with window 3, neither it nor the switched step is a step time; their excess over the
    steady steps is the switch's cost, each way."""
    p = Goodput(window=3)
    plain, spec, on, off = 0.010, 0.020, 0.006, 0.003
    modes = ([False] * 10 + [True] * 10) * 30
    scripted = iter(modes + [False])
    p._choose = lambda b, batch_size: next(scripted)  # the schedule under test, not the policy's
    p.decide(8)  # the overlap scheduler: step i + 1 is launched before step i's result is read
    for i, m in enumerate(modes):
        p.decide(8)
        t = spec if m else plain
        if i and modes[i - 1] != m:
            t += on if m else off  # the switch lands on the first step of the new mode
        p.observe(StepRecord(8, m, (1,) * 8 if m else (), t))
    b = bucket_of(8)
    assert p.t_est[0][b] == pytest.approx(plain) and p.t_est[1][b] == pytest.approx(spec)
    assert p._t_resume[b] == pytest.approx(on, rel=0.05) and p._t_pause[b] == pytest.approx(off, rel=0.05)


def test_goodput_forgets_a_warm_up_prefill_of_the_mode_it_left():
    """Live on the H200: the first prefills of a server's life (kernels compiled for new shapes)
    ran plain and cost 229 ms per request; goodput then speculated where that paid and never ran
    a plain prefill again, so the stale figure priced every plain step from then on and it
    speculated at batch 128 for 0.74 of a plain server.  Evidence a mode stopped collecting must
    age, and a plain-mode prefill (the target's and the draft's K and V) is never dearer than a
    speculative one (the draft's whole prefill besides)."""
    p = Goodput()
    p.note_prefill(8, 8 * 128, 2.0)  # the first prompts, plain, compiling kernels: 250 ms each
    _closed_loop(p, 3000, spec=0.010)  # speculation pays: it speculates
    assert p.estimates()["8+"]["speculate"] is True
    tok, wall = _closed_loop(p, 6000, spec=0.024)  # now it loses (2 tokens for 2.7 plain steps' time)
    never_tok, never_wall = _closed_loop(build_policy("never"), 6000, spec=0.024)
    assert p.estimates()["8+"]["speculate"] is False, p.prefill_estimates()
    assert (tok / wall) / (never_tok / never_wall) > 0.95
    # (the warm-up's forward came on no refill: it prices nothing)
    assert p.prefill_estimates()["overhead_ms_per_request"] < 50.0


def test_goodput_is_not_turned_by_one_stalled_step():
    """Live on the H200, a fresh server's first speculative steps at batch 16 took 13, 12, 86 and
    11 ms (a kernel compiled on first use) against 9 ms plain; speculating gave 1.2x plain there,
    yet goodput went plain for the rest of the level (8% of steps speculated, 0.70 of EAGLE-3).
    One step is no measure of what a mode costs: a steady step counts for at most twice the
    estimate it updates, so a stall moves it as a doubling would and the next steps bring it back."""
    def share(stall_ms: float) -> float:
        machine = Machine(plain=ms(9.0, 0.0), spec=ms(12.0, 0.0), accepted_mean=1.2, seed=3)
        policy, decisions, spec_steps = Goodput(window=3), [], 0
        for _ in range(600):
            d = policy.decide(16)
            rec = machine.step(16, d)
            if d:
                spec_steps += 1
                if spec_steps == 3:
                    rec = rec._replace(step_time_s=stall_ms / 1000.0)
            policy.observe(rec)
            decisions.append(d)
        return sum(decisions[100:]) / len(decisions[100:])

    assert share(12.0) > 0.9  # the control: no stall
    assert share(86.0) > 0.9


def test_the_goodput_options_in_the_docs_are_the_parameters_defaults():
    """GoodputParams is the one definition of goodput's knobs: the parser's options and
    docs/POLICIES.md's spec line follow it."""
    from pathlib import Path

    from dynspec.policy import GoodputParams
    from dynspec.policy.goodput.params import spec_options

    docs = (Path(__file__).resolve().parents[1] / "docs" / "POLICIES.md").read_text()
    line = next(x for x in docs.splitlines() if x.startswith("| `goodput[:"))
    body = line.split("`")[1].removeprefix("goodput[:").removesuffix("]")
    documented = dict(kv.split("=") for kv in body.split(","))
    assert documented.pop("profile") == "P"
    defaults = GoodputParams()
    expected = {}
    for option, (name, _) in spec_options().items():
        v = getattr(defaults, name)
        expected[option] = str(int(v)) if isinstance(v, bool) else str(v)
    assert documented == expected
    p = build_policy("goodput")
    assert p.params == defaults and (p.probe, p.lead, p.window) == (defaults.probe, defaults.lead, defaults.window)


def test_goodput_notices_when_acceptance_rises_while_it_decodes_plain():
    """Prompts whose drafts the model gets right arrive after a long stretch of ones it gets
    wrong (an acceptance shift, live on one H200: the easy half of a level went by at 1-2% of
    steps speculated).  The first probe after the shift lies many standard errors from the
    estimate: the estimate restarts from it instead of moving a fifth of the way per probe, so
    speculation is back at that probe, not two or three probe intervals later (112-127 steps
    after it here before; each interval a few hundred steps)."""
    for seed in range(3):
        policy, batch = Goodput(), 16
        hard = Machine(plain=ms(5.0, 0.0), spec=ms(10.0, 0.0), accepted_mean=0.3, seed=7 + seed)
        easy = Machine(plain=ms(5.0, 0.0), spec=ms(10.0, 0.0), accepted_mean=2.4, seed=8 + seed)
        run(policy, hard, [batch] * 3000)
        assert not policy._choice[bucket_of(batch)]  # spec/plain about 0.6 here
        restarts = policy.estimates()["16+"]["restarts"]
        after = run(policy, easy, [batch] * 1000)  # about 1.6 now
        first = after.index(True)  # the first probe after the shift
        back = next(i for i in range(len(after)) if sum(after[i:i + 50]) >= 45)
        assert back - first < 20, (seed, first, back)
        assert policy.estimates()["16+"]["restarts"] == restarts + 1  # the estimates say why


def test_goodput_says_what_set_each_probe_interval():
    # Speculation loses by 40% at batch 16: probes from plain come at the budget's pace once the
    # gain is sure (at first, while few steps are behind it, at the regret's), and every probe is
    # counted by what set its interval.
    policy = Goodput()
    run(policy, Machine(plain=ms(5.0, 0.0), spec=ms(10.0, 0.0), accepted_mean=0.3, seed=3), [16] * 6000)
    row = policy.estimates()["16+"]
    assert not row["speculate"] and row["probes"][0] > 10
    assert sum(row["probes_by"].values()) == sum(row["probes"])
    assert row["probe_why"][0] == "budget" and row["probes_by"]["budget"] > row["probes_by"].get("regret", 0) > 0
    # the budget's interval is a probe's price over the budget: PROBE_STEPS spec steps, each
    # costing spec / plain steps' time for 1 + accepted tokens (less the lead) where plain gives 1
    out = (1.0 + row["accepted"]) / (1.0 + policy._lead_now * policy._lead_share[bucket_of(16)])
    price = Goodput.PROBE_STEPS * (row["spec_ms"] / row["plain_ms"] - out)
    assert row["probe_every"][0] == pytest.approx(price / policy.budget, rel=0.02)


def test_goodput_speculates_in_a_bucket_it_only_visits_beside_prefills():
    """Live at C=8 (one H200, crafted 8B weights, outputs 256-512): the batch held 8 and fell to
    7 for a step or two whenever a request finished, until the next one's prefill refilled it.
    Every step at 7 lay beside a prefill, so no speculative step there was ever clean; the
    bucket 6-7 never got a speculative time, its gain stayed unknown and its choice plain, and
    each dip switched speculation off and on again (0.71-0.83 of steps speculated through the
    level where speculation won by 1.2x).  A mode's time that a bucket could not measure lies
    between those of the buckets on either side that did (a step's time grows with the batch):
    once its first visits have tried both modes, it decides from them."""
    policy, rng = Goodput(window=3), random.Random(5)
    machine = Machine(plain=ms(5.0, 0.03), spec=ms(6.5, 0.5), accepted_mean=1.2, seed=5)
    run(policy, machine, [4] * 600 + [8] * 600)  # both buckets explored: speculation wins (~1.2x)
    assert policy._choice[bucket_of(4)] and policy._choice[bucket_of(8)]
    at7 = []
    for _ in range(80):
        for bs, clean in [(8, True)] * 28 + [(7, False)] * 2:
            d = policy.decide(bs)
            rec = machine.step(bs, d, rng)
            policy.observe(rec._replace(clean=clean))
            if bs == 7:
                at7.append(d)
    assert sum(at7[10:]) >= 0.95 * len(at7[10:]), at7  # after its first visits' exploring
    assert policy.estimates()["6+"]["spec_ms"] is not None


def test_policy_bench_times_several_specs_in_turns(capsys, monkeypatch):
    """`dynspec policy bench A B --rounds R` times A and B alternately, R rounds each (a busy
    machine's drift falls on both), and prints one median per spec over all its rounds."""
    import dynspec.policy_cli as cli_mod

    order = []

    def fake(spec, steps, seed, batch, load_profile, cands):
        order.append((spec, cands))
        return [1.0 if spec == "goodput" else 2.0] * 10

    monkeypatch.setattr(cli_mod, "bench_policy", fake)
    from dynspec.cli import main as cli_main

    assert cli_main(["policy", "bench", "goodput", "goodput-k", "--rounds", "3", "--candidate-steps", "0,1,3,5,7"]) == 0
    assert order == [("goodput", [0, 1, 3, 5, 7]), ("goodput-k", [0, 1, 3, 5, 7])] * 3
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("goodput ") and "median   1.00 us" in out[0]
    assert out[1].startswith("goodput-k ") and "median   2.00 us" in out[1]
    assert out[-1] == "decide+observe median: 2.0 us"


def test_a_stall_on_a_cold_servers_first_drain_does_not_price_the_buckets_below():
    """Live on one H100, a fresh server's first level at C=64 drained through batch 31 plain, and
    its first two steady steps there took 82 and 194 ms (kernels compiled for new shapes) where a
    plain step costs 8 ms.  Taken whole, 164 ms became bucket 24+'s plain step, then, borrowed,
    that of every bucket below it: speculation there looked free (cost ratio 1.0 against 1.6-2.1
    measured) for the rest of the run.  A step of one mode costs no more than one of the same mode
    at a larger batch, nor a plain step more than a speculative one of its bucket."""
    machine = Machine(plain=ms(7.0, 0.02), spec=ms(9.0, 0.45), accepted_mean=1.0, seed=5)
    p = build_policy("goodput")
    stalls = [0.082, 0.194]
    for bs in [64] * 400 + [31] * 4 + [20] * 4 + [12] * 4 + [6] * 4 + [3] * 4 + [1] * 300:
        d = p.decide(bs)
        rec = machine.step(bs, d)
        if bs == 31 and not d and stalls:
            rec = rec._replace(step_time_s=stalls.pop(0))
        p.observe(rec)
    assert not stalls  # both stalled steps were plain ones at batch 31
    plain_31 = machine.plain(31)
    assert p.t_est[0][bucket_of(31)] < 1.5 * plain_31
    for b in range(bucket_of(31)):  # nothing below carries the stall
        tp = p.t_est[0][b]
        assert tp is None or tp < 1.5 * plain_31


def test_a_prefill_on_an_idle_server_does_not_price_the_mode_it_came_in():
    """Live on one H100 (crafted 8B weights), bursts of 16-token requests warmed the server:
    each burst's first prompt was prefilled on an idle server (19-46 ms from launch, waking
    included) while goodput speculated at batch 1, the rest in busy forwards of 60-90 prompts
    (1-2 ms a prompt) while it decoded plain.  Counted whole, the idle forwards priced
    speculation's prefills at 30 ms a prompt against plain's 2.5, in every level after (goodput
    kept 0.71-0.87 of EAGLE-3 at C = 4-16 in that round).  A forward launched on an idle server
    takes a whole forward's latency in either mode, and goodput speculates where loads go idle:
    what a mode adds to prefills is read from forwards launched while decoding."""
    def warmed(idle_flag: bool) -> float:
        p = Goodput()
        p._choose = lambda b, batch_size: batch_size == 1  # the warm-up's modes, as live
        for _ in range(8):
            for _ in range(16):
                d = p.decide(1)
                p.observe(StepRecord(1, d, (1,) if d else (), 0.0095))
            p.note_prefill(1, 100, 0.030, idle_flag)
            for _ in range(16):
                d = p.decide(63)
                p.observe(StepRecord(63, d, (), 0.012))
            p.note_prefill(63, 6300, 0.120)
        return p.prefill_estimates()["overhead_ms_per_request"]

    assert warmed(idle_flag=True) < 3.0
    # Unflagged, the idle forward is no refill either: its prompt grew the batch (the next
    # decode step ran 63 requests where the ones since the last burst ran 1).
    assert warmed(idle_flag=False) < 3.0


def test_goodput_counts_a_large_batchs_step_as_many_draws_once_requests_are_measured_alike():
    """`goodput:draws=N`: once pairs of steps show requests alike, a sampled step of B requests
    counts as min(B, N) draws of the within-request spread in the gain's uncertainty, so a few
    probes at batch 48 no longer leave the gain as unsure as a few at batch 1; at batch 1, while
    requests are not measured, and by default (draws=1), as one draw."""
    from dynspec.policy import bucket_of

    losing = _flat_profile(7.7, 19.0, 2.27)  # 2.27 tokens per 19 ms against 1 per 7.7: 8% behind

    def interval(batch, between, steps=8.0, draws=8):
        p = Goodput(losing, lead=0, draws=draws)
        b = bucket_of(batch)
        p._var_between, p._acc_steps[b] = between, steps
        p._refresh(b)
        return p._interval[0][b], p._step_sd(b)

    unmeasured, sd_unmeasured = interval(48, None)
    alike, sd_alike = interval(48, 0.0)
    assert sd_unmeasured == 1.0 and sd_alike == pytest.approx((1 / 8) ** 0.5)
    assert alike >= 2 * unmeasured, (alike, unmeasured)
    assert interval(48, 0.0, draws=1) == (unmeasured, 1.0)
    assert build_policy("goodput").draws == 1
    # requests that differ keep their spread whole: a step is never surer than they are alike
    assert interval(48, 0.25)[1] == pytest.approx((1 / 8 + 0.25) ** 0.5)
    assert unmeasured < interval(48, 0.25)[0] < alike
    # at batch 1 a step is one request's draw whatever is measured
    assert interval(1, 0.0) == interval(1, None)
    # and never more uncertain than one draw: requests far apart do not widen it
    assert interval(48, 4.0)[1] == 1.0
