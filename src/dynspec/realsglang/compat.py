"""What SGLang 0.5.9 cannot do without its native kernels, and the smallest patch for each.

`install()` registers post-import hooks: each SGLang module listed below is patched right
after it is first imported, in every process of the server (sitecustomize.py calls
`install()`).  Nothing else in SGLang changes.  Each patch says why it is needed.

On a CPU (`--device cpu`) SGLang 0.5.9 serves plain models, but not EAGLE: its draft
backends, verify path and a few index kernels exist only for CUDA.  On a GPU without
`sgl_kernel` (the stand-in in ../site) and without flashinfer, the layers must take their
torch path.  The patches are keyed on that: CPU patches apply when torch has no CUDA,
GPU patches when it has.
"""

from __future__ import annotations

import importlib.abc
import os
import sys
from typing import Callable

_HOOKS: dict[str, list[Callable]] = {}
_VERSION = "0.5.9"  # the SGLang version this process serves: install() sets it


def after_import(module: str, *, when: str = "always", version: str = "0.5.9"):
    """Register fn(module) to run right after `module` is first imported, when this process
    serves SGLang `version` (each version's module layout is its own; compat_0523 holds 0.5.23's)."""
    def register(fn):
        def run(mod):
            import torch

            if _VERSION != version:
                return
            cuda = torch.cuda.is_available()
            if when == "always" or (when == "cpu") != cuda:
                fn(mod)
        _HOOKS.setdefault(module, []).append(run)
        return fn
    return register


def served_version() -> str:
    """The SGLang version this process serves (set by install())."""
    return _VERSION


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Finds hooked modules through the other finders and runs the hooks after exec."""

    def find_spec(self, name, path=None, target=None):
        if name not in _HOOKS:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            for hook in _HOOKS[name]:
                hook(module)

        spec.loader.exec_module = exec_and_patch
        return spec


_FINDER = _PostImportFinder()


def install(version: str = "0.5.9") -> None:
    """Put the hooks for SGLang `version` in front of the import system (idempotent)."""
    global _VERSION
    # 0.5.23's hooks live in compat_0523, which its site-0.5.23/sitecustomize.py imports first.
    if version not in ("0.5.9", "0.5.23"):
        raise ValueError(f"dynspec.realsglang.compat: no patches for SGLang {version} (0.5.9, 0.5.23)")
    _VERSION = version
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
    # The KV pool's triton copy kernel cannot run on a CPU; SGLang has a torch path for it.
    os.environ.setdefault("SGLANG_NATIVE_MOVE_KV_CACHE", "1")


# --- The draft's attention on torch_native (the CPU's only one; on a GPU a reference) ----
@after_import("sglang.srt.speculative.draft_utils")
def torch_native_draft_backends(m):
    """0.5.9's DraftBackendFactory knows no torch_native backend (EAGLE is CUDA-only there).

    Draft decode step i (topk 1) attends to the committed prefix plus the i+1 draft tokens
    written so far, so it is the target's decode attention with seq_lens + i + 1.  The draft
    extend is an ordinary extend (lengths supplied by the verify/extend patch below)."""
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

    class DraftStepBackend(TorchNativeAttnBackend):
        def __init__(self, model_runner, step: int):
            super().__init__(model_runner)
            self.step = step

        def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True):
            committed = forward_batch.seq_lens
            forward_batch.seq_lens = committed + self.step + 1
            try:
                return super().forward_decode(q, k, v, layer, forward_batch, save_kv_cache)
            finally:
                forward_batch.seq_lens = committed

    class TorchNativeMultiStepDraftBackend:
        def __init__(self, model_runner, topk: int, num_steps: int):
            if topk != 1:
                raise NotImplementedError("dynspec compat: the torch_native draft backend supports topk 1 only")
            self.topk, self.speculative_num_steps = topk, num_steps
            self.attn_backends = [DraftStepBackend(model_runner, i) for i in range(num_steps)]

        def init_forward_metadata(self, forward_batch):
            pass  # torch_native plans nothing

    def backend_name(factory, kind: str) -> str:
        return (factory.draft_attn_backend or getattr(factory.server_args, kind, None)
                or factory.server_args.attention_backend)

    decode, extend = m.DraftBackendFactory.create_decode_backend, m.DraftBackendFactory.create_draft_extend_backend

    def create_decode_backend(self):
        if backend_name(self, "decode_attention_backend") == "torch_native" and self.speculative_num_steps > 1:
            return TorchNativeMultiStepDraftBackend(self.draft_model_runner, self.topk, self.speculative_num_steps)
        return decode(self)

    def create_draft_extend_backend(self):
        if backend_name(self, "prefill_attention_backend") == "torch_native":
            return TorchNativeAttnBackend(self.draft_model_runner)
        return extend(self)

    m.DraftBackendFactory.create_decode_backend = create_decode_backend
    m.DraftBackendFactory.create_draft_extend_backend = create_draft_extend_backend


@after_import("sglang.srt.layers.attention.torch_native_backend")
def extend_lengths_for_verify(m):
    """TorchNativeAttnBackend.forward_extend reads extend_prefix_lens/extend_seq_lens, which
    TARGET_VERIFY and DRAFT_EXTEND_V2 batches do not carry (other backends plan from seq_lens).
    Both are a fixed number of tokens per request after a prefix: derive the lengths."""
    import torch

    forward_extend = m.TorchNativeAttnBackend.forward_extend

    def patched(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kw):
        mode = forward_batch.forward_mode
        if not (mode.is_target_verify() or mode.is_draft_extend_v2()):
            return forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache, **kw)
        per_req = q.shape[0] // forward_batch.batch_size
        seq = forward_batch.seq_lens
        # verify: seq_lens is the committed prefix; draft extend v2: it already counts the new tokens
        prefix = seq if mode.is_target_verify() else seq - per_req
        saved = forward_batch.seq_lens, forward_batch.extend_prefix_lens, forward_batch.extend_seq_lens
        forward_batch.seq_lens = prefix + per_req
        forward_batch.extend_prefix_lens = prefix
        forward_batch.extend_seq_lens = torch.full_like(seq, per_req)
        try:
            return forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache, **kw)
        finally:
            forward_batch.seq_lens, forward_batch.extend_prefix_lens, forward_batch.extend_seq_lens = saved

    m.TorchNativeAttnBackend.forward_extend = patched


# --- CPU: tree build and verify (CUDA-only branches that fall through silently) ---------
@after_import("sglang.srt.speculative.eagle_utils", when="cpu")
def chain_ops_on_cpu(m):
    """build_tree_kernel_efficient and verify_tree_greedy_func call sgl_kernel only under
    _is_cuda; on a CPU the first raises NameError and the second silently does nothing.
    Route both to the stand-in's torch ops."""
    import sgl_kernel

    m.sgl_build_tree_kernel_efficient = sgl_kernel.build_tree_kernel_efficient

    def verify_tree_greedy_func(predicts, accept_index, accept_token_num, candidates, retrive_index,
                                retrive_next_token, retrive_next_sibling, target_predict, topk=-1):
        sgl_kernel.verify_tree_greedy(predicts, accept_index, accept_token_num, candidates, retrive_index,
                                      retrive_next_token, retrive_next_sibling, target_predict)
        return predicts, accept_index, accept_token_num

    m.verify_tree_greedy_func = verify_tree_greedy_func


