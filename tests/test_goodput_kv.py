"""Goodput's step times follow the tokens in the batch's KV cache: a bucket's time is kept at the
KV tokens it was measured at and moved to the batch's by a slope learned from steady steps."""

from __future__ import annotations

import pytest

from pathlib import Path

from dynspec.analysis.replay import read_levels, replay, tenths
from dynspec.policy import StepRecord, build_policy
from dynspec.policy.buckets import bucket_of
from dynspec.policy.goodput import Goodput
from dynspec.sim.engine import Engine
from tests.test_engine import make_profile


def profile():
    # As one H100 ran crafted 8B weights live (the step trace of crossover-warm-2): a plain step
    # barely grows with context, a speculative one (verify and drafts attend it several times)
    # much more, so at batch 16 speculation wins on short contexts and loses on long ones.
    return make_profile(acceptance={"accept_length": 2.2, "concentration": 10}, steps=[
        {"context_len": 128, "batch_size": [1, 16, 64], "plain_ms": [6.5, 6.8, 8.5], "spec_ms": [9.5, 10.5, 19.0]},
        {"context_len": 2048, "batch_size": [1, 16, 64], "plain_ms": [7.0, 7.6, 11.0], "spec_ms": [11.0, 17.5, 40.0]},
    ])


def phases(spec: str, plan: list[tuple[int, int, int, int]]) -> list[tuple[float, float]]:
    """Closed-loop phases on one engine and policy (as levels on one live server): (C, input,
    output, requests) each; per phase the share of decode steps speculated and output tokens/s."""
    eng = Engine(profile(), build_policy(spec), seed=1)
    out = []
    for c, inp, outl, n in plan:
        for _ in range(c):
            eng.submit(inp, outl)
        left, spec_steps, steps = n - c, 0, 0
        t0, tok0 = eng.clock, eng.stats.tokens_out
        while (s := eng.step()) is not None:
            if s.kind == "decode":
                steps += 1
                spec_steps += s.speculated
            for _ in s.finished:
                if left > 0:
                    eng.submit(inp, outl)
                    left -= 1
        out.append((spec_steps / steps, (eng.stats.tokens_out - tok0) / (eng.clock - t0)))
    return out


PLAN = [(16, 128, 500, 32), (16, 2000, 200, 48), (16, 64, 300, 32)]  # short, long, short contexts


def test_a_bucket_timed_on_long_contexts_speculates_on_short_ones_at_once():
    by_kv, by_batch = phases("goodput", PLAN), phases("goodput:kv=0", PLAN)
    always, never = phases("always", PLAN), phases("never", PLAN)
    # Long contexts after short ones: the slope learned on the first phase's growing contexts
    # moves the speculative time up before a step there is timed; by batch size alone it stays
    # at the short contexts' until measured.
    assert by_kv[1][0] < 0.6 * by_batch[1][0] and by_kv[1][1] > 1.02 * by_batch[1][1]
    assert by_kv[1][1] >= 0.97 * never[1][1]
    # Short contexts again: by batch size the bucket holds the long contexts' time and decodes
    # plain for most of the phase; by KV tokens it speculates from the first wave.
    assert by_batch[2][0] < 0.3 and by_batch[2][1] < 0.97 * always[2][1]
    assert by_kv[2][0] > 0.8
    assert by_kv[2][1] >= 0.97 * always[2][1]
    assert by_kv[2][1] > 1.02 * by_batch[2][1]


