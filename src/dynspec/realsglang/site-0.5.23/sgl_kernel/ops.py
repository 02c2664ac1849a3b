"""The sglang-kernel 0.4.10 `*_cpu` ops SGLang 0.5.23 calls on a CPU for EAGLE-3 (topk 1), in torch.

SGLang 0.5.23 has a CPU path for speculative decoding whose index work is sgl_kernel's CPU
build (absent here).  Each op below fills its output arguments in place as SGLang's call site
expects (sglang/kernels/ops/speculative, sglang/srt/mem_cache/allocation.py); the chain build
and verify are dynspec.realsglang.chain_ops.
"""

from __future__ import annotations

import torch

from dynspec.realsglang.chain_ops import build_tree_kernel_efficient, verify_tree_greedy

IMPLEMENTED = ("assign_req_to_token_pool_cpu", "assign_extend_cache_locs_cpu",
               "assign_draft_cache_locs_contiguous_cpu", "fill_bonus_tokens_cpu", "fill_accept_out_cache_loc_cpu",
               "build_tree_kernel_efficient_cpu", "verify_tree_greedy_cpu")


def _segments(req_pool_indices, start, end):
    """(row, a, b) per request: the req_to_token slice [a, b) of its pool row."""
    return zip(req_pool_indices.tolist(), start.tolist(), end.tolist())


def assign_req_to_token_pool_cpu(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc,
                                 pool_len):
    """req_to_token[row, a:b] = the next b - a slots of out_cache_loc, request after request."""
    offset = 0
    for row, a, b in _segments(req_pool_indices, start_offset, end_offset):
        req_to_token[row, a:b] = out_cache_loc[offset:offset + b - a].to(req_to_token.dtype)
        offset += b - a


def assign_extend_cache_locs_cpu(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc,
                                 pool_len):
    """out_cache_loc (packed) = req_to_token[row, a:b], request after request."""
    offset = 0
    for row, a, b in _segments(req_pool_indices, start_offset, end_offset):
        out_cache_loc[offset:offset + b - a] = req_to_token[row, a:b].to(out_cache_loc.dtype)
        offset += b - a


def assign_draft_cache_locs_contiguous_cpu(req_pool_indices, req_to_token, seq_lens, out_cache_loc, pool_len,
                                           topk, num_cols):
    """Each request's topk * num_cols slots from seq_lens on, at out_cache_loc[b * topk * num_cols]."""
    n = int(topk) * int(num_cols)
    for i, (row, a) in enumerate(zip(req_pool_indices.tolist(), seq_lens.tolist())):
        out_cache_loc[i * n:(i + 1) * n] = req_to_token[row, a:a + n].to(out_cache_loc.dtype)


def fill_bonus_tokens_cpu(accept_tokens, accept_lens, bonus_tokens, accept_stride):
    """bonus_tokens[b] = the last accepted token of request b (accept_lens counts the bonus)."""
    bs = accept_lens.shape[0]
    idx = torch.arange(bs) * int(accept_stride) + accept_lens.long() - 1
    bonus_tokens[:bs] = accept_tokens.reshape(-1)[idx].to(bonus_tokens.dtype)


def fill_accept_out_cache_loc_cpu(accept_index, out_cache_loc, accept_out_cache_loc):
    """The KV slots of the kept positions (accept_index != -1), packed in order."""
    kept = accept_index.reshape(-1)
    kept = kept[kept != -1].long()
    accept_out_cache_loc[:kept.numel()] = out_cache_loc[kept].to(accept_out_cache_loc.dtype)


def build_tree_kernel_efficient_cpu(*args):
    build_tree_kernel_efficient(*args)


def verify_tree_greedy_cpu(**kwargs):
    verify_tree_greedy(**kwargs)
