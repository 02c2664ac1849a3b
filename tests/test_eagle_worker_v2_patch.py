"""The patched EAGLEWorkerV2 of SGLang 0.5.9, imported on a CPU and driven with fakes.

The real sglang 0.5.9 wheel is unpacked into a temporary directory, patched there by
`dynspec patch apply`, and imported from it (torch CPU; only the native GPU kernel
packages are stubbed, see sglang_stubs.py).  The target model, the draft model's
forward and the draft/verify kernels are fakes that record what they were given;
everything between them is SGLang's own code: EAGLEWorkerV2.forward_batch_generation,
EagleDraftWorker._draft_extend_for_decode (the draft catch-up), ForwardBatch.init_new,
the scheduler's FutureMap (which relays the next draft input from step to step) and
the output processor's _resolve_spec_overlap_token_ids (which feeds the policy).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import logging
import sys
from types import SimpleNamespace

import pytest

from dynspec.sglang import patching
from scripted_policy import Scripted
from dynspec.sglang.hook import Controller
from dynspec.realsglang.wheels import unpack

import sglang_stubs

torch = pytest.importorskip("torch", reason="requirements/sglang-cpu.txt installs the CPU torch")

VOCAB, H_TARGET, H_DRAFT, POOL_LEN = 97, 12, 4, 512
STEPS, STRIDE = 3, 4  # --speculative-num-steps 3 --speculative-num-draft-tokens 4
REQ_POOL = [0, 2, 5]
SEQ0 = [10, 17, 30]
VERIFY_GRAPHS, TARGET_ATTN = "target-verify-cuda-graphs", "target-attn-backend"


@pytest.fixture(scope="module")
def sg(tmp_path_factory):
    """The patched 0.5.9 modules, plus the upstream eagle_worker_v2 for comparison."""
    base = tmp_path_factory.mktemp("sglang-0.5.9")
    patched_root = unpack("0.5.9", base / "patched")
    upstream_root = unpack("0.5.9", base / "upstream")
    out = patching.do_apply(patching.find_sglang(patched_root))
    assert out.code == 0, out.message
    sglang_stubs.install()
    sys.path.insert(0, str(patched_root))
    before = set(sys.modules)
    try:
        ns = SimpleNamespace()
        ns.ew = importlib.import_module("sglang.srt.speculative.eagle_worker_v2")
        assert ns.ew.__file__.startswith(str(patched_root))
        ns.fbi = importlib.import_module("sglang.srt.model_executor.forward_batch_info")
        ns.sb = importlib.import_module("sglang.srt.managers.schedule_batch")
        ns.ou = importlib.import_module("sglang.srt.managers.overlap_utils")
        ns.opm = importlib.import_module("sglang.srt.managers.scheduler_output_processor_mixin")
        ns.sched = importlib.import_module("sglang.srt.managers.scheduler")
        ns.lp = importlib.import_module("sglang.srt.layers.logits_processor")
        ns.si = importlib.import_module("sglang.srt.speculative.spec_info")
        ns.einfo = importlib.import_module("sglang.srt.speculative.eagle_info")
        ns.sa = importlib.import_module("sglang.srt.server_args")
        spec = importlib.util.spec_from_file_location(
            "_upstream_eagle_worker_v2", upstream_root / "sglang/srt/speculative/eagle_worker_v2.py")
        ns.up = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(ns.up)
        assert not hasattr(ns.up, "_dynspec_init") and hasattr(ns.ew, "_dynspec_init")
        yield ns
    finally:
        sys.path.remove(str(patched_root))
        for name in set(sys.modules) - before:
            if name.split(".")[0] in ("sglang", "_upstream_eagle_worker_v2") + sglang_stubs.STUBBED:
                del sys.modules[name]
        sglang_stubs.uninstall()


def server_args(**over):
    args = dict(
        enable_multi_layer_eagle=False, attention_backend="torch_native", enable_lora=False,
        enable_dp_attention=False, pp_size=1, speculative_eagle_topk=1, enable_two_batch_overlap=False,
        enable_pdmux=False, tp_size=1, disable_cuda_graph=False, enable_metrics=False,
        served_model_name="fake", speculative_num_steps=STEPS, speculative_num_draft_tokens=STRIDE,
        device="cpu", enable_nan_detection=False, page_size=1, speculative_algorithm="EAGLE3",
        enable_hierarchical_cache=False, disaggregation_mode="null", cuda_graph_max_bs=None,
    )
    args.update(over)
    return SimpleNamespace(**args)


@pytest.fixture
def env(sg, monkeypatch):
    """Per-test global state SGLang reads, made CPU-safe."""
    args = server_args()
    sg.sa.set_global_server_args_for_scheduler(args)
    # No MoE expert-parallel group exists on a CPU without torch.distributed.
    monkeypatch.setattr(sg.fbi, "enable_num_token_non_padded", lambda server_args: False)
    # CPU tensors have no CUDA streams; FutureMap and verify() call record_stream.
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda self, stream: None)
    monkeypatch.delenv("DYNSPEC_POLICY", raising=False)
    return args


# --- fakes ------------------------------------------------------------------------------


class Trace(list):
    def kinds(self):
        return [c[0] for c in self]


class FakeTargetRunner:
    device = "cpu"
    tp_group = None

    def __init__(self):
        self.graph_runner = VERIFY_GRAPHS
        self.attn_backend = TARGET_ATTN


class FakeTarget:
    """The target model for plain steps: samples a deterministic token per request."""

    def __init__(self, sg, trace):
        self.sg, self.trace = sg, trace
        self.model_runner = FakeTargetRunner()
        self.model_config = SimpleNamespace(hidden_size=H_DRAFT, dtype=torch.float32)

    def forward_batch_generation(self, model_worker_batch=None, forward_batch=None, is_verify=False,
                                 skip_attn_backend_init=False):
        b = model_worker_batch
        assert b is not None and not is_verify, "the plain step runs a normal target forward"
        self.trace.append(("target", dict(
            mode=b.forward_mode, input_ids=b.input_ids.clone(), out_cache_loc=b.out_cache_loc.clone(),
            seq_lens=b.seq_lens.clone(), seq_lens_cpu=b.seq_lens_cpu.clone(), seq_lens_sum=b.seq_lens_sum,
            spec_info=b.spec_info, capture=b.capture_hidden_mode,
            graph_runner=self.model_runner.graph_runner, attn_backend=self.model_runner.attn_backend)))
        ids = b.input_ids.long()
        next_ids = (ids * 7 + b.seq_lens) % VOCAB
        hidden = ids[:, None].float() + torch.arange(H_TARGET).float()
        return self.sg.sched.GenerationBatchResult(
            logits_output=self.sg.lp.LogitsProcessorOutput(next_token_logits=torch.zeros(len(ids), VOCAB),
                                                           hidden_states=hidden),
            next_token_ids=next_ids, can_run_cuda_graph=False)


class FakeDraftAttn:
    def __init__(self, trace):
        self.trace = trace

    def init_forward_metadata(self, forward_batch):
        self.trace.append(("draft_attn_init", forward_batch.forward_mode))


class FakeKVPool:
    """The draft's KV cache: records what the KV-only catch-up writes."""

    def __init__(self, trace):
        self.trace = trace

    def set_kv_buffer(self, layer, loc, cache_k, cache_v):
        self.trace.append(("draft_kv", dict(layer=layer, loc=loc.clone(), k=cache_k.clone(), v=cache_v.clone())))


