"""dynspec.sglang.hook: what the patched SGLang imports (no SGLang or torch needed here)."""

from __future__ import annotations

import logging
import random
import subprocess
import sys

import pytest

from dynspec.policy import FailSafePolicy, Goodput, Policy, build_policy
from scripted_policy import Scripted
from tp_ranks import FakeAllReduce, run_ranks
from dynspec.sglang.hook import Controller, catch_up_window, load_controller, plain_cuda_graph_enabled


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_hook_imports_nothing_heavy():
    code = ("import sys, dynspec.sglang.hook; heavy = [m for m in ('torch', 'numpy', 'pydantic', 'yaml', "
            "'sglang', 'prometheus_client') if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_unset_or_empty_policy_gives_none(caplog):
    with caplog.at_level(logging.DEBUG):
        assert load_controller(env={}) is None
        assert load_controller(env={"DYNSPEC_POLICY": "  "}) is None
    assert caplog.records == []  # inert: not even a log line


def test_counts_switches_and_logs_one_line_per_switch(caplog):
    policy = Scripted([True, False, False, True, True, False])
    ctl = Controller(policy, spec="scripted", logger=logging.getLogger("t.hook"))
    with caplog.at_level(logging.INFO, logger="t.hook"):
        got = [ctl.decide(bs) for bs in (1, 40, 41, 2, 3, 50)]
    assert got == [True, False, False, True, True, False]
    st = ctl.stats()
    assert (st["steps"], st["steps_spec"], st["steps_plain"], st["switches"], st["mode"]) == (6, 3, 3, 3, "plain")
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "dynspec: switch spec -> plain at step 2, batch size 40: because 40",
        "dynspec: switch plain -> spec at step 4, batch size 2: because 2",
        "dynspec: switch spec -> plain at step 6, batch size 50: because 50",
    ]
    assert st["last_switch"]["step"] == 6 and st["last_switch"]["reason"] == "because 50"


def test_server_info_shows_what_goodput_believes():
    """/get_server_info carries goodput's per-bucket estimates (why it decides as it does), with a
    plain time no higher than the spec time it is compared with."""
    t = iter([i * 0.01 for i in range(100)])
    ctl = Controller(build_policy("goodput"), spec="goodput", clock=lambda: next(t))
    assert Controller(Scripted([True]), spec="s").stats()["estimates"] is None  # a policy without any
    for _ in range(12):
        spec = ctl.decide(1)
        ctl.observe(1, spec, [0] if spec else [])
    est = ctl.stats()["estimates"]["1+"]
    assert est["spec_ms"] == pytest.approx(10.0) and est["plain_ms"] == pytest.approx(10.0)
    assert est["accepted"] == 0.0 and est["speculate"] is False


def test_only_rank_zero_logs(caplog):
    ctl = Controller(Scripted([False]), spec="s", tp_rank=3, tp_size=4, sync=lambda xs: xs,
                     logger=logging.getLogger("t.hook"))
    with caplog.at_level(logging.INFO, logger="t.hook"):
        ctl.decide(8)
    assert ctl.switches == 1 and caplog.records == []


def test_forced_spec_when_the_batch_cannot_run_plain():
    ctl = Controller(Scripted([False, False]), spec="s")
    assert ctl.decide(4, can_plain=False) is True
    assert ctl.decide(4) is False
    assert (ctl.forced_spec, ctl.steps_spec, ctl.steps_plain) == (1, 1, 1)


