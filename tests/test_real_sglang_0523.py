"""The real SGLang 0.5.23 server, upstream and patched by dynspec, on this CPU.

Every arm is `python -m sglang.launch_server` from the real 0.5.23 wheel (unpacked, never
installed; its own dependencies from requirements/sglang-0.5.23-cpu.txt) serving the tiny
crafted Llama and EAGLE-3 draft (dynspec.realsglang.tinymodels) with EAGLE-3 on spec v2.
Stood in for, because it cannot exist here: `sgl_kernel` (sglang-kernel 0.4.10 is CUDA-only;
the CPU index ops of 0.5.23's speculative path are torch code in site-0.5.23, every other entry
raises) and `torchvision`.  `dynspec.realsglang.compat_0523` lists the patches 0.5.23 needs.

Arms: a plain server; upstream's adaptive speculation with its default tiers; dynspec's policy
behind the AdaptiveController (candidate steps [0, 3]) speculating always, and in a cycle of one
speculative step after two steps=0, where dynspec's steps=0 is its own plain step (the target's
DECODE forward, a KV-only draft catch-up, a resume before the next draft: the draft must be
current when it resumes); that cycle on upstream's steps=0 (DYNSPEC_PLAIN_STEP=0) with
SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND=1, whose draft goes cold: the acceptance check must
catch it; and four mutants of the plain step (tests/sglang_mutants_0523.py), each caught.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="requirements/sglang-cpu.txt installs the CPU torch")
pytestmark = pytest.mark.slow

from dynspec import realsglang  # noqa: E402
from dynspec.live.server_info import dynspec_state  # noqa: E402
from dynspec.realsglang.arms import Arm, greedy, server_info, shrinking_prompts, start_arms  # noqa: E402
from sglang_mutants_0523 import MUTANTS, mutant_site  # noqa: E402

VERSION = "0.5.23"
LOGS = Path(__file__).resolve().parents[1] / ".cache" / "real-sglang-0523"  # ignored by git
N_PROMPTS = 8  # concurrency 8 puts upstream's default tiers at their "8" tier, where steps 0 is a candidate
LEVELS = (1, 8)
CYCLE = "cycle:spec=1,plain=2"
# A server of three states (steps 0, 1, 3), the draft length by batch size: as the C=8 level's batch
# shrinks 8 -> 1 it runs plain, then three drafts, then one, each stretch after another state's.
K_STEPS = [0, 1, 3]
K_TABLE = "table:1-2=1,3-5=3,6-=0"
ADAPTIVE = ("--speculative-adaptive",)


def dynspec_args(cfg: Path) -> tuple[str, ...]:
    return (*ADAPTIVE, "--speculative-adaptive-config", str(cfg))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from dynspec.realsglang.tinymodels import make_models

    if not (realsglang.deps_0523() / "transformers").is_dir():
        pytest.fail(f"{realsglang.deps_0523()} is missing: `make test-venv` installs "
                    "requirements/sglang-0.5.23-cpu.txt there")
    tmp = tmp_path_factory.mktemp("real-sglang-0523")
    models = tmp / "models"
    make_models(models)
    cfg = tmp / "adaptive.json"  # dynspec's two states: steps 0 and --speculative-num-steps
    cfg.write_text(json.dumps({"1": {"candidate_steps": [0, 3]}}))
    cfg_k = tmp / "adaptive-k.json"
    cfg_k.write_text(json.dumps({"1": {"candidate_steps": K_STEPS}}))
    logdir = LOGS / time.strftime("%Y%m%d-%H%M%S")
    arms = [
        Arm("plain", speculative=False, version=VERSION),
        Arm("upstream-adaptive", args=ADAPTIVE, version=VERSION),
        Arm("dynspec-always", patched=True, policy="always", args=dynspec_args(cfg), version=VERSION),
        Arm("dynspec-cycle", patched=True, policy=CYCLE, args=dynspec_args(cfg), version=VERSION),
        Arm("dynspec-cycle-cold", patched=True, policy=CYCLE, args=dynspec_args(cfg), version=VERSION,
            env={"SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND": "1", "DYNSPEC_PLAIN_STEP": "0"}),
        Arm("dynspec-k-table", patched=True, policy=K_TABLE, args=dynspec_args(cfg_k), version=VERSION),
        Arm("dynspec-goodput-k", patched=True, policy="goodput-k", args=dynspec_args(cfg_k), version=VERSION),
        *(Arm(name, policy=CYCLE, args=dynspec_args(cfg), version=VERSION, site=mutant_site(tmp, name))
          for name in MUTANTS),
    ]
    prompts, lengths = shrinking_prompts(N_PROMPTS)
    out = {"prompts": prompts, "lengths": lengths, "arms": {}}
    try:
        def measure(name: str, server) -> None:
            levels, after = {}, {}
            for c in LEVELS:
                levels[c] = greedy(server, prompts, lengths, c)
                after[c] = server_info(server)
            out["arms"][name] = {"levels": levels, "info": after[LEVELS[-1]], "after_level": after}

        with start_arms(arms, models, logdir) as servers:
            # Two servers at work at a time, one a core (the others sleep on idle); every check reads
            # one server's own outputs and counters.
            with ThreadPoolExecutor(2) as pool:
                for done in [pool.submit(measure, name, server) for name, server in servers.items()]:
                    done.result()
    finally:
        for log in sorted(logdir.glob("*.log")):
            out.setdefault("logs", {})[log.stem] = log.read_text(errors="replace")
        # The counters beside the logs: what each check saw, readable after the run.
        if logdir.is_dir():
            seen = {name: dynspec_state(a["info"]) for name, a in out["arms"].items()}
            (logdir / "counters.json").write_text(json.dumps(seen, indent=1, default=str))
    return out


def ids(run, arm, level):
    return [r["ids"] for r in run["arms"][arm]["levels"][level]]


def counters(run, arm) -> dict:
    return dynspec_state(run["arms"][arm]["info"])


@pytest.mark.parametrize("arm", ["upstream-adaptive", "dynspec-always", "dynspec-cycle", "dynspec-cycle-cold",
                                 "dynspec-k-table", "dynspec-goodput-k"])
def test_greedy_output_is_the_plain_servers(runs, arm):
    for level in LEVELS:
        assert ids(runs, arm, level) == ids(runs, "plain", 1), f"{arm} at concurrency {level}"


def test_a_plain_step_that_attends_one_position_short_is_caught(runs):
    assert ids(runs, "mutant-plain-seq-lens", 1) != ids(runs, "plain", 1)
    assert counters(runs, "mutant-plain-seq-lens")["forwards"]["plain_decode"] > 50


def test_dynspec_steps0_is_a_plain_decode_not_a_verify(runs):
    """The cycle arm's steps=0 are all plain DECODE forwards (none through the verify path),
    and each speculative step after them resumed the draft; always-speculating runs none."""
    c = counters(runs, "dynspec-cycle")
    assert c["forwards"]["plain_decode"] == c["steps_plain"], c
    assert "steps0_verify" not in c["forwards"], c
    assert 0.9 * c["steps_spec"] <= c["forwards"]["resume"] <= c["steps_spec"], c
    assert counters(runs, "dynspec-always")["forwards"] == {}
    # DYNSPEC_PLAIN_STEP=0: upstream's steps=0 (the one-token verify), as before 2026-12-04
    cold = counters(runs, "dynspec-cycle-cold")
    assert cold["forwards"] == {} and cold["steps_plain"] > 50, cold
    assert "steps=0 runs upstream's one-token verify (DYNSPEC_PLAIN_STEP=0)" in runs["logs"]["dynspec-cycle-cold"]


def test_upstream_adaptive_speculates_with_its_own_tiers(runs):
    """SGLang's own policy ran (no dynspec block; its tiers logged) and drafts were accepted."""
    metas = [r["meta"] for lv in LEVELS for r in runs["arms"]["upstream-adaptive"]["levels"][lv]]
    # (spec_num_proposed_drafts is verify count x the configured steps, whatever state ran: not evidence)
    assert sum(m["spec_num_correct_drafts"] for m in metas) > 0  # only drafting steps accept drafts
    assert counters(runs, "upstream-adaptive") is None  # SGLang's own policy: no dynspec block
    assert "AdaptiveSpeculativeParams initialized" in runs["logs"]["upstream-adaptive"]


