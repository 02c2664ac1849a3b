"""Checks that run inside the patched SGLang 0.5.23, on a CPU.

Not collected by the main test run (the name does not start with test_):
tests/test_patch_0523.py runs `pytest tests/sglang_0523_checks.py` in a subprocess
whose PYTHONPATH holds 0.5.23's own dependencies (transformers 5, which cannot share
a process with 0.5.9's transformers 4.57) and the unpacked, patched wheel
(DYNSPEC_SGLANG_ROOT).  torch is the CPU build; only the native GPU kernel packages
are stubbed (sglang_stubs.py).  Everything called below is SGLang's own code except
the marked fakes: the draft worker, the target model runner and the graph/state
builder, which need a GPU.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import socket
import sys
from types import SimpleNamespace

import pytest

import sglang_stubs

ROOT = os.environ.get("DYNSPEC_SGLANG_ROOT", "")
if not ROOT:
    pytest.exit("DYNSPEC_SGLANG_ROOT is not set: run this file through tests/test_patch_0523.py", returncode=2)

sglang_stubs.install()
ew = importlib.import_module("sglang.srt.speculative.eagle_worker_v2")
ars = importlib.import_module("sglang.srt.speculative.adaptive_runtime_state")
asp = importlib.import_module("sglang.srt.speculative.adaptive_spec_params")
ist = importlib.import_module("sglang.srt.managers.scheduler_components.internal_state")

STEPS = 3
GRAPH_BS = [1, 2, 4, 8, 16, 32]


def test_the_patched_wheel_is_what_runs():
    import transformers

    assert ew.__file__.startswith(ROOT) and ist.__file__.startswith(ROOT)
    assert hasattr(ew, "_dynspec_adaptive_policy")
    assert transformers.__version__.startswith("5.")
    for name in sglang_stubs.STUBBED:  # the stubs really stand in: no GPU package was loaded
        mod = sys.modules.get(name)
        assert mod is None or getattr(mod, "__dynspec_stub__", False), name


# --- fakes for what needs a GPU ----------------------------------------------------------

class FakeDraftWorker:
    """Stands in for EagleDraftWorker (draft model + its CUDA graphs)."""

    def __init__(self, *args, **kwargs):
        self.speculative_num_steps = STEPS
        self.speculative_num_draft_tokens = STEPS + 1
        self.parallel_layout = SimpleNamespace(tp_group=None)
        self.draft_attn_backend = f"draft-attn-{STEPS}"
        self.draft_extend_attn_backend = None
        self.cuda_graph_runner = f"draft-graphs-{STEPS}"
        self.cuda_graph_runner_for_draft_extend = None
        self.draft_runner = SimpleNamespace(draft_attn_backend=None, attn_backend="draft-runner-attn")
        self.rebuilt = 0

    def init_cuda_graphs(self):
        pass

    def _rebuild_topk1_chain_buffers(self):
        self.rebuilt += 1


class FakeContext:
    def __init__(self):
        self.overrides = []

    def override(self, reason, **kw):
        self.overrides.append((reason, kw))


@pytest.fixture
def server(monkeypatch, tmp_path):
    """Build EAGLEWorkerV2 (its real __init__) with --speculative-adaptive and the given config."""
    ctx = FakeContext()
    tp = SimpleNamespace(rank_in_group=0, world_size=1, cpu_group=None)
    monkeypatch.setattr(ew, "EagleDraftWorker", FakeDraftWorker)
    monkeypatch.setattr(ew, "get_device", lambda: SimpleNamespace(device="cpu"))
    monkeypatch.setattr(ew, "get_schedule", lambda: SimpleNamespace(page_size=1))
    monkeypatch.setattr(ew, "get_parallel", lambda: SimpleNamespace(pp_group=SimpleNamespace(is_last_rank=True),
                                                                    tp_group=tp, pp_size=1))
    monkeypatch.setattr(ew, "get_context", lambda: ctx)
    monkeypatch.setattr(ew, "get_exec", lambda: SimpleNamespace(graph=SimpleNamespace(cuda_graph_bs_decode=GRAPH_BS)))
    monkeypatch.setattr(ew, "check_cuda_graph_backend", lambda *a, **k: False)
    monkeypatch.delenv("DYNSPEC_POLICY", raising=False)
    monkeypatch.delenv("DYNSPEC_PROFILE", raising=False)

    def make(config: dict | None = None, *, adaptive: bool = True, env: dict | None = None):
        path = None
        if config is not None:
            path = tmp_path / "adaptive.json"
            path.write_text(json.dumps(config))
            path = str(path)
        for k, v in (env or {}).items():
            monkeypatch.setenv(k, v)
        spec = SimpleNamespace(speculative_eagle_topk=1, speculative_num_steps=STEPS,
                               speculative_num_draft_tokens=STEPS + 1, speculative_algorithm="EAGLE3",
                               speculative_adaptive=adaptive, speculative_adaptive_config=path)
        monkeypatch.setattr(ew, "get_spec", lambda: spec)
        target = SimpleNamespace(model_runner=SimpleNamespace(attn_backend="target-attn-verify",
                                                              decode_cuda_graph_runner="target-verify-graphs"))
        worker = ew.EAGLEWorkerV2(server_args=SimpleNamespace(), gpu_id=0, nccl_port=0, target_worker=target)
        worker.built = []

        def build(speculative_num_steps, speculative_num_draft_tokens, cuda_graph_bs=None):
            # Fake: stands in for capturing the draft/verify graphs of one step count.
            worker.built.append((speculative_num_steps, speculative_num_draft_tokens, cuda_graph_bs))
            return ars.SpecRuntimeState(
                speculative_num_steps=speculative_num_steps,
                speculative_num_draft_tokens=speculative_num_draft_tokens,
                draft_attn_backend=f"draft-attn-{speculative_num_steps}",
                cuda_graph_runner=f"draft-graphs-{speculative_num_steps}",
                target_attn_backend=f"target-attn-{speculative_num_steps}",
                target_graph_runner=f"target-graphs-{speculative_num_steps}",
                draft_extend_attn_backend=None, cuda_graph_runner_for_draft_extend=None)

        worker.build_adaptive_runtime_state = build
        worker.ctx = ctx
        return worker

    make.tp = tp  # the TP group the patched code sees; a test may change it
    return make


# --- inert unless asked -------------------------------------------------------------------

def test_unset_is_upstream(server, monkeypatch):
    import dynspec.sglang.adaptive as sa

    calls = []
    monkeypatch.setattr(sa, "build_adaptive_policy", lambda *a, **k: calls.append(a))
    w = server({"1": {"candidate_steps": [1, 3]}, "32": {"candidate_steps": [0]}})
    assert type(w.adaptive_controller.params) is asp.AdaptiveSpeculativeParams
    w = server(None)  # upstream's DEFAULT_ADAPTIVE_CONFIG
    assert type(w.adaptive_controller.params) is asp.AdaptiveSpeculativeParams
    assert w.adaptive_controller.candidate_steps == [0, 1, 3, 5, 7]
    assert calls == []  # dynspec was never asked
    assert server(None, adaptive=False, env={"DYNSPEC_POLICY": "never"}).adaptive_controller is None


DYN = {"1": {"candidate_steps": [0, STEPS]}}  # the config dynspec needs: buffers sized for [0, STEPS]


def test_env_selects_dynspec(server):
    from dynspec.sglang.adaptive import DynspecAdaptivePolicy

    w = server(DYN, env={"DYNSPEC_POLICY": "threshold:on=4,off=4,dwell=0"})
    params = w.adaptive_controller.params
    assert isinstance(params, DynspecAdaptivePolicy)
    assert w.adaptive_controller.candidate_steps == [0, STEPS]
    assert params.controller.spec == "threshold:on=4,off=4,dwell=0"


def test_config_key_selects_dynspec_and_wins_over_env(server):
    from dynspec.sglang.adaptive import DynspecAdaptivePolicy

    cfg = {"1": {"candidate_steps": [0, STEPS]}, "dynspec": {"policy": "never"}}
    w = server(cfg, env={"DYNSPEC_POLICY": "always"})
    assert isinstance(w.adaptive_controller.params, DynspecAdaptivePolicy)
    assert w.adaptive_controller.params.controller.spec == "never"
    # SGLang's own resolution reads the same file: buffers sized for [0, 3], dynspec's key skipped.
    assert asp.resolve_candidate_steps_from_config(ew.get_spec().speculative_adaptive_config) == [0, STEPS]


@pytest.mark.parametrize("cfg, env, warning", [
    ({**DYN, "dynspec": "bogus-policy"}, {}, "is invalid"),
    ({**DYN, "dynspec": {"policy": "never", "when": "always"}}, {}, '"dynspec" must be'),
    (DYN, {"DYNSPEC_POLICY": "goodput", "DYNSPEC_PROFILE": "no-such-profile"}, "cannot start policy"),
    # DYNSPEC_POLICY alone: SGLang sizes its buffers for its default steps [0, 1, 3, 5, 7], which an
    # on/off policy never runs (one that chooses the step count does: above).
    (None, {"DYNSPEC_POLICY": "goodput"}, "needs --speculative-adaptive-config with candidate steps [0, 3]"),
    ({"1": {"candidate_steps": [1, 3]}, "dynspec": "goodput-k"}, {}, "needs 0 and --speculative-num-steps 3"),
    ({"1": {"candidate_steps": [0, 1, 3]}, "dynspec": "goodput"}, {}, "candidate steps [0, 1, 3], dynspec needs"),
])
def test_a_bad_request_warns_and_runs_sglangs_policy(server, caplog, cfg, env, warning):
    with caplog.at_level(logging.WARNING):
        w = server(cfg, env=env)
    assert type(w.adaptive_controller.params) is asp.AdaptiveSpeculativeParams
    msgs = [r.getMessage() for r in caplog.records if "dynspec" in r.getMessage()]
    assert len(msgs) == 1 and warning in msgs[0], msgs


def test_an_unreadable_config_is_one_line_not_a_crash(server, monkeypatch, tmp_path, caplog):
    """The patch reads the config itself (is there a "dynspec" key?): a bad file must not stop it."""
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    monkeypatch.setattr(ew, "get_spec", lambda: SimpleNamespace(speculative_adaptive_config=str(bad)))
    with caplog.at_level(logging.WARNING):
        assert ew._dynspec_adaptive_policy(SimpleNamespace(speculative_num_steps=STEPS)) is None
    msgs = [r.getMessage() for r in caplog.records]
    assert len(msgs) == 1 and "cannot read" in msgs[0] and "SGLang's adaptive policy runs" in msgs[0]


# --- the controller, driven through dynspec's policy ---------------------------------------

def test_worker_switches_states_through_the_controller(server):
    w = server(DYN, env={"DYNSPEC_POLICY": "threshold:on=4,off=4,dwell=0"})
    w.init_cuda_graphs()  # the real method: registers the startup state, builds the others
    # Only the 0-step state is built (the 3-step one exists), with every graph batch size:
    # a dynspec policy may pick either state at any size.
    assert w.built == [(0, 1, GRAPH_BS)]
    assert w.speculative_num_steps == STEPS
    seen, verify_backends, pending = [], [], None
    trace = [1, 2, 4, 8, 16, 8, 4, 2]
    for bs in trace:
        w.activate_step_by_batch(bs)  # what forward_batch_generation calls before drafting
        seen.append(w.speculative_num_steps)
        verify_backends.append(w._target_worker.model_runner.attn_backend)
        # The overlap scheduler processes the previous batch's result after the next launch.
        if pending is not None:
            w.on_verify_complete_cpu(*pending)
        pending = ([1] * bs if w.speculative_num_steps else [0] * bs, bs)
    w.on_verify_complete_cpu(*pending)
    assert seen == [STEPS, STEPS, STEPS, 0, 0, 0, STEPS, STEPS]
    # apply_runtime_state (SGLang's) swapped the whole state, target side included: the
    # 0-step state's verify backend while plain, the startup one when speculating again.
    assert verify_backends == ["target-attn-verify"] * 3 + ["target-attn-0"] * 3 + ["target-attn-verify"] * 2
    assert w.speculative_num_draft_tokens == STEPS + 1
    switches = [kw["speculative_num_steps"] for r, kw in w.ctx.overrides if r == "adaptive_spec.restore"]
    assert switches == [0, STEPS]
    stats = w.adaptive_controller.params.dynspec_stats()
    assert (stats["steps"], stats["steps_spec"], stats["steps_plain"], stats["switches"]) == (8, 5, 3, 2)
    assert stats["mean_accepted_when_speculating"] == 1.0  # plain steps' zeros are not acceptance
    assert stats["unmatched_results"] == 0


def test_a_policy_that_chooses_k_runs_every_state_of_sglangs_default_config(server):
    """Without --speculative-adaptive-config SGLang builds states for [0, 1, 3, 5, 7]; a policy
    that chooses the step count (here a batch-size -> K table) is handed them all and the real
    controller swaps to whichever it answers, each result observed with its own step count."""
    w = server(None, env={"DYNSPEC_POLICY": "table:1-2=7,3-4=1,5-16=5,17-=0"})
    params = w.adaptive_controller.params
    assert w.adaptive_controller.candidate_steps == [0, 1, 3, 5, 7]
    w.init_cuda_graphs()
    assert sorted(k for k, _, _ in w.built) == [0, 1, 5, 7] and all(g == GRAPH_BS for *_, g in w.built)
    seen, pending, observed = [], None, []
    real_observe = params.controller.policy.observe
    params.controller.policy.observe = lambda rec: (observed.append((rec.batch_size, rec.steps)), real_observe(rec))
    for bs in [1, 4, 8, 32, 2]:
        w.activate_step_by_batch(bs)
        seen.append(w.speculative_num_steps)
        if pending is not None:
            w.on_verify_complete_cpu(*pending)
        pending = ([1] * bs if w.speculative_num_steps else [0] * bs, bs)
    w.on_verify_complete_cpu(*pending)
    assert seen == [7, 1, 5, 0, 7]
    assert w.speculative_num_draft_tokens == 8  # the 7-step state's, swapped in whole
    assert observed == [(1, 7), (4, 1), (8, 5), (32, 0), (2, 7)]
    assert params.dynspec_stats()["steps_by_k"] == {"0": 1, "1": 1, "5": 1, "7": 2}


def test_the_plain_step_needs_a_one_layer_eagle3_draft_and_can_be_turned_off(server, caplog):
    """The plain step writes the draft's K and V itself, for one EAGLE-3 layer: any other draft
    (the fake one here has no model) or DYNSPEC_PLAIN_STEP=0 keeps upstream's steps=0, said once."""
    with caplog.at_level(logging.INFO):
        w = server(DYN, env={"DYNSPEC_POLICY": "never"})
    assert w.adaptive_controller is not None and w._dynspec_plain is None
    assert "steps=0 runs upstream's one-token verify (a draft that is not a one-layer EAGLE-3 head)" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO):
        w = server(DYN, env={"DYNSPEC_POLICY": "never", "DYNSPEC_PLAIN_STEP": "0"})
    assert w._dynspec_plain is None and "(DYNSPEC_PLAIN_STEP=0)" in caplog.text
    assert server(None)._dynspec_plain is None  # SGLang's own policy: never dynspec's step