def test_observe_builds_step_records_with_times():
    clock = Clock()
    policy = Scripted([])
    ctl = Controller(policy, spec="s", clock=clock)
    ctl.observe(4, True, [1, 0, 2, 3])  # first: no interval yet
    clock.t += 0.020
    ctl.observe(4, False, [0, 0, 0, 0])
    clock.t += 0.030
    ctl.note_other_forward()  # a prefill was launched: the next interval holds its host work too
    ctl.observe(4, True, [1, 1, 1, 1])
    clock.t += 0.025
    ctl.observe(4, True, [1, 1, 1, 1])
    clock.t += 0.025
    ctl.observe(4, True, [2, 2, 2, 2])
    clock.t += 60.0  # an idle pause is not a step time
    ctl.observe(4, True, [2, 2, 2, 2])
    r = policy.records
    # every interval goes to the policy, which tells steady ones apart (Goodput, `window`)
    assert [x.step_time_s for x in r] == [None, pytest.approx(0.020), pytest.approx(0.030), pytest.approx(0.025),
                                          pytest.approx(0.025), None]
    assert [x.clean for x in r] == [True, True, False, True, True, True]
    assert r[1].accepted == () and not r[1].speculated  # plain steps carry no acceptance
    assert r[0].accepted == (1, 0, 2, 3)
    assert ctl.stats()["mean_accepted_when_speculating"] == pytest.approx((6 + 4 + 4 + 8 + 8) / 20)
    assert (ctl.stats()["drafts_accepted"], ctl.stats()["request_steps_speculated"]) == (30, 20)


def test_multi_rank_without_sync_never_passes_local_times():
    clock = Clock()
    policy = Scripted([])
    ctl = Controller(policy, spec="s", tp_size=2, sync=None, clock=clock)
    for _ in range(3):
        clock.t += 0.01
        ctl.observe(2, True, [1, 1])
    assert all(x.step_time_s is None for x in policy.records)
    assert ctl.stats()["step_times_used"] is False


def test_policy_failure_falls_back_to_speculating(caplog):
    class Broken(Policy):
        name = "broken"

        def decide(self, batch_size):
            raise ZeroDivisionError("boom")

    ctl = Controller(Broken(), spec="broken")
    with caplog.at_level(logging.WARNING):
        assert [ctl.decide(8) for _ in range(3)] == [True, True, True]
    assert isinstance(ctl.policy, FailSafePolicy) and ctl.stats()["policy_failed"] is True
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1


@pytest.mark.parametrize("env, expect", [
    ({"DYNSPEC_POLICY": "threshold:"}, "invalid"),
    ({"DYNSPEC_POLICY": "no-such-policy"}, "invalid"),
    ({"DYNSPEC_POLICY": "goodput", "DYNSPEC_PROFILE": "/no/such/profile.yaml"}, "cannot start"),
])
def test_misconfiguration_is_one_warning_and_none(env, expect, caplog):
    with caplog.at_level(logging.WARNING):
        assert load_controller(env=env, logger=logging.getLogger("t.hook")) is None
    msgs = [r.getMessage() for r in caplog.records]
    assert len(msgs) == 1 and expect in msgs[0] and "speculates on every step" in msgs[0]


def test_live_controller_from_env(caplog):
    with caplog.at_level(logging.INFO):
        ctl = load_controller(env={"DYNSPEC_POLICY": "threshold:on=4,off=8,dwell=0"}, tp_rank=0,
                              logger=logging.getLogger("t.hook"))
    assert ctl is not None and ctl.spec == "threshold:on=4,off=8,dwell=0"
    assert any("is live" in r.getMessage() for r in caplog.records)
    assert [ctl.decide(b) for b in (2, 9, 9, 5, 4)] == [True, False, False, False, True]


def test_tp_sync_factory_is_used_for_multi_rank():
    calls = []

    def factory():
        calls.append("built")
        return lambda xs: xs

    ctl = load_controller(env={"DYNSPEC_POLICY": "goodput"}, tp_rank=1, tp_size=2, sync_factory=factory)
    assert calls == ["built"] and ctl.times_agreed and ctl.policy.inner.sync is not None
    one = load_controller(env={"DYNSPEC_POLICY": "goodput"}, tp_size=1, sync_factory=factory)
    assert calls == ["built"] and one.times_agreed and one.policy.inner.sync is None


def test_broken_sync_factory_drops_times_but_starts(caplog):
    def factory():
        raise RuntimeError("no gloo group")

    with caplog.at_level(logging.WARNING):
        ctl = load_controller(env={"DYNSPEC_POLICY": "goodput"}, tp_size=4, sync_factory=factory,
                              logger=logging.getLogger("t.hook"))
    assert ctl is not None and ctl.times_agreed is False
    assert any("sync hook" in r.getMessage() for r in caplog.records)