QKV = torch.randn(3 * H_DRAFT, 2 * H_DRAFT, generator=torch.Generator().manual_seed(1))  # rows: q | k | v


def fake_eagle3():
    """The pieces of LlamaForCausalLMEagle3 the KV-only catch-up calls (model.model.*)."""
    attn = SimpleNamespace(
        q_size=H_DRAFT, kv_size=H_DRAFT, num_kv_heads=1, head_dim=H_DRAFT, attn="draft-layer-0",
        qkv_proj=SimpleNamespace(weight=QKV, bias=None),
        rotary_emb=lambda positions, q, k: (q, k + positions[:, None].float()))
    inner = SimpleNamespace(
        embed_tokens=lambda ids: ids[:, None].float() + torch.zeros(H_DRAFT),
        fc=lambda h: 2 * h[:, :H_DRAFT],  # 3 x target hidden -> draft hidden
        midlayer=SimpleNamespace(input_layernorm=lambda x: x + 1, hidden_norm=lambda x: x - 1, self_attn=attn))
    return SimpleNamespace(model=inner)


def expected_kv(new_ids, target_hidden, positions):
    """What the catch-up must write: K/V rows of qkv over [norm(embed) | norm(fc(aux))], RoPE on K."""
    x = torch.cat([new_ids[:, None].float() + torch.zeros(H_DRAFT) + 1, 2 * target_hidden[:, :H_DRAFT] - 1], dim=-1)
    kv = x @ QKV[H_DRAFT:].T
    return kv[:, :H_DRAFT] + positions[:, None].float(), kv[:, H_DRAFT:]


class FakeDraftRunner:
    """The EAGLE-3 draft model: predicts token+1; hidden = target hidden[:H] + position."""

    device = "cpu"
    model_is_mrope = False
    tp_group = None

    def __init__(self, sg, trace, pool, args):
        self.sg, self.trace, self.req_to_token_pool, self.server_args = sg, trace, pool, args
        self.attn_backend = FakeDraftAttn(trace)
        self.model = fake_eagle3()
        self.token_to_kv_pool = FakeKVPool(trace)

    def forward(self, forward_batch, skip_attn_backend_init=False):
        fb = forward_batch
        self.trace.append(("draft_forward", dict(
            mode=fb.forward_mode, input_ids=fb.input_ids.clone(), positions=fb.positions.clone(),
            out_cache_loc=fb.out_cache_loc.clone(), hidden_in=fb.spec_info.hidden_states.clone())))
        n = len(fb.input_ids)
        logits = torch.full((n, VOCAB), -1.0)
        logits[torch.arange(n), (fb.input_ids.long() + 1) % VOCAB] = 5.0
        hidden = fb.spec_info.hidden_states[:, :H_DRAFT].float() + fb.positions[:, None].float()
        return SimpleNamespace(logits_output=self.sg.lp.LogitsProcessorOutput(next_token_logits=logits,
                                                                               hidden_states=hidden))


def make_worker(sg, cls_module, args, policy=None, graphs=None, window=1):
    """An EAGLEWorkerV2 (patched or upstream) around fakes, without loading models."""
    trace = Trace()
    pool = SimpleNamespace(req_to_token=(torch.arange(8 * POOL_LEN, dtype=torch.int32).reshape(8, POOL_LEN) + 10000))
    draft = cls_module.EagleDraftWorker.__new__(cls_module.EagleDraftWorker)
    draft.server_args, draft.device, draft.topk = args, "cpu", 1
    draft.speculative_num_steps, draft.speculative_num_draft_tokens = STEPS, STRIDE
    draft.draft_runner = FakeDraftRunner(sg, trace, pool, args)
    draft.cuda_graph_runner = draft.cuda_graph_runner_for_draft_extend = None
    draft.draft_tp_context = lambda group: contextlib.nullcontext()
    draft.plan_stream, draft.plan_stream_ctx = None, contextlib.nullcontext()
    draft.hot_token_id = None

    def fake_draft(batch):  # the draft forward (triton kernels): recorded, not run
        di = batch.spec_info
        trace.append(("draft", dict(verified_id=di.verified_id.clone(), topk_p=di.topk_p.clone(),
                                    topk_index=di.topk_index.clone(), hidden=di.hidden_states.clone(),
                                    seq_lens=batch.seq_lens.clone())))
        return sg.einfo.EagleVerifyInput(
            draft_token=None, custom_mask=None, positions=None, retrive_index=None, retrive_next_token=None,
            retrive_next_sibling=None, retrive_cum_len=None, spec_steps=STEPS, topk=1,
            draft_token_num=STRIDE, capture_hidden_mode=None, seq_lens_sum=None, seq_lens_cpu=None)

    draft.draft = fake_draft

    w = cls_module.EAGLEWorkerV2.__new__(cls_module.EAGLEWorkerV2)
    w.server_args, w.topk, w.speculative_num_steps, w.speculative_num_draft_tokens = args, 1, STEPS, STRIDE
    w.enable_nan_detection, w.tp_rank, w.gpu_id, w.device, w.page_size = False, 0, 0, "cpu", 1
    w.speculative_algorithm = sg.si.SpeculativeAlgorithm.EAGLE3
    w._target_worker = FakeTarget(sg, trace)
    w._draft_worker = draft
    w.req_to_token_pool = pool
    w.plan_stream, w.plan_stream_ctx = None, contextlib.nullcontext()

    def fake_verify(batch):  # target verify (GPU kernels): every request accepts 1 draft + bonus
        trace.append(("verify", dict(seq_lens=batch.seq_lens.clone())))
        bs = len(batch.seq_lens)
        batch.forward_mode = sg.fbi.ForwardMode.TARGET_VERIFY
        batch.out_cache_loc = pool.req_to_token[batch.req_pool_indices[:, None],
                                                batch.seq_lens[:, None] + torch.arange(STRIDE)].reshape(-1).long()
        accept = torch.full((bs,), 2, dtype=torch.int32)
        predict = ((torch.arange(bs * STRIDE) * 3 + batch.seq_lens.repeat_interleave(STRIDE)) % VOCAB).to(torch.int32)
        verified = predict[torch.arange(bs) * STRIDE + accept - 1]
        hidden = torch.arange(bs * STRIDE * H_TARGET, dtype=torch.float32).reshape(bs * STRIDE, H_TARGET)
        return sg.sched.GenerationBatchResult(
            logits_output=sg.lp.LogitsProcessorOutput(next_token_logits=None, hidden_states=hidden),
            next_token_ids=predict, can_run_cuda_graph=False, accept_lens=accept,
            next_draft_input=sg.einfo.EagleDraftInput(verified_id=verified, new_seq_lens=batch.seq_lens + accept))

    w.verify = fake_verify
    if cls_module is sg.ew:
        w.dynspec = Controller(policy, spec=policy.name) if policy is not None else None
        w._dynspec_graphs = graphs
        w._dynspec_catch_up = sg.ew._DynspecCatchUp(draft.draft_runner, window, 8, 8, "cpu")  # eager (CPU)
        w._dynspec_constants = sg.ew._DynspecConstants(8, 1, H_DRAFT, torch.float32, "cpu")
        w._dynspec_graph_model = None  # FakeTargetRunner has no model attribute
        w._dynspec_stale = torch.zeros(pool.req_to_token.shape[0], dtype=torch.bool)
        w._dynspec_resume_pending = False
    return w, trace


