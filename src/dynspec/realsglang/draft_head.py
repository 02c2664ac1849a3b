"""An EAGLE-3 draft head whose proposals follow from the tokens its attention finds by content.

Constructed, not trained; shared by the tiny models (tinymodels) and the Llama-shaped ones
(crafted).  The head sees `A` active tokens whose embeddings `E` are orthogonal with RMS 1.
Its attention input is [norm(embed) | norm(hidden)]; only the embed half is read:

* keys: token y's key is K[:, y], placed in the slowly turning RoPE pairs so that a match a
  few positions away is not rotated away (SGLang's draft decode steps sit one RoPE position off
  its draft extend, so offsets cannot be found by position; content can);
* the first half of the KV groups look for token `find[0][c]` (c the input token) and write
  +rep(`write[0][y]`) for the token y they find; the second half look for `find[1][c]` and write
  -rep(`write[1][y]`).  rep(y) = sum_j B_j P_j E_y, group j and its twin j + groups/2 sharing
  P_j and B_j.  Along the draft's residual stream the steps telescope: where each step adds
  rep(a_k) - rep(a_{k-1}), after any number of steps it holds rep(latest) - rep(oldest);
* the LM head maps rep(y) to row `propose[y]`.

Two ways to use it, with g the map the target follows:
* reading back (tiny models): find g^-1(c) and g^-2(c), write them as found, propose g(g(y)):
  right wherever the draft KV cache one and two positions back holds the right tokens, so
  acceptance after a plain stretch tests the draft catch-up;
* reading itself (crafted models): both halves find c itself, write c and g^-1(c), propose
  g(y): right whatever the KV cache holds before the current position.
Where propose[y] is another token, the draft is wrong there.
"""

from __future__ import annotations


def slow_dims(d: int) -> list[int]:
    """Head dims of the slowly turning RoPE pairs (neox layout: pair i is dims i and i + d/2)."""
    return list(range(d // 4, d // 2)) + list(range(d // 2 + d // 4, d))


def draft_tensors(E, find, write, propose, K, P, B, *, heads: int, kv_heads: int, intermediate: int,
                  vocab_rows: int, first_id: int = 0) -> dict:
    """The head's tensors (float32, E's device).

    E [A, H] active embeddings; find, write: two index maps [A] (or None: the identity) per half;
    propose [A] active indices; K [d, A] keys; P: kv_heads // 2 value projections [d, H];
    B [H, d * kv_heads // 2] orthonormal columns; the LM head has vocab_rows rows, active
    index y at row first_id + y."""
    import torch

    A, H = E.shape
    d = K.shape[0]
    if kv_heads < 2 or kv_heads % 2 or heads % kv_heads or len(P) != kv_heads // 2:
        raise ValueError("the draft head needs an even number of KV groups and one value projection per pair")
    dev = E.device
    Wq = torch.zeros(heads * d, 2 * H, device=dev)
    Wk = torch.zeros(kv_heads * d, 2 * H, device=dev)
    Wv = torch.zeros(kv_heads * d, 2 * H, device=dev)
    O = torch.zeros(H, heads * d, device=dev)
    per_kv, pairs = heads // kv_heads, kv_heads // 2

    def token_map(m):  # the linear map E_y -> E_m[y] (orthogonal rows of norm sqrt(H)); None: none at all
        return None if m is None else E[m].T @ E / H

    key = K @ E / H  # [d, H]: key(E_y) = K[:, y]
    queries = [(K if f is None else K[:, f]) @ E / H for f in find]
    writes = [token_map(w) for w in write]
    for j in range(kv_heads):
        half, pair = divmod(j, pairs)
        Wk[j * d:(j + 1) * d, :H] = key
        Wv[j * d:(j + 1) * d, :H] = P[pair] if writes[half] is None else P[pair] @ writes[half]
        Bj = B[:, pair * d:(pair + 1) * d]
        for h in range(j * per_kv, (j + 1) * per_kv):
            Wq[h * d:(h + 1) * d, :H] = queries[half]
            O[:, h * d:(h + 1) * d] = (1.0 if half == 0 else -1.0) * Bj / per_kv
    rep = sum(B[:, p * d:(p + 1) * d] @ P[p] @ E.T for p in range(pairs)).T  # [A, H]
    rep = rep / rep.norm(dim=-1, keepdim=True)
    D = torch.zeros(vocab_rows, H, device=dev)
    D.index_add_(0, propose.to(dev) + first_id, rep)
    I = intermediate
    return {
        "fc.weight": torch.zeros(H, 3 * H, device=dev), "lm_head.weight": D, "norm.weight": torch.ones(H, device=dev),
        "midlayer.input_layernorm.weight": torch.ones(H, device=dev),
        "midlayer.hidden_norm.weight": torch.ones(H, device=dev),
        "midlayer.post_attention_layernorm.weight": torch.ones(H, device=dev),
        "midlayer.self_attn.q_proj.weight": Wq, "midlayer.self_attn.k_proj.weight": Wk,
        "midlayer.self_attn.v_proj.weight": Wv, "midlayer.self_attn.o_proj.weight": O,
        "midlayer.mlp.gate_proj.weight": torch.zeros(I, H, device=dev),
        "midlayer.mlp.up_proj.weight": torch.zeros(I, H, device=dev),
        "midlayer.mlp.down_proj.weight": torch.zeros(H, I, device=dev),
    }