def test_plain_cuda_graph_switch():
    assert plain_cuda_graph_enabled({}) is True
    assert plain_cuda_graph_enabled({"DYNSPEC_PLAIN_CUDA_GRAPH": "0"}) is False
    assert plain_cuda_graph_enabled({"DYNSPEC_PLAIN_CUDA_GRAPH": "off"}) is False
    assert plain_cuda_graph_enabled({"DYNSPEC_PLAIN_CUDA_GRAPH": "1"}) is True


def test_catch_up_window_takes_1_to_64_and_falls_back_with_one_line(caplog):
    assert catch_up_window({}) == 32
    assert catch_up_window({"DYNSPEC_CATCHUP_WINDOW": " 1 "}) == 1
    assert catch_up_window({"DYNSPEC_CATCHUP_WINDOW": "64"}) == 64
    log = logging.getLogger("test-window")
    for bad in ("0", "65", "eight", "2.5"):
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            assert catch_up_window({"DYNSPEC_CATCHUP_WINDOW": bad}, log=log) == 32
        assert len(caplog.records) == 1 and "DYNSPEC_CATCHUP_WINDOW" in caplog.text


def test_prometheus_series():
    prom = pytest.importorskip("prometheus_client")
    reg = prom.CollectorRegistry()
    ctl = Controller(Scripted([True, False, False, True]), spec="s")
    assert ctl.enable_prometheus({"model_name": "m"}, registry=reg)
    for b in (1, 2, 3, 4):
        ctl.decide(b)
    v = lambda name: reg.get_sample_value(name, {"model_name": "m"})  # noqa: E731
    assert v("dynspec_steps_speculative_total") == 2
    assert v("dynspec_steps_plain_total") == 2
    assert v("dynspec_switches_total") == 2
    assert v("dynspec_mode") == 1


# --- tensor parallelism: ranks in threads, an all-reduce stand-in -------------------------------

def _tp_stream(steps: int, seed: int = 5):
    """Rank-identical inputs: batch sizes and accepted counts (the ranks schedule and sample alike)."""
    rng = random.Random(seed)
    bs, out = 4, []
    for _ in range(steps):
        bs = min(max(bs + rng.choice((-2, -1, 0, 1, 2)), 1), 48)
        out.append((bs, [rng.choice((0, 0, 1, 2)) for _ in range(bs)]))
    return out


def _drive(ctl: Controller, clock: Clock, stream, step_time) -> list[bool]:
    """One rank's loop: decide, run (the local clock advances), observe."""
    out = []
    for i, (bs, acc) in enumerate(stream):
        spec = ctl.decide(bs)
        clock.t += step_time(i, bs, spec)
        ctl.observe(bs, spec, acc if spec else ())
        out.append(spec)
    return out


def test_tp_ranks_agree_on_step_time_counts():
    """Each rank drops the intervals it cannot trust on its own (0 < dt <= MAX_STEP_TIME_S):
    the agreement must carry the counts, not only the sums, or the ranks' estimates part."""
    reduce = FakeAllReduce(2)
    clocks = [Clock(), Clock()]
    ctls = [Controller(Goodput(sync=reduce.hook(r), sync_every=16), spec="goodput", tp_rank=r, tp_size=2,
                       sync=reduce.hook(r), clock=clocks[r]) for r in range(2)]
    stream = _tp_stream(3000)

    def step_time(r):
        def t(i, bs, spec):
            if r == 1 and i % 7 == 3:
                return 0.0  # a coarse clock: this rank's interval is 0 and is dropped
            return (0.004 + 0.0002 * bs) * (3.0 if spec else 1.0) * (1.0 + 0.3 * r)
        return t

    got = run_ranks(lambda r: _drive(ctls[r], clocks[r], stream, step_time(r)), 2)
    assert got[0] == got[1]
    assert 0 < sum(got[0]) < len(stream)  # both modes ran
    inner = [c.policy.inner for c in ctls]
    assert inner[0].t_est == inner[1].t_est
    assert ctls[0].fallback is None and ctls[1].fallback is None and not reduce.broken