def decode_batch(sg, seq_lens, spec_info, **over):
    kw = dict(
        forward_mode=sg.fbi.ForwardMode.DECODE, input_ids=torch.empty(0, dtype=torch.int64),
        req_pool_indices=torch.tensor(REQ_POOL), seq_lens=seq_lens, out_cache_loc=None,
        seq_lens_cpu=seq_lens.clone(), seq_lens_sum=int(seq_lens.sum()), return_logprob=False,
        top_logprobs_nums=None, token_ids_logprobs=None, global_num_tokens=None,
        global_num_tokens_for_logprob=None, is_extend_in_batch=False, can_run_dp_cuda_graph=False,
        tbo_split_seq_index=None, global_forward_mode=None, extend_num_tokens=None, extend_seq_lens=None,
        extend_prefix_lens=None, extend_logprob_start_lens=None, extend_input_logprob_token_ids=None,
        multimodal_inputs=None, encoder_cached=None, encoder_lens=None, encoder_lens_cpu=None,
        encoder_out_cache_loc=None, lora_ids=None,
        sampling_info=SimpleNamespace(acc_linear_penalties=None, logit_bias=None, has_custom_logit_processor=False),
        spec_algorithm=sg.si.SpeculativeAlgorithm.EAGLE3, spec_info=spec_info, has_grammar=False)
    kw.update(over)
    return sg.sb.ModelWorkerBatch(**kw)


def drive(sg, worker, steps, **batch_over):
    """Run `steps` decode steps the way Scheduler.run_batch does under the overlap
    scheduler: the next draft input travels through the real FutureMap."""
    fm = sg.ou.FutureMap(max_running_requests=8, chunked_prefill_size=0, context_len=POOL_LEN, device="cpu",
                         spec_algo=sg.si.SpeculativeAlgorithm.EAGLE3)
    bs = len(SEQ0)
    seq_lens = torch.tensor(SEQ0)
    # What the draft prefill (_draft_extend_for_prefill) leaves for the first decode step.
    first = sg.einfo.EagleDraftInput(
        verified_id=torch.tensor([3, 4, 5], dtype=torch.int32), new_seq_lens=seq_lens.clone(),
        topk_p=torch.ones(bs, 1), topk_index=torch.tensor([[6], [7], [8]]),
        hidden_states=torch.zeros(bs, H_DRAFT))
    fi = fm.alloc_future_indices(bs)
    fm.store_to_map_for_new_batch(fi, first)
    out = []
    for _ in range(steps):
        spec_info = sg.einfo.EagleDraftInput(future_indices=fi)
        batch = decode_batch(sg, seq_lens, spec_info, **batch_over)
        fm.resolve_future(batch)
        resolved = SimpleNamespace(verified_id=spec_info.verified_id.clone(), topk_index=spec_info.topk_index.clone(),
                                   topk_p=spec_info.topk_p.clone(), hidden=spec_info.hidden_states.clone(),
                                   seq_lens=seq_lens.clone())
        result = worker.forward_batch_generation(batch)
        fi = fm.alloc_future_indices(bs)
        fm.store_to_map(fi, result)  # raises if a shape no longer fits the buffers (hazard b)
        seq_lens = result.next_draft_input.new_seq_lens
        out.append((resolved, result))
    return out


def same(a, b):
    return torch.equal(torch.as_tensor(a), torch.as_tensor(b))


# --- tests ------------------------------------------------------------------------------


def test_plain_step_runs_no_draft_and_one_token_per_request(sg, env):
    policy = Scripted([False])
    w, trace = make_worker(sg, sg.ew, env, policy)
    ((inp, res),) = drive(sg, w, 1)
    assert trace.kinds() == ["target", "draft_kv"]  # no draft(), no verify, no draft forward
    t = trace[0][1]
    seq = torch.tensor(SEQ0)
    rt = w.req_to_token_pool.req_to_token
    slot = rt[torch.tensor(REQ_POOL), seq].long()
    assert t["mode"] == sg.fbi.ForwardMode.DECODE
    assert t["input_ids"].shape == (3,) and same(t["input_ids"], inp.verified_id.long())  # one token per request
    assert same(t["out_cache_loc"], slot)  # the slot at seq_len
    assert same(t["seq_lens"], seq + 1) and same(t["seq_lens_cpu"], seq + 1) and t["seq_lens_sum"] == int(seq.sum()) + 3
    assert t["spec_info"] is None and t["capture"] == sg.fbi.CaptureHiddenMode.FULL
    # Hazard (a): never the TARGET_VERIFY graphs for a 1-token batch; restored afterwards.
    assert t["graph_runner"] is None and t["attn_backend"] == TARGET_ATTN
    assert w.target_worker.model_runner.graph_runner == VERIFY_GRAPHS

    sampled = (inp.verified_id.long() * 7 + seq + 1) % VOCAB
    target_hidden = inp.verified_id.float()[:, None] + torch.arange(H_TARGET).float()
    kv = trace[1][1]  # the KV-only catch-up: the draft's K/V at seq_len for (target hidden, new token)
    k, v = expected_kv(sampled, target_hidden, seq)
    assert kv["layer"] == "draft-layer-0" and same(kv["loc"], slot)
    assert torch.allclose(kv["k"].reshape(3, -1), k) and torch.allclose(kv["v"].reshape(3, -1), v)

    assert res.dynspec_speculated is False
    assert same(res.accept_lens, torch.ones(3, dtype=torch.int32))
    assert same(res.next_token_ids.reshape(3, STRIDE)[:, 0], sampled)
    nd = res.next_draft_input
    assert same(nd.verified_id, sampled) and same(nd.new_seq_lens, seq + 1)
    assert nd.topk_p.shape == (3, 1) and nd.topk_index.shape == (3, 1) and nd.hidden_states.shape == (3, H_DRAFT)
    assert not nd.hidden_states.any()  # a placeholder: the resume rebuilds the draft state
    folded = w._dynspec_catch_up.folded(torch.tensor(REQ_POOL))
    assert torch.allclose(folded, 2 * target_hidden[:, :H_DRAFT])  # fc(aux), kept for the resume
    assert res.logits_output.hidden_states is None  # nothing extra to copy to the CPU
    assert w.dynspec.stats()["steps_plain"] == 1 and w.dynspec.mode == "plain"
    assert w._dynspec_resume_pending and bool(w._dynspec_stale[torch.tensor(REQ_POOL)].all())