def test_the_slope_is_learned_per_mode_from_steady_steps():
    p = build_policy("goodput:window=2")
    assert isinstance(p, Goodput)
    # spec: 10 ms + 0.25 us per KV token, plain: 6.8 ms + 0.02 us, at batch 16 as contexts grow
    kv, n = 16 * 128, [0, 0]
    for _ in range(1500):
        spec = p.decide(16)
        n[spec] += 1
        t = 0.010 + 0.25e-6 * kv if spec else 0.0068 + 0.02e-6 * kv
        p.observe(StepRecord(16, spec, [2] * 16 if spec else (), t, None, True, None, kv))
        kv = kv + 16 * 3 if spec else kv + 16
        if kv > 16 * 2048:  # a new wave
            kv = 16 * 128
    assert n[1] > 1000  # (speculation wins here: plain only probed)
    plain_slope, spec_slope = p.estimates()["16+"]["us_per_kv_token"]
    assert spec_slope == pytest.approx(0.25, rel=0.1)
    assert plain_slope < 0.1
    # At the last step's KV tokens the spec time is the line's, not the EMA's lagging point
    last = kv - 16 * 3
    assert p._times(p._last_b)[1] == pytest.approx(0.010 + 0.25e-6 * last, rel=0.02)
    # Steps that report no KV tokens leave the times by batch size
    q = build_policy("goodput:window=2")
    for _ in range(300):
        q.observe(StepRecord(16, True, [2] * 16, 0.012, None, True))
    assert q.estimates()["16+"]["kv_tokens"] == [None, None]
    assert q.estimates()["16+"]["us_per_kv_token"] == [0.0, 0.0]


def test_a_first_prefill_that_finishes_no_prompt_is_taken():
    # A server's first forward can be a chunk of a long prompt: no request admitted yet.
    p = build_policy("goodput")
    p.note_prefill(0, 8192, 0.2)
    p.note_prefill(1, 1000, 0.05)
    assert p.decide(1) in (True, False)


def test_each_bucket_moves_its_time_by_its_own_slope():
    # What a KV token costs falls as the batch grows (a small batch leaves attention's kernels
    # short of work): a speculative step pays 0.8 us per KV token at batch 2 and 0.25 us at batch
    # 32, as on one H100 with crafted 8B weights (batch 16: 0.25 us; drains of larger loads: more).
    p = build_policy("goodput:window=2")
    assert isinstance(p, Goodput)

    def level(bs: int, base: float, slope: float, ctx_lo: int, ctx_hi: int, steps: int) -> None:
        ctx = ctx_lo
        for _ in range(steps):
            spec = p.decide(bs)
            kv = bs * ctx
            t = base + slope * kv if spec else 0.0068 + 0.02e-6 * kv
            p.observe(StepRecord(bs, spec, [2] * bs if spec else (), t, None, True, None, kv))
            ctx = ctx + 3 if spec else ctx + 1
            if ctx > ctx_hi:
                ctx = ctx_lo

    level(32, 0.012, 0.25e-6, 100, 300, 1500)  # batch 32 timed on short contexts
    level(2, 0.0095, 0.8e-6, 128, 2048, 3000)  # then a long stretch at batch 2
    # Batch 32 again, on 500-token contexts: its time moves by its own slope, not batch 2's.
    kv = 32 * 500
    p.observe(StepRecord(32, True, [2] * 32, None, None, True, None, kv))  # (untimed: sets the KV tokens)
    est = p.estimates()
    assert est["32+"]["us_per_kv_token"][1] == pytest.approx(0.25, rel=0.15)
    assert est["2+"]["us_per_kv_token"][1] == pytest.approx(0.8, rel=0.15)
    assert p._times(p._last_b)[1] == pytest.approx(0.012 + 0.25e-6 * kv, rel=0.03)