def test_goodput_with_the_seed_profile_switches_off_at_once(server):
    """The seed's node: EAGLE-3 lost at every concurrency; dynspec stops drafting on step one."""
    w = server({"1": {"candidate_steps": [0, STEPS]},
                "dynspec": {"policy": "goodput:times=0", "profile": "seed-blackwell"}})
    w.init_cuda_graphs()
    w.activate_step_by_batch(1)
    assert w.speculative_num_steps == 0
    assert w.adaptive_controller.params.dynspec_stats()["profile"] == "seed-blackwell"


def test_upstream_tiers_still_drive_the_same_worker(server):
    """Control: without dynspec the same worker follows SGLang's tiers (batch 64+ -> 0 steps)."""
    w = server(None)
    w.init_cuda_graphs()
    w.activate_step_by_batch(64)
    assert w.speculative_num_steps == 0
    w.activate_step_by_batch(1)
    assert w.speculative_num_steps == STEPS


def test_tp_sync_all_reduces_on_the_cpu_group(server):
    """The patch's sync hook: a real gloo all-reduce (one process, loopback) divided by the TP size."""
    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        # Declare a TP world of 2 over a real one-rank group: the mean then halves the sum.
        server.tp.world_size, server.tp.cpu_group = 2, dist.new_group([0], backend="gloo")
        w = server(DYN, env={"DYNSPEC_POLICY": "goodput"})  # joined the start MIN (a real one) to get here
        ctl = w.adaptive_controller.params.controller
        assert ctl.tp_size == 2 and ctl.times_agreed and ctl.agreeing
        assert ctl.sync([1.0, 3.0]) == [0.5, 1.5]  # one rank's sum over a declared world of 2
        assert ctl.min_sync([2.0, -1.0]) == [2.0, -1.0]  # a MIN over the one real rank
    finally:
        dist.destroy_process_group()