def test_dynspec_runs_behind_the_adaptive_controller(runs):
    for arm, plain_share in (("dynspec-always", 0.0), ("dynspec-cycle", 2 / 3)):
        c = counters(runs, arm)
        assert c is not None and c["engine"] == "sglang-0.5.23-adaptive", arm
        assert c["spec_steps"] == 3
        steps = c["steps_spec"] + c["steps_plain"]
        assert steps > 50, (arm, c)
        assert abs(c["steps_plain"] / steps - plain_share) < 0.05, (arm, c)
    assert counters(runs, "dynspec-cycle")["switches"] > 20


def test_acceptance_after_a_steps0_stretch_is_no_worse_than_always(runs):
    """Every speculative step of the cycle arm follows two plain steps: with the KV-only
    catch-up during them and the resume before the next draft its draft is current, so it
    accepts what always speculating accepts."""
    always = counters(runs, "dynspec-always")["mean_accepted_when_speculating"]
    cycle = counters(runs, "dynspec-cycle")["mean_accepted_when_speculating"]
    assert always > 1.0, always  # the crafted draft is often right
    assert cycle >= 0.95 * always, (cycle, always)
    # The check can fail: with the draft extend skipped during steps=0 the draft goes cold.
    cold = counters(runs, "dynspec-cycle-cold")["mean_accepted_when_speculating"]
    assert cold < 0.8 * always, (cold, always)
    # ... and catches a plain step whose catch-up writes nothing, or too late, or that never resumes.
    for mutant in ("mutant-no-kv-catch-up", "mutant-resume-before-flush", "mutant-no-resume"):
        broken = counters(runs, mutant)["mean_accepted_when_speculating"]
        assert broken < 0.8 * always, (mutant, broken, always)
        assert ids(runs, mutant, 1) == ids(runs, "plain", 1), mutant  # the target still verifies