def test_a_bucket_of_many_batch_sizes_is_priced_at_the_batch_now():
    # Bucket 16+ holds batches 16..23, and a speculative step at 23 costs a quarter more than at
    # 16 (0.4 ms a request, as on one H200 with crafted 8B weights).  Drains of larger loads time it
    # at 17..23 requests on long contexts; a level at C=16 runs it at 16 requests on short ones.
    p = build_policy("goodput:window=2")
    assert isinstance(p, Goodput)

    def spec_time(bs: int, kv: int) -> float:
        return 0.009 + 0.4e-3 * (bs - 16) + 0.25e-6 * kv

    def step(bs: int, ctx: int) -> int:
        spec, kv = p.decide(bs), bs * ctx
        t = spec_time(bs, kv) if spec else 0.0054 + 0.01e-3 * (bs - 16) + 0.01e-6 * kv
        p.observe(StepRecord(bs, spec, [2] * bs if spec else (), t, None, True, None, kv))
        return 3 if spec else 1

    for _ in range(6):  # drains: the batch falls from 23 to 16 while contexts grow
        ctx = 400
        for bs in range(23, 15, -1):
            for _ in range(40):
                ctx += step(bs, ctx)
    ctx = 100
    for _ in range(600):  # a level at C=16, contexts from 100 to 300 tokens, then again
        ctx += step(16, ctx)
        if ctx > 300:
            ctx = 100
    for bs, ctx in ((16, 350), (23, 500)):
        kv = bs * ctx
        p.observe(StepRecord(bs, True, [2] * bs, None, None, True, None, kv))  # (untimed: sets the batch)
        assert p._times(p._last_b)[1] == pytest.approx(spec_time(bs, kv), rel=0.03), (bs, ctx)
    per_request = p.estimates()["16+"]["ms_per_request"][1]
    assert per_request == pytest.approx(0.4, rel=0.2)


def test_the_plane_tells_batch_size_from_kv_tokens_where_they_move_apart():
    from dynspec.policy.goodput.times import _plane
    import random
    rng = random.Random(0)
    pts = [(rng.uniform(-4, 4), rng.uniform(-3000, 3000)) for _ in range(400)]

    def moments(f):
        zz = sum(z * z for z, _ in pts)
        zx = sum(z * x for z, x in pts)
        xx = sum(x * x for _, x in pts)
        zy = sum(z * f(z, x) for z, x in pts)
        xy = sum(x * f(z, x) for z, x in pts)
        return zz, zx, xx, zy, xy

    c, h = _plane(*moments(lambda z, x: 4e-4 * z + 2.5e-7 * x))
    assert c == pytest.approx(4e-4, rel=1e-6) and h == pytest.approx(2.5e-7, rel=1e-6)
    # A step never gets cheaper with more requests: a negative slope falls back to the other alone
    c, h = _plane(*moments(lambda z, x: -1e-4 * z + 2.5e-7 * x))
    assert c == 0.0 and h == pytest.approx(2.5e-7, rel=0.05)
    # One batch size (z fixed): KV tokens alone
    c, h = _plane(0.0, 0.0, 1e6, 0.0, 0.25)
    assert (c, h) == (0.0, pytest.approx(2.5e-7))



# One H100's first C=16 level of crossover-steady (experiments/h200-llama8b-crafted), on a goodput
# policy built as the level began: its step trace.
FRESH_C16 = Path(__file__).parent / "data" / "goodput-trace-c16-fresh.csv.gz"


def test_a_few_steps_a_few_hundred_tokens_apart_are_no_slope(monkeypatch):
    # Live, a fresh policy's first four speculative steps at batch 16 (one a 23 ms stall) were read
    # as 28 us a KV token, its speculative time moved to the +50% cap and it decoded plain through
    # the second to fourth tenths of a level where EAGLE-3 won by 1.18.  Replayed on that trace:
    (level,) = read_levels(FRESH_C16)
    gains = [r["gain"] for r in tenths(level)]
    assert min(gains[1:]) > 1.0
    monkeypatch.setattr(Goodput, "KV_RIDGE", 0)  # without the ridge, as it ran
    monkeypatch.setattr(Goodput, "DEV_K", 1e9)  # (and without the clip, which also stops that stall)
    assert max(tenths(level)[1:3], key=lambda r: r["gain"])["gain"] < 0.85


# One H200's C=16 level of crossover-ridge (experiments/h200-llama8b-crafted) on a goodput policy
# built as the level began, where speculating paid about 5% a step: its step trace.
FRESH_C16_H200 = Path(__file__).parent / "data" / "goodput-trace-c16-h200-fresh.csv.gz"