# --- the rest of the patch and tune's output, read by SGLang itself ---------------------------

def test_server_info_reports_dynspec_only_while_it_runs(server):
    def info(worker):
        sched = SimpleNamespace(spec_algorithm=SimpleNamespace(is_none=lambda: False, is_dspark=lambda: False),
                                draft_worker=worker,
                                metrics_reporter=SimpleNamespace(spec_total_num_forward_ct=0))
        state = {}
        ist.SchedulerInternalStateController(sched, record_step_time=False)._add_speculative(state)
        return state

    assert "dynspec" not in info(server(None))
    w = server(DYN, env={"DYNSPEC_POLICY": "never"})
    w.init_cuda_graphs()
    w.activate_step_by_batch(4)
    got = info(w)["dynspec"]
    assert got["policy"] == "never" and got["steps_plain"] == 1 and got["engine"] == "sglang-0.5.23-adaptive"


def test_tune_config_does_in_sglang_what_tune_says(tmp_path):
    from dynspec.analysis.tune import sglang_adaptive

    cfg = sglang_adaptive(cutoff=16, k=STEPS, top=64)["config"]
    path = tmp_path / "tuned.json"
    path.write_text(json.dumps(cfg))
    assert asp.resolve_candidate_steps_from_config(str(path)) == [0, STEPS]
    params = asp.AdaptiveSpeculativeParams(initial_steps=STEPS, cfg_path=str(path))
    assert [params.get_steps_for_batch(b) for b in (1, 8, 16, 17, 64, 500)] == [STEPS] * 3 + [0] * 3
    for _ in range(200):  # single-candidate tiers: the acceptance EMA cannot move them
        assert params.on_verify_complete([0] * 4, batch_size=4) is None
        assert params.on_verify_complete([STEPS] * 32, batch_size=32) is None
    assert params.get_steps_for_batch(4) == STEPS and params.get_steps_for_batch(32) == 0
    # The README's caveat: SGLang routes by the CUDA-graph-padded size, so a cutoff that is
    # not a capture size turns speculation off early (17 pads to 24 > 20).
    off_at = sglang_adaptive(cutoff=20, k=STEPS, top=64)["config"]
    path.write_text(json.dumps(off_at))
    padded = asp.AdaptiveSpeculativeParams(initial_steps=STEPS, cfg_path=str(path))
    padded.set_cuda_graph_bs([1, 2, 4, 8, 16, 24, 32])
    assert padded.get_steps_for_batch(16) == STEPS and padded.get_steps_for_batch(17) == 0