def test_tp_state_mismatch_falls_back_on_every_rank(caplog):
    """A rank whose decision state went its own way (here one accepted count differed) is
    caught by the checksum at the next agreement: every rank speculates from then on."""
    reduce = FakeAllReduce(2)
    ctls = [Controller(build_policy("sglang-default-tiers"), spec="tiers", tp_rank=r, tp_size=2,
                       sync=reduce.hook(r), logger=logging.getLogger("t.tp")) for r in range(2)]
    stream = [(4, [1, 1, 1, 1])] * 50 + [(80, [0] * 80)] * 100

    def rank(r):
        out = []
        for i, (bs, acc) in enumerate(stream):
            spec = ctls[r].decide(bs)
            if r == 1 and i == 10:
                acc = [3, 3, 3, 3]  # rank 1's sampling disagreed once
            ctls[r].observe(bs, spec, acc if spec else ())
            out.append(spec)
        return out

    with caplog.at_level(logging.WARNING, logger="t.tp"):
        got = run_ranks(rank, 2)
    assert got[0] == got[1] and all(got[0][64:])  # the first agreement is at step 64
    assert ctls[0].fallback == ctls[1].fallback and "differ" in ctls[0].fallback
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "every TP rank speculates" in warnings[0]


def test_tp_identical_states_never_fall_back():
    reduce = FakeAllReduce(2)
    ctls = [Controller(build_policy("sglang-default-tiers"), spec="tiers", tp_rank=r, tp_size=2,
                       sync=reduce.hook(r)) for r in range(2)]
    stream = [(4, [1, 1, 1, 1])] * 50 + [(80, [0] * 80)] * 100
    got = run_ranks(lambda r: [ctls[r].decide(bs) or ctls[r].observe(bs, True, acc) or True
                               for bs, acc in stream], 2)
    assert got[0] == got[1] and reduce.calls == len(stream) // 64
    assert ctls[0].fallback is None and ctls[0].steps_plain > 0


def test_tp_policy_failure_on_one_rank_falls_back_on_every_rank(caplog):
    """A failure on one rank (here rank 1's policy raises at step 100) must not leave the ranks
    split, nor make the others wait for it in the next agreement."""

    class FailsAt(Goodput):
        def __init__(self, at, **kw):
            super().__init__(**kw)
            self.at = at

        def decide(self, batch_size):
            if self._step + 1 == self.at:
                raise MemoryError("rank-local")
            return super().decide(batch_size)

    reduce = FakeAllReduce(2, timeout=5.0)
    clocks = [Clock(), Clock()]
    ctls = [Controller(FailsAt(100 if r == 1 else -1, sync=reduce.hook(r)), spec="goodput", tp_rank=r,
                       tp_size=2, sync=reduce.hook(r), clock=clocks[r], logger=logging.getLogger("t.tp"))
            for r in range(2)]
    stream = _tp_stream(400)
    with caplog.at_level(logging.WARNING, logger="t.tp"):
        got = run_ranks(lambda r: _drive(ctls[r], clocks[r], stream,
                                         lambda i, bs, spec: 0.005 * (4.0 if spec else 1.0)), 2)
    assert not reduce.broken  # the failed rank still joined every agreement
    assert got[0][128:] == got[1][128:] and all(got[0][128:])  # the agreement after the failure: step 128
    assert got[0][:99] == got[1][:99] and not all(got[0][:99])
    assert ctls[0].fallback == ctls[1].fallback == "fallback: the policy failed on a TP rank"
    rank0 = [r.getMessage() for r in caplog.records if "every TP rank" in r.getMessage()]
    assert len(rank0) == 1