def test_first_speculative_step_after_plain_resumes_the_draft(sg, env):
    """A 1-token full draft forward at seq_len - 1 restores topk and hidden state before drafting."""
    w, trace = make_worker(sg, sg.ew, env, Scripted([False, True, True]))
    runs = drive(sg, w, 3)
    kinds = trace.kinds()
    assert kinds == ["target", "draft_kv",
                     "draft_attn_init", "draft_forward", "draft", "verify", "draft_attn_init", "draft_forward",
                     "draft", "verify", "draft_attn_init", "draft_forward"]  # one resume only
    (plain_in, plain_res), (inp, _), _ = runs
    resume = trace[3][1]
    seq = inp.seq_lens
    rt = w.req_to_token_pool.req_to_token
    assert resume["mode"] == sg.fbi.ForwardMode.DRAFT_EXTEND_V2
    assert same(resume["input_ids"], inp.verified_id) and same(resume["positions"], seq - 1)
    assert same(resume["out_cache_loc"], rt[torch.tensor(REQ_POOL), seq - 1].long())
    folded = 2 * (plain_in.verified_id.float()[:, None] + torch.arange(H_DRAFT).float())  # fc(aux) of the plain step
    assert same(resume["hidden_in"], folded)
    draft = trace[4][1]  # the draft starts from the resumed state, not the placeholders
    assert same(draft["topk_index"][:, 0], (inp.verified_id.long() + 1) % VOCAB)
    assert torch.allclose(draft["hidden"], folded + (seq - 1)[:, None].float())
    assert w.dynspec.stats()["resumes"] == 1 and not w._dynspec_resume_pending


def test_resume_leaves_requests_that_joined_since_alone(sg, env):
    """A request prefilled after the plain step has a current draft state: the resume writes its
    KV to the padding slot 0 and keeps its topk and hidden state."""
    w, trace = make_worker(sg, sg.ew, env, Scripted([False, True]))
    drive(sg, w, 1)
    w._dynspec_stale[REQ_POOL[1]] = False  # as the prefill branch does for a new request
    trace.clear()
    (inp, _), = drive(sg, w, 1)
    resume, draft = trace[1][1], trace[2][1]
    assert int(resume["out_cache_loc"][1]) == 0 and int(resume["out_cache_loc"][0]) != 0
    assert same(draft["topk_index"][1], inp.topk_index[1]) and same(draft["hidden"][1], inp.hidden[1])
    assert not same(draft["topk_index"][0], inp.topk_index[0])


def test_plain_step_uses_plain_graphs_when_captured(sg, env):
    w, trace = make_worker(sg, sg.ew, env, Scripted([False]), graphs=("plain-decode-graphs", "plain-attn"))
    drive(sg, w, 1)
    t = trace[0][1]
    assert (t["graph_runner"], t["attn_backend"]) == ("plain-decode-graphs", "plain-attn")
    assert (w.target_worker.model_runner.graph_runner, w.target_worker.model_runner.attn_backend) == (
        VERIFY_GRAPHS, TARGET_ATTN)


def kv_writes(trace):
    return [c[1] for c in trace if c[0] == "draft_kv"]


def test_catch_up_window_writes_every_pending_row_in_one_pass(sg, env):
    """With a window of 3, the first two plain steps write no draft KV; the third writes the
    rows of all three in one pass, each at its own slot with its own K and V."""
    w, trace = make_worker(sg, sg.ew, env, Scripted([False] * 3), window=3)
    runs = drive(sg, w, 3)
    assert trace.kinds() == ["target", "target", "target", "draft_kv"]
    (kv,) = kv_writes(trace)
    rt = w.req_to_token_pool.req_to_token
    want_loc, want_k, want_v = [], [], []
    for inp, res in runs:
        sampled = res.next_draft_input.verified_id.long()
        hidden = inp.verified_id.float()[:, None] + torch.arange(H_TARGET).float()
        k, v = expected_kv(sampled, hidden, inp.seq_lens)
        want_loc.append(rt[torch.tensor(REQ_POOL), inp.seq_lens].long())
        want_k.append(k)
        want_v.append(v)
    assert same(kv["loc"], torch.cat(want_loc))
    assert torch.allclose(kv["k"].reshape(9, -1), torch.cat(want_k))
    assert torch.allclose(kv["v"].reshape(9, -1), torch.cat(want_v))
    assert w._dynspec_catch_up.pending == 0


def test_resume_and_prefill_flush_the_pending_rows_first(sg, env):
    """Nothing may read the draft KV while rows are pending: a resume writes them before its
    draft forward (and takes each request's folded state from its last row), a prefill before
    the target runs."""
    w, trace = make_worker(sg, sg.ew, env, Scripted([False, False, True]), window=8)
    runs = drive(sg, w, 3)
    assert trace.kinds()[:4] == ["target", "target", "draft_kv", "draft_attn_init"]
    assert len(kv_writes(trace)[0]["loc"]) == 6  # both plain steps, one pass
    last_plain_in = runs[1][0]
    folded = 2 * (last_plain_in.verified_id.float()[:, None] + torch.arange(H_DRAFT).float())
    resume = [c[1] for c in trace if c[0] == "draft_forward"][0]
    assert same(resume["hidden_in"], folded)

    w, trace = make_worker(sg, sg.ew, env, Scripted([False]), window=8)
    drive(sg, w, 1)
    assert trace.kinds() == ["target"]
    extend = decode_batch(sg, torch.tensor(SEQ0), None, forward_mode=sg.fbi.ForwardMode.EXTEND)

    class TargetPrefill(Exception):
        pass

    def prefill(*_a, **_k):  # stop at the target's prefill: what matters is what ran before it
        raise TargetPrefill

    w.target_worker.forward_batch_generation = prefill
    with pytest.raises(TargetPrefill):
        w.forward_batch_generation(extend)
    assert trace.kinds() == ["target", "draft_kv"] and w._dynspec_catch_up.pending == 0


PREFILL_POOL, PREFIX, EXTEND = [1, 3], [0, 2], [3, 2]  # a fresh prompt and one with a cached prefix


