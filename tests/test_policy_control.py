"""DYNSPEC_POLICY_CONTROL: swapping a running Controller's policy through a file (no SGLang)."""

from __future__ import annotations

import logging
import os

import pytest

from dynspec.policy import build_policy
from dynspec.sglang.hook import Controller, load_controller
from dynspec.sglang.policy_control import POLL_INTERVAL_S, PolicyControl

LOG = "t.control"


class Clock:
    def __init__(self):
        self.t = 50.0

    def __call__(self):
        return self.t


def _write(path, text: str) -> None:
    path.write_text(text)


def _controller(path, spec="never"):
    clock = Clock()
    log = logging.getLogger(LOG)
    ctl = Controller(build_policy(spec), spec=spec, logger=log)
    assert ctl.enable_control(PolicyControl(str(path), log), poll_clock=clock)
    return ctl, clock


def test_a_new_spec_in_the_file_takes_over_after_the_poll_interval(tmp_path, caplog):
    f = tmp_path / "policy"
    _write(f, "never\n")
    ctl, clock = _controller(f)
    with caplog.at_level(logging.INFO, logger=LOG):
        assert [ctl.decide(4) for _ in range(3)] == [False] * 3
        _write(f, "always\n")
        clock.t += POLL_INTERVAL_S / 2
        assert ctl.decide(4) is False  # not looked at yet: the poll is not due
        clock.t += POLL_INTERVAL_S / 2
        assert [ctl.decide(4) for _ in range(3)] == [True] * 3
    st = ctl.stats()
    assert (st["policy"], st["policy_swaps"], st["mode"], st["steps_spec"]) == ("always", 1, "spec", 3)
    assert [r.getMessage() for r in caplog.records] == [
        "dynspec: switch spec -> plain at step 1, batch size 4: never",
        f"dynspec: policy never -> always at step 4 (from {f}); mode stays plain until it decides",
        "dynspec: switch plain -> spec at step 5, batch size 4: always",
    ]
    # and on: a threshold speculates at batch 8 or below only
    _write(f, "threshold:on=8,off=8,dwell=0")
    clock.t += POLL_INTERVAL_S
    assert [ctl.decide(bs) for bs in (2, 16, 7)] == [True, False, True]
    assert ctl.stats()["policy_swaps"] == 2 and ctl.stats()["policy"] == "threshold:on=8,off=8,dwell=0"


def test_a_bad_spec_is_one_log_line_and_changes_nothing(tmp_path, caplog):
    f = tmp_path / "policy"
    _write(f, "never")
    ctl, clock = _controller(f)
    ctl.decide(4)
    before = ctl.policy
    _write(f, "threshold:lots")
    with caplog.at_level(logging.INFO, logger=LOG):
        for _ in range(5):  # five polls of an unchanged bad file
            clock.t += POLL_INTERVAL_S
            assert ctl.decide(4) is False
    assert len(caplog.records) == 1 and caplog.records[0].levelno == logging.WARNING
    assert "'threshold:lots', which is not a usable policy" in caplog.records[0].getMessage()
    assert ctl.policy is before
    assert (ctl.stats()["policy"], ctl.stats()["policy_swaps"]) == ("never", 0)
    _write(f, "always")  # a good spec afterwards still works
    clock.t += POLL_INTERVAL_S
    assert ctl.decide(4) is True and ctl.stats()["policy_swaps"] == 1


def test_decide_stats_the_file_at_most_once_per_interval(tmp_path, monkeypatch):
    f = tmp_path / "policy"
    _write(f, "never")
    ctl, clock = _controller(f)
    calls = []
    real_stat = os.stat

    def counting_stat(path, *a, **kw):
        calls.append(path)
        return real_stat(path, *a, **kw)

    monkeypatch.setattr(os, "stat", counting_stat)
    for _ in range(1000):  # a stopped clock: the first decision looks, no other
        ctl.decide(4)
    assert calls == [str(f)]
    for _ in range(100):  # 1 s of wall time at 10 ms a step
        clock.t += 0.01
        ctl.decide(4)
    monkeypatch.undo()
    assert 1 + 1.0 / POLL_INTERVAL_S - 1 <= len(calls) <= 1 + 1.0 / POLL_INTERVAL_S