def test_tp_start_is_all_or_nothing(caplog):
    """A rank that cannot start dynspec (here its profile path is missing) turns it off everywhere."""
    reduce = FakeAllReduce(2, op="min")
    envs = [{"DYNSPEC_POLICY": "goodput"}, {"DYNSPEC_POLICY": "goodput", "DYNSPEC_PROFILE": "/no/such.yaml"}]
    with caplog.at_level(logging.WARNING, logger="t.tp"):
        got = run_ranks(lambda r: load_controller(env=envs[r], tp_rank=r, tp_size=2, sync=lambda v: v,
                                                  min_sync=reduce.hook(r), logger=logging.getLogger("t.tp")), 2)
    assert got == [None, None]
    msgs = [r.getMessage() for r in caplog.records]
    assert len(msgs) == 1 and "could not start on every TP rank" in msgs[0]


def test_tp_sync_hook_missing_on_one_rank_means_none_uses_it():
    reduce = FakeAllReduce(2, op="min")

    def factory(r):
        def build():
            if r == 1:
                raise RuntimeError("no gloo group here")
            return lambda v: v
        return build

    got = run_ranks(lambda r: load_controller(env={"DYNSPEC_POLICY": "goodput"}, tp_rank=r, tp_size=2,
                                              sync_factory=factory(r), min_sync=reduce.hook(r)), 2)
    assert all(c is not None and c.sync is None and not c.times_agreed and not c.agreeing for c in got)


def test_tp_plain_graphs_are_used_only_when_every_rank_captured():
    reduce = FakeAllReduce(2, op="min")
    ctls = [Controller(Scripted([]), spec="s", tp_rank=r, tp_size=2, min_sync=reduce.hook(r)) for r in range(2)]
    assert run_ranks(lambda r: ctls[r].agree_plain_graphs(captured=r == 0), 2) == [False, False]
    assert [c.plain_step_kind for c in ctls] == ["eager", "eager"]
    assert run_ranks(lambda r: ctls[r].agree_plain_graphs(captured=True), 2) == [True, True]
    assert [c.stats()["plain_step"] for c in ctls] == ["cuda_graph", "cuda_graph"]
    one = Controller(Scripted([]), spec="s")
    assert one.agree_plain_graphs(True) and not one.agree_plain_graphs(False)


def test_requests_without_ids_leave_the_population_estimate():
    """A batch whose request objects have no rid (another SGLang's Req) must not fail the step:
    the policy is told None and keeps its population estimate."""
    from types import SimpleNamespace

    policy = Scripted([True, True], requests_up_to=8)
    ctl = Controller(policy, spec="scripted")
    assert ctl.decide(2, reqs=[SimpleNamespace(), SimpleNamespace()]) is True
    ctl.observe(2, True, (1, 1), reqs=[SimpleNamespace(), SimpleNamespace()])
    assert policy.batches == [None] and policy.records[-1].requests is None
    assert ctl.decide(2, reqs=[SimpleNamespace(rid="a"), SimpleNamespace(rid="b")]) is True
    assert policy.batches[-1] == ["a", "b"] and ctl.stats()["steps_with_requests"] == 1


def test_a_prefill_is_timed_apart_from_the_decode_steps():
    """note_prefill: the prompts a prefill forward finished and its tokens reach the policy with
    the interval since the previous result; the next decode step's interval no longer holds it."""
    clock = Clock()
    policy = Scripted([])
    ctl = Controller(policy, spec="s", clock=clock)
    ctl.note_prefill(4, 1600)  # the first result: no interval yet
    clock.t += 0.010
    ctl.observe(4, False)
    clock.t += 0.050
    ctl.note_prefill(1, 400)
    clock.t += 0.010
    ctl.observe(4, False)
    clock.t += 5.0  # idle; then a prompt is launched (the worker's note_other_forward) and done
    ctl.note_other_forward()
    clock.t += 0.030
    ctl.note_prefill(1, 400)
    clock.t += 0.010
    ctl.observe(1, False)
    assert policy.prefills == [(4, 1600, None), (1, 400, pytest.approx(0.050)), (1, 400, pytest.approx(0.030))]
    assert policy.idle == [False, False, True]  # only the one launched after the pause: a whole forward
    # the decode step after the idle prompt: its interval, marked as holding a prefill's launch
    assert [r.step_time_s for r in policy.records] == [pytest.approx(0.010), pytest.approx(0.010), pytest.approx(0.010)]
    assert [r.clean for r in policy.records] == [True, True, False]
    st = ctl.stats()
    assert (st["prefills"], st["prompts_prefilled"], st["idle_prefills"]) == (3, 6, 1)
    assert st["prefill_estimates"] is None  # a policy that reads none
    ranks = Controller(Scripted([]), spec="s", tp_size=2, sync=None, clock=clock)
    clock.t += 0.01
    ranks.note_prefill(2, 800)
    clock.t += 0.01
    ranks.note_prefill(2, 800)
    assert [p[2] for p in ranks.policy.inner.prefills] == [None, None]  # local times, not agreed