def prefill(sg, w, trace, reqs=None):
    """Prefill two requests (5 extend tokens) through the worker; the target is a fake whose aux
    hidden state of token t is t + arange and which samples 50 and 60."""
    ids = torch.tensor([11, 12, 13, 21, 22])
    rt = w.req_to_token_pool.req_to_token
    loc = torch.cat([rt[r, p:p + e] for r, p, e in zip(PREFILL_POOL, PREFIX, EXTEND)]).long()
    seq = torch.tensor([p + e for p, e in zip(PREFIX, EXTEND)])
    batch = decode_batch(sg, seq, None, forward_mode=sg.fbi.ForwardMode.EXTEND, input_ids=ids.clone(),
                         req_pool_indices=torch.tensor(PREFILL_POOL), out_cache_loc=loc,
                         extend_seq_lens=EXTEND, extend_prefix_lens=PREFIX, extend_num_tokens=5, reqs=reqs)
    hidden = ids[:, None].float() + torch.arange(H_TARGET).float()
    sampled = torch.tensor([50, 60])

    def target(model_worker_batch=None, **_):
        trace.append(("target_prefill", model_worker_batch.capture_hidden_mode))
        return sg.sched.GenerationBatchResult(
            logits_output=sg.lp.LogitsProcessorOutput(next_token_logits=None, hidden_states=hidden),
            next_token_ids=sampled, can_run_cuda_graph=False)

    w.target_worker.forward_batch_generation = target
    return w.forward_batch_generation(batch), SimpleNamespace(ids=ids, hidden=hidden, sampled=sampled, loc=loc, seq=seq)


def test_a_prefill_in_a_plain_stretch_writes_the_draft_kv_only(sg, env):
    """After a plain step the draft prefill runs no draft forward: it writes the draft K and V
    of every prompt position (the next prompt token, the sampled one at each prompt's end, at
    prefix + offset), queues each request's last position as a catch-up row, and leaves the
    draft state to the resume, which then starts from that row's folded state."""
    w, trace = make_worker(sg, sg.ew, env, Scripted([False, True]), window=8)
    drive(sg, w, 1)
    trace.clear()
    res, p = prefill(sg, w, trace)
    assert trace.kinds() == ["draft_kv", "target_prefill", "draft_kv"]  # flush, target, the prompt's KV
    kv = trace[2][1]
    shifted = torch.tensor([12, 13, 50, 22, 60])
    k, v = expected_kv(shifted, p.hidden, torch.tensor([0, 1, 2, 2, 3]))
    assert same(kv["loc"], p.loc)
    assert torch.allclose(kv["k"].reshape(5, -1), k) and torch.allclose(kv["v"].reshape(5, -1), v)
    nd = res.next_draft_input
    assert same(nd.verified_id, p.sampled) and same(nd.new_seq_lens, p.seq) and not nd.hidden_states.any()
    assert bool(w._dynspec_stale[torch.tensor(PREFILL_POOL)].all())
    assert w._dynspec_catch_up.pending == 2 and w.dynspec.stats()["kv_only_prefills"] == 1
    folded = w._dynspec_catch_up.folded(torch.tensor(PREFILL_POOL))
    assert folded is None or not torch.allclose(folded, 2 * p.hidden[[2, 4], :H_DRAFT])  # not yet flushed

    # The next step speculates: the resume writes the two rows, then drafts from each prompt's end.
    trace.clear()
    batch = decode_batch(sg, p.seq, nd, req_pool_indices=torch.tensor(PREFILL_POOL))
    w.forward_batch_generation(batch)
    assert trace.kinds()[:3] == ["draft_kv", "draft_attn_init", "draft_forward"]
    rows = trace[0][1]
    assert same(rows["loc"], p.loc[[2, 4]]) and torch.allclose(rows["k"], kv["k"][[2, 4]])
    resume = trace[2][1]
    assert same(resume["input_ids"], p.sampled) and same(resume["positions"], p.seq - 1)
    assert same(resume["out_cache_loc"], p.loc[[2, 4]])
    assert same(resume["hidden_in"], 2 * p.hidden[[2, 4], :H_DRAFT])
    assert not w._dynspec_resume_pending and not w._dynspec_stale[torch.tensor(PREFILL_POOL)].any()


ASKS_HIDDEN = [SimpleNamespace(return_hidden_states=False), SimpleNamespace(return_hidden_states=True)]


@pytest.mark.parametrize("plain_stretch", [True, False], ids=["kv-only", "full-draft-prefill"])
def test_a_prefill_hands_the_cpu_no_hidden_states_nobody_asked_for(sg, env, monkeypatch, plain_stretch):
    """The scheduler copies a result's hidden states to the CPU after the forward; EAGLE-3's
    are 3 x hidden per prompt token (~200 MB for 8192 tokens of Llama-3.1-8B shapes), read only
    for requests that asked.  The patched server drops them otherwise; upstream keeps them."""
    monkeypatch.setattr(sg.ew.EagleDraftWorker, "_draft_extend_for_prefill",
                        lambda self, batch, hidden, ids: "draft-prefill-state", raising=False)
    monkeypatch.setattr(sg.up.EagleDraftWorker, "_draft_extend_for_prefill",
                        lambda self, batch, hidden, ids: "draft-prefill-state", raising=False)
    for reqs, kept in ((None, False), (ASKS_HIDDEN, True)):
        w, trace = make_worker(sg, sg.ew, env, Scripted([False]), window=8)
        if plain_stretch:
            drive(sg, w, 1)
        res, p = prefill(sg, w, trace, reqs=reqs)
        assert w.dynspec.stats()["kv_only_prefills"] == int(plain_stretch)
        assert (res.logits_output.hidden_states is not None) == kept
        if kept:
            assert same(res.logits_output.hidden_states, p.hidden)
    u, utrace = make_worker(sg, sg.up, env)
    res, p = prefill(sg, u, utrace)
    assert same(res.logits_output.hidden_states, p.hidden)  # upstream: copied whether asked or not


def test_a_prefill_outside_a_plain_stretch_runs_the_full_draft_prefill(sg, env, monkeypatch):
    """Before any plain step (and after a resume) the draft prefill is upstream's: the prefilled
    requests get a current draft state and nothing waits for a resume."""
    w, trace = make_worker(sg, sg.ew, env, Scripted([True]), window=8)
    calls = []
    monkeypatch.setattr(w.draft_worker, "_draft_extend_for_prefill",
                        lambda batch, hidden, ids: calls.append(ids) or "draft-prefill-state", raising=False)
    res, p = prefill(sg, w, trace)
    assert trace.kinds() == ["target_prefill"] and len(calls) == 1 and same(calls[0], p.sampled)
    assert res.next_draft_input == "draft-prefill-state"
    assert not w._dynspec_stale.any() and w.dynspec.stats()["kv_only_prefills"] == 0


