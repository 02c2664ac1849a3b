"""EAGLE chains (topk 1) built and verified in plain torch: the bodies behind the stand-ins'
`build_tree_kernel_efficient` and `verify_tree_greedy` (SGLang 0.5.9's sgl_kernel 0.3.21 and
0.5.23's sglang-kernel 0.4.10 `*_cpu` ops take the same arguments, filled in place).

Spec v2 only runs with `--speculative-eagle-topk 1`, so the draft "tree" is a chain: draft
token k of a request follows draft token k-1.  No host synchronisation, so they also run
inside CUDA graphs.  A wider tree raises.
"""

from __future__ import annotations


def build_tree_kernel_efficient(parent_list, selected_index, verified_seq_len, tree_mask, positions,
                                retrive_index, retrive_next_token, retrive_next_sibling,
                                topk, depth, draft_token_num, tree_mask_mode):
    """Fill the verify inputs of a chain of `draft_token_num` tokens per request.

    positions: seq_len + k; retrive_index: the flat index of token k; next token: k + 1
    (-1 after the last); no siblings.  tree_mask (mode 0, full): per request, one row per
    draft token over [prefix | drafts], prefix visible, draft j visible from token k iff
    j <= k.  Mode 1 (qlen only): the draft block alone.
    """
    import torch  # lazily: dynspec modules do not import torch when imported

    if topk != 1:
        raise NotImplementedError(f"sgl_kernel stand-in: build_tree_kernel_efficient for topk={topk} "
                                  "(only chains, topk 1, as spec v2 uses)")
    n = int(draft_token_num)
    bs = verified_seq_len.numel()
    dev = verified_seq_len.device
    k = torch.arange(n, device=dev)
    seq = verified_seq_len.to(torch.int64)
    positions.view(bs, n).copy_(seq[:, None] + k)
    base = torch.arange(bs, device=dev)[:, None] * n
    retrive_index.view(bs, n).copy_(base + k)
    nxt = torch.where(k < n - 1, k + 1, torch.full_like(k, -1))
    retrive_next_token.view(bs, n).copy_(nxt.expand(bs, n))
    retrive_next_sibling.view(bs, n).fill_(-1)
    visible = (k[None, :] <= k[:, None])  # [row k, draft column j]
    mode = int(tree_mask_mode)
    if mode == 0:
        # Request b's block starts after the blocks of requests 0..b-1, each n rows of (seq + n).
        start = n * (torch.cumsum(seq, 0) - seq) + n * n * torch.arange(bs, device=dev)
        row = start[:, None] + k[None, :] * (seq[:, None] + n)              # [b, k]
        idx = row[:, :, None] + seq[:, None, None] + k[None, None, :]      # [b, k, j]
        tree_mask.index_put_((idx.reshape(-1),), visible.expand(bs, n, n).reshape(-1).to(tree_mask.dtype))
    elif mode == 1:
        tree_mask.view(bs, n, n).copy_(visible.expand(bs, n, n))
    else:
        raise NotImplementedError(f"sgl_kernel stand-in: build_tree_kernel_efficient tree_mask_mode={mode}")


def verify_tree_greedy(predicts, accept_index, accept_token_num, candidates, retrive_index,
                       retrive_next_token, retrive_next_sibling, target_predict):
    """Greedy verification of a chain: accept drafts while each equals the target's choice.

    candidates[b, 0] is the verified token, candidates[b, j] draft j; target_predict[b, j]
    is the target's next token after position j.  Draft j+1 is accepted iff drafts 1..j+1
    all match.  Writes accept_token_num[b] (accepted drafts), accept_index[b, :a+1] (flat
    indices of the kept positions, -1 after) and predicts at those positions (the target's
    tokens: the accepted drafts and the bonus token after them).
    """
    import torch

    bs, n = candidates.shape
    width = accept_index.shape[1]
    target = target_predict.reshape(bs, n).to(predicts.dtype)
    match = candidates[:, 1:].to(predicts.dtype) == target[:, :-1]
    accepted = torch.cumprod(match.to(torch.int32), dim=1).sum(dim=1)[: bs]
    accepted = torch.clamp(accepted, max=width - 1)
    accept_token_num.copy_(accepted.to(accept_token_num.dtype))
    k = torch.arange(width, device=candidates.device)
    keep = k[None, :] <= accepted[:, None]
    flat = retrive_index[:, :width].to(accept_index.dtype)
    accept_index.copy_(torch.where(keep, flat, torch.full_like(flat, -1)))
    keep_n = torch.arange(n, device=candidates.device)[None, :] <= accepted[:, None]
    pred = predicts[: bs * n].view(bs, n)  # SGLang may allocate one spare slot
    pred.copy_(torch.where(keep_n, target, pred))