# --- CPU: triton index kernels launched directly ----------------------------------------
def _segments_into(req_pool_indices, req_to_token, start, end, flat, *, to_pool: bool):
    """Copy req_to_token[req, start:end] <-> a flat buffer, request after request."""
    offset = 0
    for row, a, b in zip(req_pool_indices.tolist(), start.tolist(), end.tolist()):
        n = int(b) - int(a)
        if to_pool:
            req_to_token[row, a:b] = flat[offset:offset + n].to(req_to_token.dtype)
        else:
            flat[offset:offset + n] = req_to_token[row, a:b].to(flat.dtype)
        offset += n


def _assign_req_to_token_pool(grid, req_pool_indices, req_to_token, start, end, out_cache_loc, *_):
    _segments_into(req_pool_indices[:grid[0]], req_to_token, start, end, out_cache_loc, to_pool=True)


def _assign_extend_cache_locs(grid, req_pool_indices, req_to_token, start, end, out_cache_loc, *_):
    _segments_into(req_pool_indices[:grid[0]], req_to_token, start, end, out_cache_loc, to_pool=False)


def _assign_draft_cache_locs_page_size_1(grid, req_pool_indices, req_to_token, seq_lens, out_cache_loc,
                                         pool_len, topk, num_steps):
    n = topk * num_steps
    _segments_into(req_pool_indices[:grid[0]], req_to_token, seq_lens, seq_lens + n, out_cache_loc,
                   to_pool=False)


def _fill_new_verified_id(grid, verified_id, accept_lens, new_verified_id, num_draft_tokens):
    import torch

    bs = grid[0]
    idx = torch.arange(bs) * num_draft_tokens + accept_lens[:bs].long() - 1
    new_verified_id[:bs] = verified_id.reshape(-1)[idx].to(new_verified_id.dtype)


def _fill_accepted_out_cache_loc(grid, accept_index, out_cache_loc, accepted_out_cache_loc, size_upper):
    kept = accept_index.reshape(-1)[:grid[0]]
    kept = kept[kept != -1].long()
    accepted_out_cache_loc[:kept.numel()] = out_cache_loc[kept].to(accepted_out_cache_loc.dtype)