def test_a_slot_reused_within_a_window_is_written_by_its_later_row(sg, env):
    """A finished request's slot handed to another request within one window: one pass writes
    both rows, so the earlier row must go to the padding slot 0, whatever the scatter order."""
    w, trace = make_worker(sg, sg.ew, env, window=4)
    cu = w._dynspec_catch_up
    aux = torch.randn(2, H_TARGET, generator=torch.Generator().manual_seed(3))
    cu.append(aux[:1], torch.tensor([5]), torch.tensor([40]), torch.tensor([700]), torch.tensor([0]))
    cu.append(aux[1:], torch.tensor([6]), torch.tensor([12]), torch.tensor([700]), torch.tensor([2]))
    cu.flush()
    (kv,) = kv_writes(trace)
    assert kv["loc"].tolist() == [0, 700]
    k, v = expected_kv(torch.tensor([6]), aux[1:], torch.tensor([12]))
    # float32 sums of terms near 20 whose result may be near 0: an absolute tolerance (a random aux
    # once gave 1.9073e-02 against 1.9074e-02); the two rows' K and V differ by whole units.
    assert torch.allclose(kv["k"].reshape(2, -1)[1], k[0], atol=1e-4)
    assert torch.allclose(kv["v"].reshape(2, -1)[1], v[0], atol=1e-4)
    k0, _ = expected_kv(torch.tensor([5]), aux[:1], torch.tensor([40]))
    assert not torch.allclose(kv["k"].reshape(2, -1)[1], k0[0], atol=1e-4)  # not the earlier row


def test_a_resume_after_a_cache_reset_that_discarded_every_row_keeps_its_state(sg, env):
    """flush_cache on an idle server whose only plain rows were still pending: nothing was ever
    written, so the next resume has no folded state to take and keeps the draft input's."""
    w, trace = make_worker(sg, sg.ew, env, Scripted([False, True]), window=8)
    drive(sg, w, 1)
    w.clear_cache_pool()
    assert w._dynspec_catch_up.folded(torch.tensor(REQ_POOL)) is None
    trace.clear()
    (inp, _), = drive(sg, w, 1)  # the resume, then a speculative step: no crash
    resume = [c[1] for c in trace if c[0] == "draft_forward"][0]
    assert same(resume["hidden_in"], inp.hidden) and "draft_kv" not in trace.kinds()


def test_cache_reset_discards_pending_rows_and_large_batches_write_at_once(sg, env):
    w, trace = make_worker(sg, sg.ew, env, Scripted([False]), window=8)
    drive(sg, w, 1)
    w.clear_cache_pool()  # flush_cache: the slots of pending rows belong to no one now
    w._dynspec_catch_up.flush()
    assert trace.kinds() == ["target"]
    cu = w._dynspec_catch_up
    n = cu.capacity + 1  # more rows than a window holds
    cu.append(torch.randn(n, H_TARGET), torch.arange(n), torch.arange(n), torch.arange(n) + 100,
              torch.arange(n) % 8)
    assert len(kv_writes(trace)) == 1 and cu.pending == 0


def test_graphed_flush_pads_to_a_captured_row_count_and_writes_padding_to_slot_0(sg, env):
    """The catch-up graphs (CUDA only) replay a fixed row count on the ring's buffers: rows past
    the pending ones write to the padding slot 0.  A stand-in graph reruns the same function on
    the same buffers, so what is checked is the padding and buffer handling around replay()."""
    w, trace = make_worker(sg, sg.ew, env, window=2)
    cu = w._dynspec_catch_up
    cu._allocate(H_TARGET, torch.float32)
    cu.slot.fill_(999)  # a slot left from an earlier, larger window must not be written again

    class StandInGraph:  # what a captured graph does: rerun on the ring's buffers
        def __init__(self, n):
            self.n = n

        def replay(self):
            cu._run(self.n)

    cu.graphs = {n: StandInGraph(n) for n in (1, 2, 4)}
    cu.buckets = sorted(cu.graphs)
    aux = torch.randn(3, H_TARGET, generator=torch.Generator().manual_seed(4))
    cu.append(aux, torch.tensor([5, 6, 7]), torch.tensor([10, 11, 12]), torch.tensor([101, 102, 103]),
              torch.tensor([0, 2, 5]))
    cu.flush()
    (kv,) = kv_writes(trace)
    assert kv["loc"].tolist() == [101, 102, 103, 0]  # padded to 4, the extra row to slot 0
    k, v = expected_kv(torch.tensor([5, 6, 7]), aux, torch.tensor([10, 11, 12]))
    # An absolute tolerance: float32 sums near 20 whose results may be near 0 (see above).
    assert torch.allclose(kv["k"].reshape(4, -1)[:3], k, atol=1e-4)
    assert torch.allclose(kv["v"].reshape(4, -1)[:3], v, atol=1e-4)
    assert torch.allclose(cu.folded(torch.tensor([5, 0, 2])), 2 * aux[[2, 0, 1], :H_DRAFT])


def test_speculate_takes_the_original_path(sg, env):
    modes = [True] * 3
    w, trace = make_worker(sg, sg.ew, env, Scripted(modes))
    u, utrace = make_worker(sg, sg.up, env)
    got, want = drive(sg, w, 3), drive(sg, u, 3)
    assert trace.kinds() == utrace.kinds() == ["draft", "verify", "draft_attn_init", "draft_forward"] * 3
    assert_same_runs(got, want, trace, utrace)
    # Only the hidden states of the verify (3 x hidden per draft token), which nobody asked for
    # and upstream copies to the CPU every step, are dropped.
    assert all(r.logits_output.hidden_states is None for _, r in got)
    assert all(r.logits_output.hidden_states is not None for _, r in want)


def test_unset_policy_is_exactly_upstream(sg, env, monkeypatch):
    monkeypatch.delenv("DYNSPEC_POLICY", raising=False)
    w, trace = make_worker(sg, sg.ew, env)
    sg.ew._dynspec_init(w)
    assert w.dynspec is None and w._dynspec_graphs is None
    u, utrace = make_worker(sg, sg.up, env)
    got, want = drive(sg, w, 4), drive(sg, u, 4)
    assert trace.kinds() == utrace.kinds()
    assert_same_runs(got, want, trace, utrace)
    assert not hasattr(got[0][1], "dynspec_speculated")


def assert_same_runs(got, want, trace, utrace):
    for (gi, gr), (wi, wr) in zip(got, want):
        for k in ("verified_id", "topk_index", "topk_p", "hidden", "seq_lens"):
            assert same(getattr(gi, k), getattr(wi, k)), k
        assert same(gr.next_token_ids, wr.next_token_ids) and same(gr.accept_lens, wr.accept_lens)
        for k in ("verified_id", "new_seq_lens", "topk_p", "topk_index", "hidden_states"):
            assert same(getattr(gr.next_draft_input, k), getattr(wr.next_draft_input, k)), k
    for (gk, ga), (wk, wa) in zip(trace, utrace):
        assert gk == wk
        if isinstance(ga, dict):
            for key in ga:
                assert same(ga[key], wa[key]) if torch.is_tensor(ga[key]) else ga[key] == wa[key], (gk, key)