def accepted_at(run, arm, k: int, level: int) -> tuple[float, int]:
    """Drafts accepted per request-step at K during one level, and its request-steps."""
    after = run["arms"][arm]["after_level"]
    before = dynspec_state(after[LEVELS[LEVELS.index(level) - 1]]) if LEVELS.index(level) else None
    a, n = dynspec_state(after[level])["accepted_by_k"].get(str(k), [0, 0])
    a0, n0 = (before["accepted_by_k"] or {}).get(str(k), [0, 0]) if before else (0, 0)
    return ((a - a0) / (n - n0) if n > n0 else 0.0), n - n0


def test_a_policy_that_chooses_the_draft_length_runs_every_state_and_keeps_the_draft_current(runs):
    """A batch-size table over steps 0, 1 and 3: each state runs, steps=0 as dynspec's plain
    decode, and three drafts right after a plain stretch (the C=8 level's batches 5 to 3) accept
    what an always-speculating server's three drafts accept: the draft is current whichever
    state ran before.  One draft (the C=1 level, batch 1) accepts at most one."""
    c = counters(runs, "dynspec-k-table")
    assert c["candidate_steps"] == K_STEPS and c["policy_failed"] is False, c
    by_k = c["steps_by_k"]
    assert set(by_k) == {"0", "1", "3"} and min(by_k.values()) > 5, by_k
    assert c["forwards"]["plain_decode"] == by_k["0"], c
    accepted_one, n_one = c["accepted_by_k"]["1"]  # the C=1 level runs K=1 throughout
    one = accepted_one / n_one
    three, n_three = accepted_at(runs, "dynspec-k-table", 3, 8)
    always, _ = accepted_at(runs, "dynspec-always", 3, 8)
    assert n_one > 10 and n_three > 10, (n_one, n_three)
    assert 0.0 < one <= 1.0, one
    assert three >= 0.9 * always, (three, always, one)


def test_goodput_k_runs_on_the_real_server(runs):
    c = counters(runs, "dynspec-goodput-k")
    assert c["policy"] == "goodput-k" and c["policy_failed"] is False and c["fallback"] is None, c
    assert c["candidate_steps"] == K_STEPS and sum(c["steps_by_k"].values()) == c["steps"] > 50, c
