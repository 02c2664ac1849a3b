"""What a prefill costs is read from the forwards that refill finished requests, in either mode.

Live (one H100, crafted 8B weights, C=32, outputs of 256-512 tokens), each level began with a
forward of 31 prompts while one request decoded, then refills of one prompt each at 12.5 ms
beyond the plain steps.  Read as goodput read them, the first wave made the refills look like
requests finishing in lockstep (6-7 prompts a forward through most of the level: speculation
charged 9% for scattering them) and priced a refill at a third of its cost; and each prefill
was priced in whichever mode ran beside it.  Replayed through goodput (a script over the run's
step trace), its gain at batch 32 read 0.89-0.94 where speculating held 1.06 of plain on the
same server."""

from __future__ import annotations

import pytest

from dynspec.policy import StepRecord
from dynspec.policy.goodput import Goodput

PLAIN, SPEC = 0.0073, 0.0150


def decode(p: Goodput, bs: int, steps: int, spec: bool | None = None, t: float | None = None) -> None:
    for _ in range(steps):
        d = p.decide(bs)
        if spec is not None:
            d = spec
            p._window = ((p._window >> 1) << 1) | int(d)  # the mode this step ran
        p.observe(StepRecord(bs, d, (1,) * bs if d else (), t or (SPEC if d else PLAIN), None, True))


def refill(p: Goodput, prompts: int, seconds: float, spec: bool | None = None, batch: int = 32) -> None:
    """A request finishes (the batch drops by one), the step that held the prefill's launch takes
    `seconds` more (not clean), then the prefill's result and the batch back at `batch`."""
    decode(p, batch - 1, 2, spec)
    d = p.decide(batch - 1)
    if spec is not None:
        d = spec
        p._window = ((p._window >> 1) << 1) | int(d)
    p.observe(StepRecord(batch - 1, d, (1,) * (batch - 1) if d else (), (SPEC if d else PLAIN) + seconds, None, False))
    p.note_prefill(prompts, prompts * 100, 0.001)


def first_wave(p: Goodput, prompts: int = 31, seconds: float = 0.060) -> None:
    """A new load: the server drains to one request, then the rest arrive in one forward."""
    decode(p, 1, 20, spec=False)
    d = p.decide(1)
    p.observe(StepRecord(1, d, (1,) if d else (), (SPEC if d else PLAIN) + seconds, None, False))
    p.note_prefill(prompts, prompts * 100, 0.001)


def test_a_new_loads_first_wave_is_not_read_as_requests_finishing_together():
    p = Goodput(window=3)
    for _ in range(40):  # a level's refills: one prompt a forward
        refill(p, 1, 0.0115)
        decode(p, 32, 8)
    first_wave(p)
    decode(p, 32, 8)
    per, scatter = [], []
    for _ in range(10):  # the next level's first refills
        refill(p, 1, 0.0115)
        decode(p, 32, 8)
        b = p._last_b
        tp, ts = p._times(b)
        per.append(p._per_prefill)
        scatter.append(p._scatter(b, 1.18, tp, ts))
    assert max(per) < 1.5, per  # (read whole, 31 prompts a forward: 6.6 after five refills)
    assert max(scatter) == 0.0, scatter
    assert p.prefill_estimates()["lockstep"] is False


def test_a_first_wave_does_not_price_the_refills_after_it():
    p = Goodput(window=3)
    for _ in range(20):
        refill(p, 1, 0.0115)
        decode(p, 32, 8)
    first_wave(p, seconds=0.060)  # 2 ms a prompt
    decode(p, 32, 8)
    for _ in range(20):
        refill(p, 1, 0.0115)
        decode(p, 32, 8)
    # A refill: 11.5 ms on the step that held its launch and 1 ms its own result.  (Counted with
    # the first wave's 31 prompts: about 5 ms.)
    assert p.prefill_estimates()["overhead_ms_per_request"] == pytest.approx(12.5, rel=0.1)