def test_switches_in_both_directions_keep_inputs_well_formed(sg, env):
    modes = [True, False, False, True, False, True]
    w, trace = make_worker(sg, sg.ew, env, Scripted(modes))
    runs = drive(sg, w, len(modes))
    spec = ["draft", "verify", "draft_attn_init", "draft_forward"]
    resume = ["draft_attn_init", "draft_forward"]
    want = []
    for i, mode in enumerate(modes):
        want += (resume if i and not modes[i - 1] else []) + spec if mode else ["target", "draft_kv"]
    assert trace.kinds() == want
    for i, (_mode, (inp, _res)) in enumerate(zip(modes, runs)):
        # The inputs of every step are what the previous step left, with the same shapes.
        assert inp.verified_id.shape == (3,) and inp.topk_p.shape == (3, 1)
        assert inp.topk_index.shape == (3, 1) and inp.hidden.shape == (3, H_DRAFT)
        if i:
            prev_in, prev = runs[i - 1]
            nd = prev.next_draft_input
            assert same(inp.verified_id, nd.verified_id) and same(inp.hidden, nd.hidden_states)
            assert same(inp.seq_lens, nd.new_seq_lens)
            assert same(inp.seq_lens, prev_in.seq_lens + (2 if modes[i - 1] else 1))
    targets = [c[1] for c in trace if c[0] == "target"]
    plain_inputs = [inp for m, (inp, _) in zip(modes, runs) if not m]
    for t, inp in zip(targets, plain_inputs):  # the target continues from the last verified token
        assert same(t["input_ids"], inp.verified_id.long()) and same(t["seq_lens"], inp.seq_lens + 1)
    st = w.dynspec.stats()
    assert (st["steps_spec"], st["steps_plain"], st["switches"], st["resumes"]) == (3, 3, 4, 2)


def test_replaced_target_model_drops_the_plain_graphs(sg, env, caplog):
    """update_weights_from_disk swaps in a new model: graphs captured on the old one would
    replay stale weights, so plain steps go eager (one warning)."""
    w, trace = make_worker(sg, sg.ew, env, Scripted([False, False]), graphs=("plain-decode-graphs", "plain-attn"))
    drive(sg, w, 1)
    assert trace[0][1]["graph_runner"] == "plain-decode-graphs"
    w.target_worker.model_runner.model = object()  # what ModelRunner.update_weights_from_disk does
    trace.clear()
    with caplog.at_level(logging.WARNING):
        drive(sg, w, 1)
    assert trace[0][1]["graph_runner"] is None and w._dynspec_graphs is None
    assert "target model was replaced" in caplog.text


def test_min_p_batch_keeps_speculating(sg, env):
    w, trace = make_worker(sg, sg.ew, env, Scripted([False]))
    info = SimpleNamespace(acc_linear_penalties=None, logit_bias=None, has_custom_logit_processor=False,
                           need_min_p_sampling=True)
    drive(sg, w, 1, sampling_info=info)
    assert trace.kinds()[:2] == ["draft", "verify"] and w.dynspec.forced_spec == 1


def test_grammar_batch_keeps_speculating(sg, env):
    policy = Scripted([False])
    w, trace = make_worker(sg, sg.ew, env, policy)
    drive(sg, w, 1, has_grammar=True)
    assert trace.kinds()[:2] == ["draft", "verify"]
    assert w.dynspec.forced_spec == 1 and w.dynspec.steps_spec == 1


def test_output_processor_feeds_the_policy_from_cpu_accept_lengths(sg, env):
    """Hazard (c): observe() is fed from accept_lens.tolist() in the output processor."""
    policy = Scripted([True, False])
    w, _ = make_worker(sg, sg.ew, env, policy)
    runs = drive(sg, w, 2)
    scheduler = SimpleNamespace(draft_worker=w)
    outs = []
    for _inp, res in runs:
        reqs = [SimpleNamespace(kv_committed_len=0, spec_verify_ct=0, spec_accepted_tokens=0,
                                update_spec_acceptance_histogram=lambda n: None) for _ in range(3)]
        outs.append(sg.opm.SchedulerOutputProcessorMixin._resolve_spec_overlap_token_ids(
            scheduler, res, SimpleNamespace(reqs=reqs)))
        assert [r.kv_committed_len for r in reqs] == res.accept_lens.tolist()
    assert [len(t) for t in outs[0]] == [2, 2, 2] and [len(t) for t in outs[1]] == [1, 1, 1]
    assert outs[1] == [[int(x)] for x in runs[1][1].next_draft_input.verified_id]
    rec_spec, rec_plain = policy.records
    assert (rec_spec.batch_size, rec_spec.speculated, tuple(rec_spec.accepted)) == (3, True, (1, 1, 1))
    assert (rec_plain.batch_size, rec_plain.speculated, tuple(rec_plain.accepted)) == (3, False, ())


def test_the_policy_learns_which_requests_each_step_runs(sg, env):
    """The decide call passes the batch's requests (ModelWorkerBatch.reqs, host objects: no GPU
    work) and the output processor the requests its accept lengths belong to, so a policy can
    keep each request's own acceptance; a batch above the policy's requests_up_to passes None."""
    rids = [SimpleNamespace(rid=r) for r in ("r0", "r1", "r2")]
    policy = Scripted([True, False], requests_up_to=8)
    w, _ = make_worker(sg, sg.ew, env, policy)
    runs = drive(sg, w, 2, reqs=rids)
    assert policy.batches == [["r0", "r1", "r2"]] * 2 and w.dynspec.stats()["steps_with_requests"] == 2
    scheduler = SimpleNamespace(draft_worker=w)
    for _inp, res in runs:
        reqs = [SimpleNamespace(rid=r.rid, kv_committed_len=0, spec_verify_ct=0, spec_accepted_tokens=0,
                                update_spec_acceptance_histogram=lambda n: None) for r in rids]
        sg.opm.SchedulerOutputProcessorMixin._resolve_spec_overlap_token_ids(scheduler, res, SimpleNamespace(reqs=reqs))
    rec_spec, rec_plain = policy.records
    assert list(rec_spec.requests) == ["r0", "r1", "r2"] and rec_plain.requests is None  # a plain step has none
    small = Scripted([True], requests_up_to=2)  # three requests are more than it tracks
    w, _ = make_worker(sg, sg.ew, env, small)
    drive(sg, w, 1, reqs=rids)
    assert small.batches == [None] and w.dynspec.stats()["steps_with_requests"] == 0
    # ... unless it asks for a speculative step's ids (wants_requests: goodput's pairs of steps)
    asks = Scripted([True], requests_up_to=2, wants=True)
    w, _ = make_worker(sg, sg.ew, env, asks)
    (_inp, res), = drive(sg, w, 1, reqs=rids)
    reqs = [SimpleNamespace(rid=r.rid, kv_committed_len=0, spec_verify_ct=0, spec_accepted_tokens=0,
                            update_spec_acceptance_histogram=lambda n: None) for r in rids]
    sg.opm.SchedulerOutputProcessorMixin._resolve_spec_overlap_token_ids(
        SimpleNamespace(draft_worker=w), res, SimpleNamespace(reqs=reqs))
    assert asks.batches == [None] and list(asks.records[-1].requests) == ["r0", "r1", "r2"]