def test_a_few_speculative_steps_do_not_move_the_acceptance_by_more_than_the_margin(monkeypatch):
    # Live, eight speculative steps after a switch weighed half the acceptance estimate: it read
    # 1.05-1.26 accepted drafts a request through a level whose steps accepted 1.16, moved the gain
    # by 5% against a 2% margin, and the policy switched modes 30 times a level.
    (level,) = read_levels(FRESH_C16_H200)
    peak = max(int(r["batch"]) for r in level if r["kind"] in "SP")
    spec = [int(r["count"]) / peak for r in level if r["kind"] == "S" and int(r["batch"]) == peak]
    truth = sum(spec) / len(spec)
    read = [r["accepted"] for r in tenths(level)[1:]]
    assert max(abs(a / truth - 1.0) for a in read) < 0.05
    monkeypatch.setattr(Goodput, "ACC_STEPS", 10)  # a step weighing up to 1/10, as it ran
    read = [r["accepted"] for r in tenths(level)[1:]]
    assert max(abs(a / truth - 1.0) for a in read) > 0.07


# One H100's C=24 level of crossover-lead (experiments/h200-llama8b-crafted), goodput without its
# lead deciding, where speculating paid 6-10% over a level: its step trace.
STALL_C24_H100 = Path(__file__).parent / "data" / "goodput-trace-c24-h100-stall.csv.gz"


def test_a_stalled_step_does_not_hold_the_speculative_time_up(monkeypatch):
    # Live, two speculative steps near the level's end took 47 and 25 ms where the level's took
    # 14.4: folded into the mean (capped at twice the estimate) they moved it 13% up, and it stayed
    # there while the policy decoded plain.
    (level,) = read_levels(STALL_C24_H100)
    peak = max(int(r["batch"]) for r in level if r["kind"] in "SP")
    gaps, last, prev_kind, dirty = [], None, None, False
    for r in level:  # the level's clean speculative steps at its peak batch: result after result
        if r["kind"] in "fF":
            dirty = True
            continue
        if r["kind"] not in "PS":
            continue
        t = float(r["t"])
        if last is not None and not dirty and r["kind"] == prev_kind == "S" and int(r["batch"]) == peak:
            gaps.append(t - last)
        last, prev_kind, dirty = t, r["kind"], False
    median = sorted(gaps)[len(gaps) // 2]

    def spec_time() -> float:
        p = Goodput(window=3)
        replay([level], policy=p)
        return p.t_est[1][bucket_of(peak)]

    assert spec_time() == pytest.approx(median, rel=0.03)
    monkeypatch.setattr(Goodput, "DEV_K", 1e9)  # every step in the mean, as it ran
    assert spec_time() > 1.1 * median


def test_a_bucket_timed_once_moves_its_time_by_the_pooled_slope():
    # C=128 on one H100 (crafted 8B weights, 2026-12-07): the 128+ bucket's speculative time
    # rested on a few steps at the level's start, at a third of the KV tokens plain decoded at
    # later, and a bucket's own plane began at its second steady step, so the time moved nowhere
    # (its cost ratio read 0.81 of the arms' implied).  From its first steady step a bucket
    # takes the plane pooled over buckets (shrunk as its own has no steps yet).
    p = build_policy("goodput:window=2")
    assert isinstance(p, Goodput)

    def step(bs: int, kv: int, timed: bool = True) -> None:
        spec = p.decide(bs)
        t = (0.012 + 0.25e-6 * kv if spec else 0.0068 + 0.02e-6 * kv) if timed else None
        p.observe(StepRecord(bs, spec, [2] * bs if spec else (), t, None, True, None, kv))

    ctx = 100
    for _ in range(1500):  # batch 32 on contexts of 100..300: speculating pays 0.25 us a KV token
        step(32, 32 * ctx)
        ctx = ctx + 3 if ctx < 300 else 100
    b, kv0 = bucket_of(128), 128 * 120
    while p.t_est[1][b] is None or p._seeded[1][b]:  # to batch 128's first steady speculative step
        step(128, kv0)
    t0 = p.t_est[1][b]
    step(128, 3 * kv0, timed=False)  # the batch's KV tokens now, untimed
    moved = p._times(b)[1] - t0
    assert moved == pytest.approx(0.25e-6 * 2 * kv0, rel=0.25), moved