def test_tp_above_one_refuses_the_control_file(tmp_path, monkeypatch, caplog):
    f = tmp_path / "policy"
    _write(f, "always")
    env = {"DYNSPEC_POLICY": "never", "DYNSPEC_POLICY_CONTROL": str(f)}
    log = logging.getLogger(LOG)
    with caplog.at_level(logging.INFO, logger=LOG):
        ranks = [load_controller(tp_rank=r, tp_size=2, sync=lambda xs: xs, env=env, logger=log) for r in (0, 1)]
    refused = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert refused == [f"dynspec: DYNSPEC_POLICY_CONTROL={f} refused with 2 TP ranks (they could read it at "
                       "different steps); policy never stays for the run"]
    calls = []
    monkeypatch.setattr(os, "stat", lambda *a, **kw: calls.append(a))
    for ctl in ranks:
        assert ctl is not None
        assert [ctl.decide(4) for _ in range(3)] == [False] * 3
        assert (ctl.stats()["policy"], ctl.stats()["policy_control"]) == ("never", None)
    assert calls == []


def test_load_controller_wires_the_file_and_a_missing_one_keeps_the_env_policy(tmp_path, caplog):
    f = tmp_path / "policy"
    env = {"DYNSPEC_POLICY": "never", "DYNSPEC_POLICY_CONTROL": str(f)}
    with caplog.at_level(logging.INFO, logger=LOG):
        ctl = load_controller(env=env, logger=logging.getLogger(LOG))
        assert ctl is not None and ctl.stats()["policy_control"] == str(f)
        assert ctl.decide(4) is False  # no file: DYNSPEC_POLICY stays, silently
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    _write(f, "always")
    ctl._next_poll = 0.0  # the next decision polls (load_controller's clock is time.monotonic)
    assert ctl.decide(4) is True and ctl.stats()["policy"] == "always"


def test_a_swapped_goodput_gets_the_servers_profile(tmp_path):
    f = tmp_path / "policy"
    env = {"DYNSPEC_POLICY": "never", "DYNSPEC_POLICY_CONTROL": str(f), "DYNSPEC_PROFILE": "h200-llama8b"}
    ctl = load_controller(env=env)
    assert ctl is not None
    _write(f, "goodput")
    ctl.decide(1)
    assert ctl.stats()["policy"] == "goodput"
    assert ctl.stats()["estimates"] == load_controller(env={"DYNSPEC_POLICY": "goodput",
                                                            "DYNSPEC_PROFILE": "h200-llama8b"}).stats()["estimates"]


def test_a_spec_renamed_into_place_is_seen_even_with_the_old_mtime_and_size(tmp_path):
    """An atomic replace inside the file system's timestamp granularity keeps mtime and size."""
    f = tmp_path / "policy"
    _write(f, "never")
    ctl, clock = _controller(f)
    assert ctl.decide(4) is False
    old = os.stat(f)
    tmp = tmp_path / "policy.tmp"
    _write(tmp, "cycle")  # as long as "never"
    os.utime(tmp, ns=(old.st_atime_ns, old.st_mtime_ns))
    os.replace(tmp, f)
    clock.t += POLL_INTERVAL_S
    ctl.decide(4)
    assert ctl.stats()["policy"] == "cycle" and ctl.stats()["policy_swaps"] == 1


@pytest.mark.parametrize("text", ["always\nnever\n", "\xff\xfe"])
def test_a_file_that_is_not_one_spec_line_is_one_log_line(tmp_path, caplog, text):
    f = tmp_path / "policy"
    f.write_bytes(text.encode("latin-1"))
    ctl, clock = _controller(f)
    with caplog.at_level(logging.INFO, logger=LOG):
        assert ctl.decide(4) is False
        clock.t += POLL_INTERVAL_S
        assert ctl.decide(4) is False
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "unreadable" in warnings[0].getMessage()
    assert ctl.stats()["policy_swaps"] == 0


def test_a_spec_swapped_back_in_resumes_what_its_policy_had_learned(tmp_path):
    """A sweep comparing policies on one server swaps goodput out and back between levels: goodput
    must come back with its estimates, as on a server of its own, not start over."""
    f = tmp_path / "policy"
    _write(f, "goodput\n")
    ctl, clock = _controller(f, spec="goodput")
    goodput = ctl.policy
    for spec in ("never", "threshold:8", "goodput"):
        _write(f, spec + "\n")
        clock.t += POLL_INTERVAL_S
        ctl.decide(4)
        assert ctl.spec == spec
    assert ctl.policy is goodput and ctl.stats()["policy_swaps"] == 3
    _write(f, "never\n")  # and the never built before, not a new one
    clock.t += POLL_INTERVAL_S
    ctl.decide(4)
    never = ctl.policy
    _write(f, "goodput\n")
    clock.t += POLL_INTERVAL_S
    ctl.decide(4)
    _write(f, "never\n")
    clock.t += POLL_INTERVAL_S
    ctl.decide(4)
    assert ctl.policy is never