class _TorchKernel:
    """`kernel[grid](*args)` served by a torch function fn(grid, *args)."""

    def __init__(self, fn):
        self.fn = fn

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.fn(grid, *args, **kwargs)


_CPU_KERNELS = {
    "assign_req_to_token_pool": _assign_req_to_token_pool,
    "assign_extend_cache_locs": _assign_extend_cache_locs,
    "assign_draft_cache_locs_page_size_1": _assign_draft_cache_locs_page_size_1,
    "fill_new_verified_id": _fill_new_verified_id,
    "fill_accepted_out_cache_loc": _fill_accepted_out_cache_loc,
}


def _torch_kernels(m):
    """The spec path launches five @triton.jit index kernels itself; triton has no CPU
    backend (its interpreter fails on assign_req_to_token_pool with torch 2.13).  These are
    the same copies in torch."""
    for name, fn in _CPU_KERNELS.items():
        if hasattr(m, name):
            setattr(m, name, _TorchKernel(fn))


for _module in ("sglang.srt.speculative.spec_utils", "sglang.srt.speculative.eagle_worker_v2"):
    after_import(_module, when="cpu")(_torch_kernels)


@after_import("sglang.srt.speculative.eagle_info_v2", when="cpu")
def index_kernels_and_cache_locs(m):
    """As above for this module, plus assign_extend_cache_locs_func, whose CPU branch is
    missing (it returns None)."""
    import torch

    _torch_kernels(m)

    def assign_extend_cache_locs_func(req_pool_indices, req_to_token, start_offset, end_offset,
                                      batch_size, draft_token_num, device):
        out = torch.empty((batch_size * draft_token_num,), dtype=torch.int64, device=device)
        _segments_into(req_pool_indices, req_to_token, start_offset, end_offset, out, to_pool=False)
        return out

    m.assign_extend_cache_locs_func = assign_extend_cache_locs_func


# --- CPU: CUDA calls on paths that do not check the device ------------------------------
@after_import("sglang.srt.models.llama", when="cpu")
def no_cuda_sync_when_sharing_embeddings(m):
    """EAGLE-3 shares the target's embedding with the draft (set_embed / set_embed_and_head),
    and both end with torch.cuda.synchronize(), which raises without CUDA."""
    cls = m.LlamaForCausalLM
    for name in ("set_embed", "set_embed_and_head"):
        original = getattr(cls, name)

        def without_sync(self, *args, _original=original, **kwargs):
            import torch

            sync = torch.cuda.synchronize
            torch.cuda.synchronize = lambda *a, **k: None
            try:
                return _original(self, *args, **kwargs)
            finally:
                torch.cuda.synchronize = sync
        setattr(cls, name, without_sync)


@after_import("sglang.srt.model_executor.model_runner", when="cpu")
def cores_per_tp_rank(m):
    """On a CPU, 0.5.9 gives each TP rank one NUMA node's cores and refuses a --tp-size above
    the node count unless SGLANG_CPU_OMP_THREADS_BIND names each rank's cores.  A one-node
    machine (this project's, a CI runner) then cannot serve TP=2.  Unset, the machine's cores
    are split into tp_size contiguous shares (ranks share a core when there are fewer cores
    than ranks).  The binding is used only by sgl_kernel's CPU kernels (AMX, arm64): the
    stand-in has none, so this decides nothing but that the server starts."""
    original = m.ModelRunner.init_threads_binding

    def init_threads_binding(self):
        if os.environ.get("SGLANG_CPU_OMP_THREADS_BIND") or self.tp_size <= len(m.get_cpu_ids_by_node()):
            return original(self)
        self.local_omp_cpuid = rank_cores(self.tp_size, self.tp_rank)

    m.ModelRunner.init_threads_binding = init_threads_binding


def rank_cores(tp_size: int, tp_rank: int, cores: list[int] | None = None) -> str:
    """The cores of one TP rank, as SGLANG_CPU_OMP_THREADS_BIND writes one rank's share ("0,1")."""
    cores = sorted(os.sched_getaffinity(0)) if cores is None else sorted(cores)
    if len(cores) < tp_size:
        return str(cores[tp_rank % len(cores)])
    share = len(cores) // tp_size
    return ",".join(map(str, cores[tp_rank * share:(tp_rank + 1) * share]))


@after_import("sglang.srt.mem_cache.memory_pool", when="cpu")
def no_triton_kv_copy_warmup(m):
    """A speculative server's KV pool warms up a triton KV-copy kernel at start; on a CPU it
    moves KV with torch instead (SGLANG_NATIVE_MOVE_KV_CACHE=1, set by install())."""
    m.MHATokenToKVPool._init_kv_copy_and_warmup = lambda self: setattr(self, "_kv_copy_config", None)


