"""What SGLang 0.5.23 cannot do on a CPU without its native kernels, and the smallest patch for each.

Registered with compat.after_import(..., version="0.5.23"): they run only in a process that
serves 0.5.23 (site-0.5.23/sitecustomize.py calls compat.install(version="0.5.23")).
Each patch says why it is needed.
"""

from __future__ import annotations

from dynspec.realsglang import compat
from dynspec.realsglang.compat import after_import

V = "0.5.23"


@after_import("sglang.srt.mem_cache.memory_pool", when="cpu", version=V)
def no_kv_copy_warmup(m):
    """A speculative server's KV pool warms up a byte-copy kernel at start whose CPU body is
    sgl_kernel's (not stood in); on a CPU KV moves with torch (SGLANG_NATIVE_MOVE_KV_CACHE=1,
    set by compat.install())."""
    m.MHATokenToKVPool._init_kv_copy_and_warmup = lambda self: setattr(self, "_kv_copy_config", None)


# --- The draft's attention on torch_native (the CPU's only attention backend) -----------
@after_import("sglang.srt.speculative.draft_utils", version=V)
def torch_native_draft_backends(m):
    """0.5.23's DraftBackendFactory knows no torch_native backend (EAGLE needs a GPU backend there).

    Draft decode step i (topk 1) attends to the committed prefix plus the i + 1 draft tokens
    written so far: the target's decode attention over seq_lens + i + 1.  The draft extend is an
    ordinary extend (its lengths come from compat.extend_lengths_for_verify, registered below)."""
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

    class DraftStepBackend(TorchNativeAttnBackend):
        def __init__(self, model_runner, step: int):
            super().__init__(model_runner)
            self.step = step

        def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kw):
            committed = forward_batch.seq_lens
            forward_batch.seq_lens = committed + self.step + 1
            try:
                return super().forward_decode(q, k, v, layer, forward_batch, save_kv_cache, **kw)
            finally:
                forward_batch.seq_lens = committed

    class TorchNativeMultiStepDraftBackend:
        prefill_attention_backend_str = decode_attention_backend_str = "torch_native"

        def __init__(self, model_runner, topk: int, num_steps: int):
            if topk != 1:
                raise NotImplementedError("dynspec compat: the torch_native draft backend supports topk 1 only")
            self.topk, self.speculative_num_steps = topk, num_steps
            self.attn_backends = [DraftStepBackend(model_runner, i) for i in range(num_steps)]
            for b in self.attn_backends:
                b.prefill_attention_backend_str = b.decode_attention_backend_str = "torch_native"

        def init_forward_metadata(self, forward_batch):
            pass  # torch_native plans nothing

    def is_torch_native(factory) -> bool:
        from sglang.srt.runtime_context import attention_backends

        return (factory.draft_attn_backend or attention_backends()[1]) == "torch_native"

    decode, extend = m.DraftBackendFactory.create_decode_backend, m.DraftBackendFactory.create_draft_extend_backend

    def create_decode_backend(self):
        if is_torch_native(self):
            if self.speculative_num_steps <= 1:
                return None  # as upstream: steps 0 and 1 draft without attention
            return TorchNativeMultiStepDraftBackend(self.draft_model_runner, self.topk, self.speculative_num_steps)
        return decode(self)

    def create_draft_extend_backend(self):
        if is_torch_native(self):
            backend = TorchNativeAttnBackend(self.draft_model_runner)
            backend.prefill_attention_backend_str = backend.decode_attention_backend_str = "torch_native"
            return backend
        return extend(self)

    m.DraftBackendFactory.create_decode_backend = create_decode_backend
    m.DraftBackendFactory.create_draft_extend_backend = create_draft_extend_backend


# TARGET_VERIFY and DRAFT_EXTEND_V2 batches carry no extend lengths in 0.5.23 either: 0.5.9's hook,
# registered for this version too.
after_import("sglang.srt.layers.attention.torch_native_backend", version=V)(compat.extend_lengths_for_verify)


# --- A GPU without the native kernel package ------------------------------------------------
# Layers take SGLang's torch bodies there through upstream's own switch,
# SGLANG_FORCE_FUSED_OP_BACKEND=torch (their CUDA bodies are sglang-kernel's).
@after_import("sglang.srt.layers.dual_gemm", when="gpu", version=V)
def no_dual_gemm_on_gpu(m):
    """The MLP's fused gate-up and down GEMM is a CuTe DSL kernel (the `cutlass` package, not in
    the image); without it the MLP runs its two linear layers, as on every other platform."""
    m.DualGemm._select_mode = lambda self, gate_up_proj, hidden_size: None


@after_import("sglang.kernels.ops.speculative.tree", when="gpu", version=V)
def chain_ops_on_gpu(m):
    """The chain's build and greedy verify are CUDA sources compiled at first use (tvm-ffi,
    the kernel package's headers); dynspec.realsglang.chain_ops does the same in torch (topk 1)."""
    from dynspec.realsglang import chain_ops

    m.build_tree_kernel_efficient = chain_ops.build_tree_kernel_efficient
    m.verify_tree_greedy = chain_ops.verify_tree_greedy


@after_import("sglang.srt.layers.attention.triton_backend", when="gpu", version=V)
def no_programmatic_dependent_launch(m):
    """Whether the GPU supports programmatic dependent launch comes from the kernel package;
    the Triton attention kernels launch without it."""
    m.is_arch_support_pdl = lambda: False


@after_import("sglang.srt.mem_cache.memory_pool", when="gpu", version=V)
def torch_kv_store_on_gpu(m):
    """The KV store's fast path is a CUDA source compiled at first use; SGLang's torch
    index_put path is its own fallback."""
    m.can_use_store_cache = lambda *args, **kwargs: False
