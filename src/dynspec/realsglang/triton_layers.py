"""Fused Triton bodies for the layers whose CUDA bodies live in sgl_kernel: RMSNorm (with and
without the residual add), SiluAndMul and neox-style rotary embedding.

Why: without the real sgl_kernel, SGLang's torch bodies (forward_native) run instead, about 45
small kernels a decoder layer where sgl_kernel launches four.  Inside a CUDA graph that costs GPU
time; outside one (prefill, extend) it costs host time: measured on one H200 with the crafted
Llama-3.1-8B shapes, a prefill of one or two 128-token prompts held a decode batch of 64 for
45-55 ms, and two identical plain servers measured 0.86-1.16 of each other.  One kernel per op,
fp32 math rounded once (as sgl_kernel does), brings a stand-in server's costs near a real one's.

`layer_forward(op)` answers the fused body for an op it covers, None otherwise (the op then keeps
its torch body).  Covered: RMSNorm without a variance override, fp32 residual, post-residual
addition or dtype override; SiluAndMul; RotaryEmbedding and Llama3RotaryEmbedding in neox style
without offsets.  Checked against the torch bodies on CPU with Triton's interpreter
(tests/test_triton_layers.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import triton
import triton.language as tl

if TYPE_CHECKING:  # torch is imported where it runs (inside a server), as dynspec's other modules do
    import torch


@triton.jit
def _rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, n_cols, x_stride, res_stride, out_stride, eps,
                     HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        x += tl.load(res_ptr + row * res_stride + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(res_ptr + row * res_stride + cols, x.to(res_ptr.dtype.element_ty), mask=mask)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * out_stride + cols, (x * rstd * w).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, d, x_stride, out_stride, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < d
    gate = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * x_stride + d + cols, mask=mask, other=0.0).to(tl.float32)
    out = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(out_ptr + row * out_stride + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rotate_heads(base, stride, n_heads, tok, head_size, half, cos, sin, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    h = tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    mask = (h[:, None] < n_heads) & (d[None, :] < half)
    offs = tok * stride + h[:, None] * head_size + d[None, :]
    x1 = tl.load(base + offs, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(base + offs + half, mask=mask, other=0.0).to(tl.float32)
    tl.store(base + offs, (x1 * cos - x2 * sin).to(base.dtype.element_ty), mask=mask)
    tl.store(base + offs + half, (x2 * cos + x1 * sin).to(base.dtype.element_ty), mask=mask)


@triton.jit
def _rope_neox_kernel(pos_ptr, q_ptr, k_ptr, cache_ptr, q_stride, k_stride, cache_stride, n_q_heads, n_k_heads,
                      head_size, half, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    tok = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + tok).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    cos = tl.load(cache_ptr + pos * cache_stride + d, mask=d < half, other=0.0).to(tl.float32)[None, :]
    sin = tl.load(cache_ptr + pos * cache_stride + half + d, mask=d < half, other=0.0).to(tl.float32)[None, :]
    _rotate_heads(q_ptr, q_stride, n_q_heads, tok, head_size, half, cos, sin, BLOCK_H, BLOCK_D)
    _rotate_heads(k_ptr, k_stride, n_k_heads, tok, head_size, half, cos, sin, BLOCK_H, BLOCK_D)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x as 2-D rows with unit column stride (a view where it can be)."""
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """RMSNorm of x (and of x + residual, which is then written to residual): forward_native's math."""
    import torch

    rows = _rows(x)
    n_rows, n_cols = rows.shape
    out = torch.empty_like(rows)
    res = rows if residual is None else residual.view(-1, n_cols)  # contiguous: written in place
    if n_rows:
        _rms_norm_kernel[(n_rows,)](rows, res, weight, out, n_cols, rows.stride(0), res.stride(0), out.stride(0),
                                    eps, HAS_RESIDUAL=residual is not None, BLOCK=triton.next_power_of_2(n_cols))
    out = out.view(x.shape)
    return out if residual is None else (out, residual)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """silu(x[..., :d]) * x[..., d:] with d = half the last dimension."""
    import torch

    rows = _rows(x)
    n_rows, d = rows.shape[0], rows.shape[1] // 2
    out = torch.empty((n_rows, d), dtype=x.dtype, device=x.device)
    block = min(1024, triton.next_power_of_2(d))
    if n_rows:
        _silu_and_mul_kernel[(n_rows, triton.cdiv(d, block))](rows, out, d, rows.stride(0), out.stride(0), BLOCK=block)
    return out.view(*x.shape[:-1], d)


def rope_neox_(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, head_size: int, rotary_dim: int,
               cos_sin_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Neox-style rotary embedding of q and k in place (their first rotary_dim of each head)."""
    n = positions.numel()
    q2, k2 = q.view(n, -1), k.view(n, -1)
    if q2.stride(-1) != 1 or k2.stride(-1) != 1 or cos_sin_cache.stride(-1) != 1:
        raise ValueError("rope_neox_: q, k and the cache need unit stride in their last dimension")
    n_q, n_k, half = q2.shape[1] // head_size, k2.shape[1] // head_size, rotary_dim // 2
    if n:
        _rope_neox_kernel[(n,)](positions.view(-1), q2, k2, cos_sin_cache, q2.stride(0), k2.stride(0),
                                cos_sin_cache.stride(0), n_q, n_k, head_size, half,
                                BLOCK_H=triton.next_power_of_2(max(n_q, n_k)), BLOCK_D=triton.next_power_of_2(half))
    return q, k


def _rms_norm_forward(op) -> Callable:
    def forward(x, residual=None, post_residual_addition=None):
        if (post_residual_addition is not None or op.variance_size_override is not None or op.fp32_residual
                or op.cast_x_before_out_mul or op.override_orig_dtype
                or (residual is not None and not residual.is_contiguous())):
            return op.forward_native(x, residual, post_residual_addition)
        if x.numel() == 0:
            return x if residual is None else (x, residual)
        return rms_norm(x, op.weight, op.variance_epsilon, residual)
    return forward


def _rope_forward(op) -> Callable:
    def forward(positions, query, key, offsets=None, fused_set_kv_buffer_arg=None):
        if offsets is not None or fused_set_kv_buffer_arg is not None or not op.is_neox_style:
            return op.forward_native(positions, query, key, offsets, fused_set_kv_buffer_arg)
        return rope_neox_(positions, query, key, op.head_size, op.rotary_dim, op.cos_sin_cache)
    return forward


def layer_forward(op) -> Callable | None:
    """The fused body for this SGLang op, or None where it keeps its torch body.  Called from
    MultiPlatformOp.__init__, before the op's own attributes exist: the bodies read them per call
    and take the torch body for any case they do not cover."""
    name = type(op).__name__
    if name == "RMSNorm":
        return _rms_norm_forward(op)
    if name == "SiluAndMul":
        return silu_and_mul
    if name in ("RotaryEmbedding", "Llama3RotaryEmbedding"):
        return _rope_forward(op)
    return None
