"""The sgl_kernel ops EAGLE-3 spec v2 (topk 1) calls, in plain torch.

Spec v2 only runs with `--speculative-eagle-topk 1`, so the draft "tree" is a chain
(dynspec.realsglang.chain_ops builds and verifies it, with sgl_kernel 0.3.21's in/out conventions).
"""

from __future__ import annotations

import torch

from dynspec.realsglang.chain_ops import build_tree_kernel_efficient, verify_tree_greedy

__all__ = ["build_tree_kernel_efficient", "verify_tree_greedy", "fast_topk"]
IMPLEMENTED = ("build_tree_kernel_efficient", "verify_tree_greedy", "fast_topk")

# Ops SGLang's CUDA path registers fake (meta) kernels for at import time, for torch.compile:
# torch.library.register_fake needs the op to exist.  Schemas written from the argument lists
# of SGLang's fakes; no kernel is registered, so calling one of them still fails.
FAKE_TARGETS = (
    "sgl_per_token_group_quant_8bit(Tensor input, Tensor(a!) output_q, Tensor(b!) output_s, int group_size, "
    "float eps, float fp8_min, float fp8_max, bool scale_ue8m0) -> ()",
    "sgl_per_token_group_quant_fp8(Tensor input, Tensor(a!) output_q, Tensor(b!) output_s, int group_size, "
    "float eps, float fp8_min, float fp8_max, bool scale_ue8m0) -> ()",
    "sgl_per_token_quant_fp8(Tensor input, Tensor(a!) output_q, Tensor(b!) output_s) -> ()",
    "fp8_scaled_mm(Tensor mat_a, Tensor mat_b, Tensor scales_a, Tensor scales_b, ScalarType out_dtype, "
    "Tensor? bias=None) -> Tensor",
    "moe_fused_gate(Tensor input_tensor, Tensor bias, int num_expert_group, int topk_group, int topk, "
    "int num_fused_shared_experts=0, float routed_scaling_factor=0, "
    "bool apply_routed_scaling_factor_on_output=False) -> Tensor[]",
)
_LIBRARY = None


def define_fake_targets() -> None:
    global _LIBRARY
    if _LIBRARY is None:
        _LIBRARY = torch.library.Library("sgl_kernel", "FRAGMENT")
        for schema in FAKE_TARGETS:
            _LIBRARY.define(schema)


def fast_topk(values, topk, dim):
    """The k largest values and their indices; max() for k = 1 (what SGLang's CUDA path does)."""
    if topk == 1:
        return torch.max(values, dim=dim, keepdim=True)
    return torch.topk(values, topk, dim=dim)