@after_import("sglang.srt.entrypoints.engine", when="cpu")
@after_import("sglang.srt.entrypoints.engine", when="cpu", version="0.5.23")
def fork_server_processes(m):
    """SGLang spawns its scheduler and detokenizer, each a fresh interpreter (CUDA cannot be
    forked), which imports again the SGLang, transformers and torch the launcher already holds:
    about ten seconds of a core per process.  On a CPU nothing stops a fork, and several servers
    sharing a few cores start in much less time.  DYNSPEC_CPU_SPAWN=1 keeps SGLang's spawn."""
    import multiprocessing

    if os.environ.get("DYNSPEC_CPU_SPAWN") == "1" or getattr(multiprocessing.set_start_method, "_dynspec_compat", False):
        return
    original = multiprocessing.set_start_method

    def set_start_method(method, force=False):
        original("fork" if method == "spawn" else method, force=force)

    set_start_method._dynspec_compat = True
    multiprocessing.set_start_method = set_start_method


@after_import("sglang.srt.managers.overlap_utils", when="cpu")
def record_stream_on_cpu(m):
    """FutureMap calls tensor.record_stream(current stream); CPU tensors have no streams and
    torch raises.  For a CPU tensor there is nothing to record."""
    import torch

    original = torch.Tensor.record_stream
    if getattr(original, "_dynspec_compat", False):
        return

    def record_stream(self, stream):
        if self.device.type != "cpu":
            return original(self, stream)

    record_stream._dynspec_compat = True
    torch.Tensor.record_stream = record_stream


# --- GPU without sgl_kernel or flashinfer -------------------------------------------------
@after_import("sglang.srt.layers.utils.multi_platform", when="gpu")
def torch_layers_on_gpu(m):
    """RMSNorm, SiluAndMul and rotary embedding take forward_cuda (sgl_kernel ops) on a GPU;
    without the real sgl_kernel they take dynspec's fused Triton bodies (triton_layers: one
    kernel an op, as sgl_kernel) and every other op its torch body (forward_native).
    DYNSPEC_GPU_LAYERS=torch keeps the torch bodies everywhere, for comparison."""
    layers = os.environ.get("DYNSPEC_GPU_LAYERS", "triton")
    if layers not in ("triton", "torch"):
        raise ValueError(f"DYNSPEC_GPU_LAYERS must be triton or torch, not {layers!r}")
    fused = layers == "triton"

    def dispatch_forward(self):
        if fused:
            from dynspec.realsglang.triton_layers import layer_forward

            body = layer_forward(self)
            if body is not None:
                return body
        return self.forward_native

    m.MultiPlatformOp.dispatch_forward = dispatch_forward


@after_import("sglang.srt.layers.attention.triton_backend", when="gpu")
def draft_extend_v2_graph_layout(m):
    """0.5.9's Triton backend replays the spec-v2 draft-extend CUDA graph with spec v1's layout:
    queries at cumsum(accept lengths) and every request's KV over its whole length.  A v2 draft
    extend holds all num_steps + 1 tokens of each request, so rows after the first attend with
    another row's queries and see their own later tokens; the draft is then wrong on most positions
    above batch 1 (measured on one H200: accept length 1.57 at C=4 against 2.23 eager or on spec v1).
    The eager path (an ordinary extend: queries n per request, KV over the prefix) is the reference;
    this writes its layout into the graph's buffers.  SGLang 0.5.23 fills them this way itself."""
    import torch

    cls = m.TritonAttnBackend
    original = cls.init_forward_metadata_replay_cuda_graph

    def replay(self, bs, req_pool_indices, seq_lens, seq_lens_sum, encoder_lens, forward_mode, spec_info,
               seq_lens_cpu, *args, **kwargs):
        original(self, bs, req_pool_indices, seq_lens, seq_lens_sum, encoder_lens, forward_mode, spec_info,
                 seq_lens_cpu, *args, **kwargs)
        if not forward_mode.is_draft_extend_v2():
            return
        n = int(self.num_draft_tokens)
        self.qo_indptr[: bs + 1] = torch.arange(0, bs * n + 1, n, dtype=self.qo_indptr.dtype, device=self.device)
        prefix = torch.clamp(seq_lens[:bs] - spec_info.extend_seq_lens_tensor[:bs], min=0)
        self.kv_indptr[1: bs + 1] = torch.cumsum(prefix, dim=0)
        m.create_flashinfer_kv_indices_triton[(bs,)](
            self.req_to_token, req_pool_indices, prefix, self.kv_indptr[: bs + 1], None,
            self.cuda_graph_kv_indices, self.req_to_token.stride(0))

    cls.init_forward_metadata_replay_cuda_graph = replay


@after_import("sglang.srt.mem_cache.memory_pool", when="gpu")
def torch_kv_store_on_gpu(m):
    """The KV store's fast path is a JIT kernel (tvm-ffi) that is not installed; the
    torch index_put path is SGLang's own fallback."""
    m.can_use_store_cache = lambda size: False