def test_goodput_reports_what_it_reads_from_prefills():
    clock = Clock()
    ctl = Controller(build_policy("goodput"), spec="goodput", clock=clock)
    ctl.note_prefill(8, 8 * 400)
    for _ in range(50):
        clock.t += 0.01
        ctl.observe(8, False)
    est = ctl.stats()["prefill_estimates"]
    assert est["requests_per_burst"] == 8 and est["output_per_request"] == pytest.approx(50, abs=0.5)
    assert est["lockstep"] is True  # one burst of 8 in 50 steps: no finish came alone


def test_tp_ranks_agree_on_prefill_times():
    """Prefill forwards are timed locally (rank 1 here 30% slower); their fixed cost enters the
    decisions only through the agreement, so the ranks decide alike and keep one estimate."""
    reduce = FakeAllReduce(2)
    clocks = [Clock(), Clock()]
    ctls = [Controller(Goodput(sync=reduce.hook(r), sync_every=16), spec="goodput", tp_rank=r, tp_size=2,
                       sync=reduce.hook(r), clock=clocks[r]) for r in range(2)]
    rng = random.Random(3)
    accepted = [[rng.choice((0, 1, 2, 3)) for _ in range(16)] for _ in range(1200)]

    def rank(r):
        ctl, clock, out = ctls[r], clocks[r], []
        for i in range(1200):
            if i % 150 == 0:  # a closed loop of fixed lengths: 16 prompts, two forwards, every 150 steps
                for n, tokens in ((12, 8192), (4, 2048)):
                    clock.t += (0.006 + 2e-6 * tokens) * (1.0 + 0.3 * r)
                    ctl.note_prefill(n, tokens)
            spec = ctl.decide(16)
            clock.t += (0.010 if not spec else 0.024) * (1.0 + 0.3 * r)
            ctl.observe(16, spec, accepted[i] if spec else ())
            out.append(spec)
        return out

    got = run_ranks(rank, 2)
    assert got[0] == got[1]
    inner = [c.policy.inner for c in ctls]
    assert inner[0]._pf_fixed == inner[1]._pf_fixed is not None
    assert inner[0]._pf_fixed == pytest.approx(0.006 * 1.15, rel=0.05)  # the rank-mean intercept
    assert ctls[0].fallback is None and ctls[1].fallback is None and not reduce.broken


def test_the_first_waves_output_budgets_reach_the_policy():
    """While the policy asks (a server's first forward presumed in lockstep), the step's requests'
    output budgets (max_new_tokens less their output so far) reach it before the decision;
    requests that do not say leave it asking."""
    from types import SimpleNamespace

    def req(cap: int, done: int) -> SimpleNamespace:
        return SimpleNamespace(rid=str(cap), sampling_params=SimpleNamespace(max_new_tokens=cap), output_ids=[0] * done)

    ctl = Controller(Goodput(), spec="goodput")
    ctl.note_prefill(4, 512)
    assert ctl.policy.wants_budgets
    ctl.decide(4, reqs=[SimpleNamespace(rid=str(i)) for i in range(4)])
    assert ctl.policy.wants_budgets
    ctl.decide(4, reqs=[req(cap, 1) for cap in (100, 200, 300, 400)])
    assert not ctl.policy.wants_budgets and ctl.policy.inner._wave_apart and ctl.stats()["budgets_told"] == 1