def test_a_mode_that_stopped_running_does_not_keep_a_stale_prefill_cost():
    # Speculating on short prompts (3 ms a refill), then plain on long ones (30 ms): the cost a
    # speculative step would pay for its prefills is the long prompts', the same as plain's.
    p = Goodput(window=3)
    for _ in range(60):
        refill(p, 1, 0.002, spec=True)
        decode(p, 32, 8, spec=True)
    for _ in range(120):
        refill(p, 1, 0.029, spec=False)
        decode(p, 32, 8, spec=False)
    # (priced by mode, the speculative figure stayed at 3 ms and capped plain's)
    assert p.prefill_estimates()["overhead_ms_per_request"] == pytest.approx(30.0, rel=0.1)
    b = p._last_b
    tp, ts = p._times(b)
    cp, cs = p._costs(b, 1.0, tp, ts)
    assert (cs - ts) == pytest.approx(2.0 * (cp - tp))  # a speculative step finishes twice the requests


def test_a_first_wave_whose_output_budgets_differ_is_not_presumed_in_lockstep():
    """A server's first forward is presumed a closed loop's lockstep: its requests would finish
    together under plain decoding, and speculating scatters them (a prefill's fixed cost per
    request).  Requests finish at their output budget or before it, so a wave whose budgets
    spread over more steps than its finishes can share forwards over cannot move in lockstep.
    On the profile fitted to a live H100 run (EAGLE-3 / plain about 1.04 at C=32), a first wave of
    256-512-token outputs was decoded plain for most of its life; one of fixed 384 still is."""
    import random

    from dynspec.policy import build_policy
    from dynspec.sim.profile import load_profile
    from dynspec.sim.run import simulate_level

    p = build_policy("goodput")
    p.note_prefill(32, 4096, 0.02)
    assert p.wants_budgets
    p.note_budgets([384] * 32)  # equal: finishes may come together
    decode(p, 32, 1)
    assert not p.wants_budgets and p._lock and p._lead_now == p.lead
    apart = build_policy("goodput-k")  # goodput-k hands them to its goodput
    apart.note_prefill(32, 4096, 0.02)
    assert apart.wants_budgets
    apart.note_budgets(list(range(256, 512, 8)))
    decode(apart.inner, 32, 1)
    assert not apart.wants_budgets and not apart.inner._lock and apart.inner._lead_now == apart.inner.lead_apart

    profile = load_profile("experiments/h200-llama8b-crafted/fitted-h100-refills.yaml")

    def first_wave_speculated(lengths: list[tuple[int, int]]) -> float:
        modes: list[bool] = []
        simulate_level(profile, "dynamic", 32, lengths=lengths, seed=0,
                       on_step=lambda eng, st: modes.append(st.speculated) if st.kind == "decode" else None)
        return sum(modes[:100]) / 100  # before the first request can finish

    rng = random.Random(0)
    assert first_wave_speculated([(128, rng.randint(256, 512)) for _ in range(64)]) > 0.8
    assert first_wave_speculated([(128, 384)] * 64) < 0.2


@pytest.mark.parametrize("batch", [64, 95])
def test_a_steps_share_of_the_prefills_is_at_the_batch_its_bucket_runs(batch):
    # A plain step finishes batch / output-per-request requests, each with its prefill overhead:
    # at the batch the bucket runs, not its middle (78 for 64..95, a fifth too dear for a closed
    # loop of 64).
    p = Goodput(window=3)
    first_wave(p)
    decode(p, batch, 6, spec=True)  # a speculative time and acceptance for the bucket
    for _ in range(80):
        refill(p, 1, 0.029, spec=False, batch=batch)
        decode(p, batch, 8, spec=False)
    row, read = p.estimates()["64+"], p.prefill_estimates()
    # (95 shares its bucket with the 94 of each refill's steps)
    expected = read["overhead_ms_per_request"] * batch / read["output_per_request"]
    assert row["prefill_ms"] == pytest.approx(expected, rel=0.02)
