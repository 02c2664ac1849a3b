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
    logdir = LOGS / time.strftime("%Y%m%d-%H%M%S")
    arms = [
        Arm("plain", speculative=False, version=VERSION),
        Arm("upstream-adaptive", args=ADAPTIVE, version=VERSION),
        Arm("dynspec-always", patched=True, policy="always", args=dynspec_args(cfg), version=VERSION),
        Arm("dynspec-cycle", patched=True, policy=CYCLE, args=dynspec_args(cfg), version=VERSION),
        Arm("dynspec-cycle-cold", patched=True, policy=CYCLE, args=dynspec_args(cfg), version=VERSION,
            env={"SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND": "1", "DYNSPEC_PLAIN_STEP": "0"}),
        *(Arm(name, policy=CYCLE, args=dynspec_args(cfg), version=VERSION, site=mutant_site(tmp, name))
          for name in MUTANTS),
    ]
    prompts, lengths = shrinking_prompts(N_PROMPTS)
    out = {"prompts": prompts, "lengths": lengths, "arms": {}}
    try:
        with start_arms(arms, models, logdir) as servers:
            for name, server in servers.items():
                levels = {c: greedy(server, prompts, lengths, c) for c in LEVELS}
                out["arms"][name] = {"levels": levels, "info": server_info(server)}
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


@pytest.mark.parametrize("arm", ["upstream-adaptive", "dynspec-always", "dynspec-cycle", "dynspec-cycle-cold"])
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
