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
