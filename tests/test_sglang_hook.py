"""dynspec.sglang_hook: what the patched SGLang imports (no SGLang or torch needed here)."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from dynspec.policy import FailSafePolicy, Policy
from scripted_policy import Scripted
from dynspec.sglang_hook import Controller, load_controller, plain_cuda_graph_enabled


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_hook_imports_nothing_heavy():
    code = ("import sys, dynspec.sglang_hook; heavy = [m for m in ('torch', 'numpy', 'pydantic', 'yaml', "
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
    ctl.note_other_forward()  # a prefill ran: the next two intervals are not step times
    ctl.observe(4, True, [1, 1, 1, 1])
    clock.t += 0.025
    ctl.observe(4, True, [1, 1, 1, 1])
    clock.t += 0.025
    ctl.observe(4, True, [2, 2, 2, 2])
    clock.t += 60.0  # an idle pause is not a step time
    ctl.observe(4, True, [2, 2, 2, 2])
    r = policy.records
    assert [x.step_time_s for x in r] == [None, pytest.approx(0.020), None, None, pytest.approx(0.025), None]
    assert r[1].accepted == () and not r[1].speculated  # plain steps carry no acceptance
    assert r[0].accepted == (1, 0, 2, 3)
    assert ctl.stats()["mean_accepted_when_speculating"] == pytest.approx((6 + 4 + 4 + 8 + 8) / 20)


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