def test_server_info_reports_the_counters(sg, env):
    w, _ = make_worker(sg, sg.ew, env, Scripted([True, False, False]))
    drive(sg, w, 3)
    runner = SimpleNamespace(weight_load_mem_usage=1.0, graph_mem_usage=0.5)
    fake = SimpleNamespace(
        draft_worker=w, last_gen_throughput=0.0, tp_worker=SimpleNamespace(model_runner=runner),
        token_to_kv_pool_allocator=SimpleNamespace(get_kvcache=lambda: SimpleNamespace(mem_usage=2.0)),
        max_total_num_tokens=100, max_running_requests=8,
        spec_algorithm=sg.si.SpeculativeAlgorithm.EAGLE3, spec_total_num_forward_ct=0)
    state = sg.sched.Scheduler.get_internal_state(fake, None).internal_state
    d = state["dynspec"]
    assert d["policy"] == "scripted" and d["mode"] == "plain"
    assert (d["steps_spec"], d["steps_plain"], d["switches"]) == (1, 2, 1)
    assert d["last_switch"]["step"] == 2 and d["last_switch"]["to"] == "plain"
    fake.draft_worker = SimpleNamespace()  # a worker without dynspec: no key at all
    # (upstream builds the reply in the global ServerArgs' own __dict__: start from a fresh one)
    sg.sa.set_global_server_args_for_scheduler(server_args())
    assert "dynspec" not in sg.sched.Scheduler.get_internal_state(fake, None).internal_state


# --- start-up wiring: inert, live, or one warning ----------------------------------------


def test_init_builds_a_live_controller_from_the_environment(sg, env, monkeypatch, caplog):
    monkeypatch.setenv("DYNSPEC_POLICY", "table:1-2=on,3-=off")
    w, trace = make_worker(sg, sg.ew, env)
    with caplog.at_level(logging.INFO):
        sg.ew._dynspec_init(w)
    assert isinstance(w.dynspec, Controller) and w.dynspec.plain_step_kind == "eager"
    assert any("is live" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.INFO):
        drive(sg, w, 2)  # batch of 3: the table says plain
    assert trace.kinds()[0] == "target"
    switch = [r.getMessage() for r in caplog.records if "switch" in r.getMessage()]
    assert len(switch) == 1 and "spec -> plain at step 1, batch size 3" in switch[0]


@pytest.mark.parametrize("setup, expect", [
    (lambda mp, args: mp.setenv("DYNSPEC_POLICY", "threshold:"), "invalid"),
    (lambda mp, args: mp.setenv("DYNSPEC_PROFILE", "/nonexistent/profile.yaml"), "cannot start"),
    (lambda mp, args: mp.setitem(sys.modules, "dynspec.sglang.hook", None), "cannot be imported"),
    (lambda mp, args: setattr(args, "enable_dp_attention", True), "not supported"),
])
def test_misconfiguration_warns_once_and_speculates(sg, env, monkeypatch, caplog, setup, expect):
    monkeypatch.setenv("DYNSPEC_POLICY", "never")
    setup(monkeypatch, env)
    w, trace = make_worker(sg, sg.ew, env)
    with caplog.at_level(logging.WARNING):
        sg.ew._dynspec_init(w)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert w.dynspec is None
    assert len(warnings) == 1 and expect in warnings[0] and "speculates" in warnings[0], warnings
    drive(sg, w, 1)
    assert trace.kinds()[:2] == ["draft", "verify"]


# --- hazard (a): the plain-step CUDA graphs, captured as a plain server would ------------


def test_plain_graph_capture_sees_a_plain_server(sg, env, monkeypatch):
    """The capture runs SGLang's CudaGraphRunner (faked here: no CUDA) on the target's
    model runner while it looks like a plain server's, with a fresh attention backend,
    keeping hidden states; the verify graphs and backend are restored afterwards."""
    cgr = importlib.import_module("sglang.srt.model_executor.cuda_graph_runner")
    seen = {}

    class FakeCudaGraphRunner:
        def __init__(self, model_runner):
            seen["spec_algorithm"] = model_runner.spec_algorithm
            seen["attn_backend"] = model_runner.attn_backend
            self.capture_hidden_mode = sg.fbi.CaptureHiddenMode.NULL
            self.capture_bs = [1, 2, 4]
            self.capture()

        def capture(self):
            seen["capture_hidden_mode"] = self.capture_hidden_mode

        def get_spec_info(self, num_tokens):
            return "a verify input"

    monkeypatch.setattr(cgr, "CudaGraphRunner", FakeCudaGraphRunner)
    monkeypatch.setattr(sg.ew, "get_available_gpu_memory", lambda *a, **k: 10.0)
    w, _ = make_worker(sg, sg.ew, env)
    runner = w.target_worker.model_runner
    runner.spec_algorithm = sg.si.SpeculativeAlgorithm.EAGLE3
    runner._get_attention_backend = lambda: ("fresh-backend", runner.spec_algorithm)
    graphs, backend = sg.ew._dynspec_capture_plain_graphs(w)
    assert seen["spec_algorithm"] == sg.si.SpeculativeAlgorithm.NONE  # DECODE, 1 token per request
    assert seen["attn_backend"] == backend == ("fresh-backend", sg.si.SpeculativeAlgorithm.NONE)
    assert seen["capture_hidden_mode"] == sg.fbi.CaptureHiddenMode.FULL
    assert graphs.get_spec_info(4) is None
    assert runner.spec_algorithm == sg.si.SpeculativeAlgorithm.EAGLE3
    assert (runner.graph_runner, runner.attn_backend) == (VERIFY_GRAPHS, TARGET_ATTN)

    def boom(model_runner):
        raise RuntimeError("capture failed")

    monkeypatch.setattr(cgr, "CudaGraphRunner", type("Failing", (), {"__init__": lambda self, mr: boom(mr)}))
    assert sg.ew._dynspec_capture_plain_graphs(w) is None  # plain steps then run eagerly
    assert runner.spec_algorithm == sg.si.SpeculativeAlgorithm.EAGLE3
    assert (runner.graph_runner, runner.attn_backend) == (VERIFY_GRAPHS, TARGET_ATTN)
