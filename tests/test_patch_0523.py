"""SGLang 0.5.23: the adapter behind AdaptiveController, and the patch that installs it.

* DynspecAdaptivePolicy / selection / build_adaptive_policy, in this process (no SGLang).
* `dynspec patch` on the real 0.5.23 wheel (cp311 manylinux; the files it patches are
  plain .py): round trip, idempotence, byte-exact revert, refusals.
* The patched wheel imported on a CPU and driven with fakes: tests/sglang_0523_checks.py,
  run in a subprocess because 0.5.23 needs transformers 5 (0.5.9's tests, in this
  process, need 4.57); its extra packages come from `make venv` (.venv/sglang-0.5.23-deps).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dynspec.sglang import patching
from dynspec.cli import main
from dynspec.policy import Policy, StepRecord
from dynspec.sglang.adaptive import (AdaptiveSelectionError, DynspecAdaptivePolicy, build_adaptive_policy,
                                     selection)
from dynspec.sglang.hook import Controller
from dynspec.realsglang.wheels import unpack
from tp_ranks import FakeAllReduce, run_ranks

VERSION = "0.5.23"
REPO = Path(__file__).resolve().parent.parent
PATCHSET = patching.patches_root() / f"sglang-{VERSION}"
TOUCHED = sorted(json.loads((PATCHSET / "manifest.json").read_text())["files"])


# --- the adapter -------------------------------------------------------------------------------

class Scripted(Policy):
    """Speculates while the batch is at most `limit`; records every observe()."""

    name = "scripted"

    def __init__(self, limit: int):
        self.limit = limit
        self.seen: list[StepRecord] = []

    def decide(self, batch_size: int) -> bool:
        return batch_size <= self.limit

    def observe(self, rec: StepRecord) -> None:
        self.seen.append(rec)


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def adapter(limit=4, steps=3):
    clock = Clock()
    pol = Scripted(limit)
    ctl = Controller(pol, spec="scripted", clock=clock)
    return DynspecAdaptivePolicy(ctl, steps, clock=clock), pol, clock


def test_steps_follow_the_policy_and_only_two_states_exist():
    a, _, _ = adapter(limit=4, steps=5)
    assert a.candidate_steps == [0, 5]
    assert [a.get_steps_for_batch(b) for b in (1, 4, 5, 64, 2)] == [5, 5, 0, 0, 5]
    st = a.dynspec_stats()
    assert (st["steps"], st["steps_spec"], st["steps_plain"], st["switches"]) == (5, 3, 2, 2)


def test_the_forwards_the_worker_ran_are_reported_beside_the_decisions():
    """The patched worker names each forward it ran (plain decode, resume, upstream's verify):
    /get_server_info shows them next to the policy's decisions."""
    a, _, _ = adapter(limit=4)
    assert a.dynspec_stats()["forwards"] == {}
    for kind in ("plain_decode", "plain_decode", "resume", "steps0_verify"):
        a.note_forward(kind)
    assert a.dynspec_stats()["forwards"] == {"plain_decode": 2, "resume": 1, "steps0_verify": 1}
    assert json.loads(json.dumps(a.dynspec_stats()))["forwards"]["plain_decode"] == 2


def test_every_graph_size_is_captured_for_both_states():
    a, _, _ = adapter(steps=3)
    assert a.cuda_graph_bs_for_step(0) is None  # CUDA graphs off: SGLang passes None on
    a.set_cuda_graph_bs([8, 1, 4])
    assert a.cuda_graph_bs_for_step(0) == [1, 4, 8] and a.cuda_graph_bs_for_step(3) == [1, 4, 8]
    assert a.cuda_graph_bs_for_step(7) == []


def test_an_idle_batch_decides_nothing():
    a, _, _ = adapter(limit=4)
    a.get_steps_for_batch(8)
    assert a.get_steps_for_batch(0) == 0
    assert a.dynspec_stats()["steps"] == 1


def test_results_are_matched_to_their_decisions_under_overlap():
    """Overlap order: launch N+1, then process N.  Each result is observed with its own mode."""
    a, pol, clock = adapter(limit=4)
    a.get_steps_for_batch(2)            # N: speculate
    clock.t += 0.001
    a.get_steps_for_batch(8)            # N+1: plain, launched before N's result is in
    clock.t += 0.010
    assert a.on_verify_complete([2, 1], batch_size=2) is None
    clock.t += 0.001
    a.get_steps_for_batch(8)            # N+2, launched before N+1's result
    clock.t += 0.020
    a.on_verify_complete([0] * 8, batch_size=8)
    clock.t += 0.025
    a.on_verify_complete([0] * 8, batch_size=8)
    assert [(r.batch_size, r.speculated, tuple(r.accepted)) for r in pol.seen] == [
        (2, True, (2, 1)), (8, False, ()), (8, False, ())]
    # The first interval has no start; N+1 was launched before N's result: a back-to-back
    # step, so its gap is a step time; so is N+2's.
    times = [r.step_time_s for r in pol.seen]
    assert times[0] is None and times[1] == pytest.approx(0.021) and times[2] == pytest.approx(0.025)
    assert a.unmatched_results == 0


def test_a_step_launched_after_the_previous_result_gives_no_step_time():
    """A prefill, an idle pause or the non-overlap scheduler: the gap is not a decode step."""
    a, pol, clock = adapter(limit=4)
    a.get_steps_for_batch(2)
    clock.t += 0.010
    a.on_verify_complete([1, 1], batch_size=2)   # the first result: no interval yet
    clock.t += 5.0                                # the server idles
    a.get_steps_for_batch(2)                      # launched after the last result: a gap
    clock.t += 0.001
    a.get_steps_for_batch(2)
    clock.t += 0.010
    a.on_verify_complete([1, 1], batch_size=2)   # 5.011 s: not a step time
    clock.t += 0.001
    a.get_steps_for_batch(2)
    clock.t += 0.010
    a.on_verify_complete([1, 1], batch_size=2)   # back to back: a step time
    clock.t += 0.001
    a.get_steps_for_batch(2)
    clock.t += 0.010
    a.on_verify_complete([1, 1], batch_size=2)   # back to back: a step time
    times = [r.step_time_s for r in pol.seen]
    assert times[:2] == [None, None]
    assert times[2:] == [pytest.approx(0.011), pytest.approx(0.011)]


def test_a_result_without_its_decision_is_counted_and_attributed_to_the_current_state():
    a, pol, _ = adapter(limit=4)
    a.get_steps_for_batch(2)                          # speculate
    a.get_steps_for_batch(16)                         # plain
    a.on_verify_complete([0] * 3, batch_size=3)       # a batch whose decision we never saw
    assert a.unmatched_results == 1
    assert pol.seen[-1] == StepRecord(3, False, (), None, None, True, 0)  # the state it ran: 0 steps
    # The in-flight decisions were kept for their own results.
    a.on_verify_complete([2, 2], batch_size=2)
    assert pol.seen[-1].speculated and tuple(pol.seen[-1].accepted) == (2, 2)
    a.get_steps_for_batch(1)
    a.on_verify_complete([1], batch_size=1)           # 16's result never came: its decision is dropped
    assert pol.seen[-1].batch_size == 1 and pol.seen[-1].speculated
    assert len(a._pending) == 0 and a.dynspec_stats()["unmatched_results"] == 1


class ByBatch(Policy):
    """Answers a step count by batch size (decide_steps); records every observe()."""

    name = "by-batch"

    def __init__(self, table: dict[int, int]):
        self.table = table  # batch size up to -> K
        self.seen: list[StepRecord] = []
        self.told: tuple | None = None

    def set_candidate_steps(self, steps, on_steps) -> None:
        super().set_candidate_steps(steps, on_steps)
        self.told = (tuple(steps), on_steps)

    def decide(self, batch_size: int) -> bool:
        return self.decide_steps(batch_size) > 0

    def decide_steps(self, batch_size: int) -> int:
        return next(k for up_to, k in sorted(self.table.items()) if batch_size <= up_to)

    def observe(self, rec: StepRecord) -> None:
        self.seen.append(rec)


def test_the_adapter_runs_the_step_count_the_policy_answers_among_every_candidate():
    """SGLang 0.5.23 builds a state per candidate step count; the adapter hands the policy all of
    them and runs whichever its decide_steps answers (not only 0 and N), and each result reaches
    the policy with the step count that produced it, under the overlap scheduler's order."""
    clock = Clock()
    pol = ByBatch({2: 7, 8: 1, 31: 5, 10**6: 0})
    a = DynspecAdaptivePolicy(Controller(pol, spec="by-batch", clock=clock), 3, [0, 1, 3, 5, 7], clock=clock)
    assert pol.told == ((0, 1, 3, 5, 7), 3) and a.candidate_steps == [0, 1, 3, 5, 7]
    a.set_cuda_graph_bs([1, 8, 32])
    assert all(a.cuda_graph_bs_for_step(k) == [1, 8, 32] for k in (0, 1, 3, 5, 7))
    assert a.cuda_graph_bs_for_step(4) == []
    got: list[int] = []
    pending: tuple[int, list[int]] | None = None
    for bs, acc in ((2, [7, 3]), (8, [1] * 8), (16, [4] * 16), (64, [0] * 64)):
        got.append(a.get_steps_for_batch(bs))   # launched before the previous result is read
        clock.t += 0.01
        if pending is not None:
            a.on_verify_complete(pending[1], batch_size=pending[0])
        pending = (bs, acc)
    assert pending is not None
    a.on_verify_complete(pending[1], batch_size=pending[0])
    assert got == [7, 1, 5, 0]
    assert [(r.batch_size, r.steps, r.speculated, tuple(r.accepted)[:2]) for r in pol.seen] == [
        (2, 7, True, (7, 3)), (8, 1, True, (1, 1)), (16, 5, True, (4, 4)), (64, 0, False, ())]
    st = a.dynspec_stats()
    assert st["candidate_steps"] == [0, 1, 3, 5, 7] and st["steps_by_k"] == {"0": 1, "1": 1, "5": 1, "7": 1}
    # each K's own acceptance (drafts accepted, request-steps); a plain step has none
    assert st["accepted_by_k"] == {"1": [8, 8], "5": [64, 16], "7": [10, 2]}
    assert (st["steps_spec"], st["steps_plain"]) == (3, 1)


def test_goodput_k_behind_the_adapter_moves_to_the_longest_chain_where_it_pays(tmp_path):
    """goodput-k built as the patched server builds it (the config's steps [0, 1, 3, 5, 7], N = 3)
    and driven through the adapter on a machine where 7 drafts pay most: the server is told to
    run 7, a count the on/off adapter never ran."""
    import random

    cfg = write(tmp_path, {"1": {"candidate_steps": [0, 1, 3, 5, 7]}})
    clock = Clock()
    built = build_adaptive_policy(3, cfg, env={"DYNSPEC_POLICY": "goodput-k"}, logger=logging.getLogger("t0523"))
    assert isinstance(built, DynspecAdaptivePolicy) and built.candidate_steps == [0, 1, 3, 5, 7]
    built.controller._clock = clock  # step times from the test's clock
    a = DynspecAdaptivePolicy(built.controller, 3, built.candidate_steps, clock=clock)
    rng, ks = random.Random(3), []
    qs = [0.85, 0.8, 0.6, 0.98, 0.98, 0.98, 0.98]
    for _ in range(300):
        k = a.get_steps_for_batch(16)
        clock.t += 0.010 if k == 0 else 0.016 + 0.0015 * k
        acc = []
        for _ in range(16):
            j = 0
            while j < k and rng.random() < qs[j]:
                j += 1
            acc.append(j)
        a.on_verify_complete(acc, batch_size=16)
        ks.append(k)
    assert ks[-100:].count(7) >= 90, "".join(map(str, ks))
    assert a.dynspec_stats()["steps_by_k"]["7"] >= 200


def test_a_policy_that_chooses_the_step_count_takes_any_config_with_0_and_n(tmp_path, caplog):
    """goodput-k (and SGLang's tiers, a K table) run every state SGLang builds, SGLang's default
    config included; an on/off policy still needs exactly [0, N], and 0 and N must be there."""
    log = logging.getLogger("t0523")
    wide = write(tmp_path, {"1": {"candidate_steps": [0, 1, 3]}, "8": {"candidate_steps": [0, 5, 7]}})
    for spec in ("goodput-k", "sglang-default-tiers", "table:1-7=5,8-=1"):
        got = build_adaptive_policy(3, wide, env={"DYNSPEC_POLICY": spec}, logger=log)
        assert isinstance(got, DynspecAdaptivePolicy) and got.candidate_steps == [0, 1, 3, 5, 7], spec
    default = build_adaptive_policy(5, None, env={"DYNSPEC_POLICY": "goodput-k"}, logger=log)
    assert isinstance(default, DynspecAdaptivePolicy) and default.candidate_steps == [0, 1, 3, 5, 7]
    with caplog.at_level(logging.WARNING, logger="t0523"):
        assert build_adaptive_policy(3, wide, env={"DYNSPEC_POLICY": "goodput"}, logger=log) is None
        assert build_adaptive_policy(2, wide, env={"DYNSPEC_POLICY": "goodput-k"}, logger=log) is None
        assert build_adaptive_policy(3, write(tmp_path, {"1": {"candidate_steps": [1, 3]}}),
                                     env={"DYNSPEC_POLICY": "goodput-k"}, logger=log) is None
    msgs = [r.getMessage() for r in caplog.records]
    assert "dynspec needs exactly [0, 3]" in msgs[0]
    assert "needs 0 and --speculative-num-steps 2 among them" in msgs[1]
    assert "candidate steps [1, 3]" in msgs[2] and len(msgs) == 3


def test_spec_steps_must_be_positive():
    with pytest.raises(ValueError, match="positive speculative_num_steps"):
        DynspecAdaptivePolicy(Controller(Scripted(1), spec="x"), 0)


# --- selection: environment or adaptive config ------------------------------------------------

def write(tmp_path, cfg) -> str:
    p = tmp_path / "adaptive.json"
    p.write_text(json.dumps(cfg))
    return str(p)


def test_selection_none_unless_asked(tmp_path):
    assert selection(None, {}) is None
    assert selection(write(tmp_path, {"1": {"candidate_steps": [0, 3]}}), {"DYNSPEC_POLICY": " "}) is None


def test_selection_from_env(tmp_path):
    env = {"DYNSPEC_POLICY": "goodput", "DYNSPEC_PROFILE": "seed-blackwell"}
    assert selection(None, env) == env
    assert selection(write(tmp_path, {"1": {"candidate_steps": [3]}}), {"DYNSPEC_POLICY": "never"}) == {
        "DYNSPEC_POLICY": "never"}


def test_the_config_key_wins_and_stands_alone(tmp_path):
    env = {"DYNSPEC_POLICY": "always", "DYNSPEC_PROFILE": "seed-blackwell"}
    assert selection(write(tmp_path, {"1": {"candidate_steps": [3]}, "dynspec": "never"}), env) == {
        "DYNSPEC_POLICY": "never", "DYNSPEC_PROFILE": ""}
    cfg = {"1": {"candidate_steps": [3]}, "dynspec": {"policy": "goodput", "profile": "h100-llama31-8b-eagle3"}}
    assert selection(write(tmp_path, cfg), env) == {"DYNSPEC_POLICY": "goodput",
                                                   "DYNSPEC_PROFILE": "h100-llama31-8b-eagle3"}


@pytest.mark.parametrize("entry, needle", [
    (["goodput"], "must be a policy spec string"),
    ({"policy": "goodput", "extra": 1}, "must be a policy spec string"),
    ({"profile": "seed-blackwell"}, "dynspec.policy"),
    ({"policy": "goodput", "profile": 3}, "dynspec.profile"),
    ("", "dynspec.policy"),
])
def test_bad_config_entries_are_named(tmp_path, entry, needle):
    with pytest.raises(AdaptiveSelectionError, match=needle):
        selection(write(tmp_path, {"1": {"candidate_steps": [3]}, "dynspec": entry}), {})


def test_build_returns_none_with_one_warning_on_a_bad_request(tmp_path, caplog):
    log = logging.getLogger("t0523")
    cfg = write(tmp_path, {"1": {"candidate_steps": [0, 3]}})
    assert build_adaptive_policy(3, cfg, env={}, logger=log) is None
    with caplog.at_level(logging.WARNING, logger="t0523"):
        assert build_adaptive_policy(3, cfg, env={"DYNSPEC_POLICY": "nope"}, logger=log) is None
        assert build_adaptive_policy(0, cfg, env={"DYNSPEC_POLICY": "never"}, logger=log) is None
        assert build_adaptive_policy(3, str(tmp_path / "missing.json"), env={}, logger=log) is None
    msgs = [r.getMessage() for r in caplog.records]
    assert len(msgs) == 3
    assert "is invalid" in msgs[0] and "speculative_num_steps is 0" in msgs[1] and "cannot read" in msgs[2]
    built = build_adaptive_policy(3, cfg, env={"DYNSPEC_POLICY": "threshold:8"}, logger=log)
    assert isinstance(built, DynspecAdaptivePolicy) and built.get_steps_for_batch(9) == 0


@pytest.mark.parametrize("steps, needle", [
    (None, "needs --speculative-adaptive-config with candidate steps [0, 3]"),  # SGLang's default: [0, 1, 3, 5, 7]
    ([0, 1, 3, 5, 7], "candidate steps [0, 1, 3, 5, 7], dynspec needs exactly [0, 3]"),
    ([3], "candidate steps [3], dynspec needs exactly [0, 3]"),
    ([0, 5], "candidate steps [0, 5], dynspec needs exactly [0, 3]"),
])
def test_dynspec_needs_a_config_whose_steps_are_0_and_n(tmp_path, caplog, steps, needle):
    """SGLang sizes its buffers for the config's largest step before any policy exists; dynspec
    uses 0 and speculative_num_steps only, so anything else is memory it never uses."""
    cfg = None if steps is None else write(tmp_path, {"1": {"candidate_steps": steps}})
    with caplog.at_level(logging.WARNING, logger="t0523"):
        got = build_adaptive_policy(3, cfg, env={"DYNSPEC_POLICY": "never"}, logger=logging.getLogger("t0523"))
    assert got is None
    msgs = [r.getMessage() for r in caplog.records]
    assert len(msgs) == 1 and needle in msgs[0] and "SGLang's adaptive policy runs" in msgs[0]


def test_tp_ranks_start_dynspec_all_or_none(tmp_path):
    """A rank that cannot start (here its speculative_num_steps disagrees with the config) turns
    dynspec off on every rank, or that rank would run SGLang's tiers while the others run dynspec."""
    reduce = FakeAllReduce(2, op="min")
    cfg = write(tmp_path, {"1": {"candidate_steps": [0, 3]}})
    got = run_ranks(lambda r: build_adaptive_policy(3 if r == 0 else 5, cfg, tp_rank=r, tp_size=2,
                                                    sync_factory=lambda: (lambda v: v), min_sync=reduce.hook(r),
                                                    env={"DYNSPEC_POLICY": "never"}), 2)
    assert got == [None, None] and reduce.calls == 1
    reduce = FakeAllReduce(2, op="min")
    got = run_ranks(lambda r: build_adaptive_policy(3, cfg, tp_rank=r, tp_size=2, sync_factory=lambda: (lambda v: v),
                                                    min_sync=reduce.hook(r), env={"DYNSPEC_POLICY": "never"}), 2)
    assert all(isinstance(a, DynspecAdaptivePolicy) and a.controller.agreeing for a in got)


# --- the patch on the real wheel -------------------------------------------------------------

@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    return unpack(VERSION, tmp_path_factory.mktemp("sglang-0.5.23") / "site")


def digest(root: Path) -> dict[str, str]:
    """sha256 of every file under sglang/ (the backup folder included)."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted((root / "sglang").rglob("*")) if p.is_file()}


def cli(capsys, *args):
    code = main(["patch", *args])
    out, err = capsys.readouterr()
    return code, out.strip(), err.strip()


def test_the_wheel_is_binary_but_the_patched_files_are_python(site):
    assert list(site.glob("sglang-0.5.23.dist-info/WHEEL"))
    assert "cp311" in (site / "sglang-0.5.23.dist-info/WHEEL").read_text()
    assert all(rel.endswith(".py") and (site / rel).is_file() for rel in TOUCHED)
    assert patching.read_version(site / "sglang") == VERSION


def test_round_trip_idempotent_and_byte_exact(site, capsys):
    before = digest(site)
    assert cli(capsys, "status", "--sglang-path", str(site)) == (0, f"unpatched {VERSION} {site / 'sglang'}", "")
    code, out, _ = cli(capsys, "apply", "--dry-run", "--sglang-path", str(site))
    assert code == 0 and out.startswith("would patch") and digest(site) == before
    code, out, _ = cli(capsys, "apply", "--sglang-path", str(site))
    assert code == 0 and out.startswith("patched:")
    after = digest(site)
    changed = {k for k in after if before.get(k) != after[k]}
    assert {k for k in changed if ".dynspec-backup" not in k} == set(TOUCHED)
    assert cli(capsys, "status", "--sglang-path", str(site))[1].startswith(f"patched {VERSION}")
    code, out, _ = cli(capsys, "apply", "--sglang-path", str(site))
    assert code == 0 and out.startswith("already patched") and digest(site) == after
    text = (site / "sglang/srt/speculative/eagle_worker_v2.py").read_text()
    assert "_dynspec_adaptive_policy(self)  # dynspec: None unless asked" in text
    code, out, _ = cli(capsys, "revert", "--sglang-path", str(site))
    assert code == 0 and out.startswith("reverted:")
    assert digest(site) == before
    assert cli(capsys, "revert", "--sglang-path", str(site))[1].startswith("not patched")


def test_foreign_modified_file_is_refused_untouched(site, capsys):
    target = site / "sglang/srt/managers/scheduler_components/internal_state.py"
    original = target.read_bytes()
    try:
        target.write_bytes(original + b"# local edit\n")
        before = digest(site)
        assert cli(capsys, "status", "--sglang-path", str(site))[0] == 1
        code, out, err = cli(capsys, "apply", "--sglang-path", str(site))
        assert code == 2 and out == "" and len(err.splitlines()) == 1
        assert "foreign-modified" in err and "internal_state.py" in err
        assert digest(site) == before
    finally:
        target.write_bytes(original)


def test_an_edit_after_patching_blocks_revert(site, capsys):
    assert cli(capsys, "apply", "--sglang-path", str(site))[0] == 0
    target = site / "sglang/srt/speculative/eagle_worker_v2.py"
    patched = target.read_bytes()
    try:
        target.write_bytes(patched.replace(b"dynspec: None unless asked", b"dynspec: edited"))
        before = digest(site)
        code, _, err = cli(capsys, "revert", "--sglang-path", str(site))
        assert code == 2 and "foreign-modified" in err and digest(site) == before
    finally:
        target.write_bytes(patched)
        assert cli(capsys, "revert", "--sglang-path", str(site))[0] == 0


def test_the_0523_series_does_not_fit_0_5_9(tmp_path, capsys):
    """The same files in 0.5.9 differ: the manifest's upstream hashes refuse them."""
    root = unpack("0.5.9", tmp_path / "site")
    manifest = json.loads((PATCHSET / "manifest.json").read_text())
    for rel, h in manifest["files"].items():
        f = root / rel
        assert not f.exists() or hashlib.sha256(f.read_bytes()).hexdigest() != h["upstream_sha256"]


# --- the patched wheel, imported on a CPU ---------------------------------------------------------

def deps_dir() -> Path:
    return Path(os.environ.get("DYNSPEC_SGLANG_0523_DEPS", Path(sys.prefix) / "sglang-0.5.23-deps"))


@pytest.mark.slow  # 20 s: unpacks the 39 MB wheel and imports the patched modules in a child
def test_patched_sglang_0523_on_cpu(tmp_path):
    deps = deps_dir()
    if not (deps / "transformers").is_dir():
        pytest.fail(f"{deps} is missing: `make venv` installs requirements/sglang-0.5.23-cpu.txt there")
    root = unpack(VERSION, tmp_path / "site")
    out = patching.do_apply(patching.find_sglang(root))
    assert out.code == 0, out.message
    here = Path(patching.__file__).resolve().parents[2]  # the dynspec under test, not another install
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(deps), str(root), str(here)]),
           "DYNSPEC_SGLANG_ROOT": str(root)}
    env.pop("DYNSPEC_POLICY", None)
    env.pop("DYNSPEC_PROFILE", None)
    res = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "ignore::DeprecationWarning",
         str(REPO / "tests/sglang_0523_checks.py")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-6000:] + res.stderr[-3000:]
    assert " passed" in res.stdout and "failed" not in res.stdout
