"""A Llama-style decoder and an EAGLE-3 draft head with random weights, in plain torch: what
`dynspec calibrate` times.

RMSNorm, RoPE, GQA attention over a preallocated KV cache (the query heads of one kv head
grouped into rows of one query block, as decode kernels do, through scaled_dot_product_attention),
SwiGLU MLP, lm_head; the draft head fuses three target hidden states with an fc and runs its
decoder layer(s) over [embedding, hidden], or (`catch_up`) writes only its K/V for new tokens.  `StepSet` holds the static inputs and outputs of
every piece of a step at one batch size, so each piece can be captured in a CUDA graph.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from dynspec.calibrate.model_shapes import ModelDims


def rms_norm(x, w, eps: float):
    xf = x.float() if x.element_size() < 4 else x  # half precision: the statistics in float32
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


class Rope:
    """cos/sin tables for every position (Llama-3.1's frequency scaling left out: same cost)."""

    def __init__(self, dims: ModelDims, max_len: int, dtype, device):
        d = dims.head_dim
        inv = dims.rope_theta ** (-torch.arange(0, d, 2, device=device, dtype=torch.float64) / d)
        ang = torch.outer(torch.arange(max_len, device=device, dtype=torch.float64), inv)
        ang = torch.cat([ang, ang], -1)
        self.cos, self.sin = ang.cos().to(dtype), ang.sin().to(dtype)

    def apply(self, x, pos: int):  # x [B, T, heads, D]
        t = x.shape[1]
        c, s = self.cos[pos:pos + t, None, :], self.sin[pos:pos + t, None, :]
        x1, x2 = x.chunk(2, -1)
        return x * c + torch.cat([-x2, x1], -1) * s


_MASKS: dict = {}


def _verify_mask(group: int, t: int, pos: int, s: int, dtype, device):
    # Row g*t + i is query i (position pos+i) of the g-th head sharing a kv head: it sees keys 0..pos+i.
    # Additive and in the query's dtype, made once, so no step converts a boolean mask.
    key = (group, t, pos, s, dtype, str(device))
    if key not in _MASKS:
        qpos = pos + torch.arange(t, device=device).repeat(group)
        allowed = torch.arange(s, device=device)[None, :] <= qpos[:, None]
        _MASKS[key] = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill(~allowed, float("-inf"))
    return _MASKS[key]


def attend(q, k, v, pos: int):
    """Causal GQA attention of q [B, T, heads, D] at positions pos.. over cached k, v [B, kv, pos+T, D]."""
    b, t, h, d = q.shape
    kv, s = k.shape[1], k.shape[2]
    g = h // kv
    if s != pos + t:
        raise ValueError(f"attend: {s} cached keys for queries at {pos}..{pos + t - 1}")
    if pos == 0 and t > 1:
        # A prefill: queries and keys aligned, so SDPA's causal flag is right; repeating kv heads
        # costs little next to the prefill's matmuls.
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.repeat_interleave(g, 1),
                                             v.repeat_interleave(g, 1), is_causal=True)
        return out.transpose(1, 2)
    # Decode and verify: the g query heads sharing a kv head become g*t query rows of one head, so
    # each cached kv head is read once (as decode kernels do), with no repeat of the cache.
    qg = q.view(b, t, kv, g, d).permute(0, 2, 3, 1, 4).reshape(b, kv, g * t, d)
    mask = None if t == 1 else _verify_mask(g, t, pos, s, q.dtype, q.device)
    out = F.scaled_dot_product_attention(qg, k, v, attn_mask=mask)
    return out.view(b, kv, g, t, d).permute(0, 3, 1, 2, 4).reshape(b, t, h, d)


class KVCache:
    """One contiguous [batch, kv_heads, max_len, head_dim] tensor per layer for k and for v."""

    def __init__(self, k: list, v: list):
        self.k, self.v = k, v

    @classmethod
    def empty(cls, n_layers: int, dims: ModelDims, batch: int, max_len: int, dtype, device) -> KVCache:
        shape = (batch, dims.kv_heads, max_len, dims.head_dim)
        return cls([torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)],
                   [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)])

    def batch(self, b: int) -> KVCache:
        return KVCache([k[:b] for k in self.k], [v[:b] for v in self.v])

    def fill_random(self, gen) -> None:
        # Decode reads the whole context: its values don't matter, but they must not be zeros.
        for t in self.k + self.v:
            t.normal_(generator=gen)


def _rand(gen, shape, scale: float, dtype, device):
    return (torch.randn(shape, generator=gen, device=device) * scale).to(dtype)


def _norm_weight(gen, n: int, dtype, device):
    return (1.0 + 0.1 * torch.randn(n, generator=gen, device=device)).to(dtype)


class Layer:
    """One Llama decoder layer's weights: fused qkv and gate/up projections, as serving engines load them."""

    def __init__(self, dims: ModelDims, in_dim: int, gen, dtype, device):
        d, hd = dims, dims.head_dim
        self.dims = dims
        self.ln_attn = _norm_weight(gen, d.hidden, dtype, device)
        self.wqkv = _rand(gen, ((d.heads + 2 * d.kv_heads) * hd, in_dim), in_dim ** -0.5, dtype, device)
        self.wo = _rand(gen, (d.hidden, d.heads * hd), (d.heads * hd) ** -0.5, dtype, device)
        self.ln_mlp = _norm_weight(gen, d.hidden, dtype, device)
        self.w13 = _rand(gen, (2 * d.intermediate, d.hidden), d.hidden ** -0.5, dtype, device)
        self.w2 = _rand(gen, (d.hidden, d.intermediate), d.intermediate ** -0.5, dtype, device)

    def attention(self, x, k_cache, v_cache, pos: int, rope: Rope):
        """Self-attention of the normed input x [B, T, in_dim] at positions pos..; writes k, v to the cache."""
        d = self.dims
        b, t, _ = x.shape
        q, k, v = F.linear(x, self.wqkv).split([d.heads * d.head_dim, d.kv_heads * d.head_dim,
                                                 d.kv_heads * d.head_dim], -1)
        q = rope.apply(q.view(b, t, d.heads, d.head_dim), pos)
        self._store_kv(k, v, k_cache, v_cache, pos, rope)
        out = attend(q, k_cache[:, :, :pos + t], v_cache[:, :, :pos + t], pos)
        return F.linear(out.reshape(b, t, d.heads * d.head_dim), self.wo)

    def write_kv(self, x, k_cache, v_cache, pos: int, rope: Rope) -> None:
        """Only the cache write of `attention`: the K/V rows of the qkv projection (a contiguous
        slice of its weight), RoPE on K, the write at pos..; no query, attention or output."""
        d = self.dims
        k, v = F.linear(x, self.wqkv[d.heads * d.head_dim:]).split(d.kv_heads * d.head_dim, -1)
        self._store_kv(k, v, k_cache, v_cache, pos, rope)

    def _store_kv(self, k, v, k_cache, v_cache, pos: int, rope: Rope) -> None:
        d = self.dims
        b, t, _ = k.shape
        k_cache[:, :, pos:pos + t] = rope.apply(k.view(b, t, d.kv_heads, d.head_dim), pos).transpose(1, 2)
        v_cache[:, :, pos:pos + t] = v.view(b, t, d.kv_heads, d.head_dim).transpose(1, 2)

    def mlp(self, x):
        gate, up = F.linear(x, self.w13).chunk(2, -1)
        return F.linear(F.silu(gate) * up, self.w2)


class TargetModel:
    """A Llama-style decoder with random weights: the target of speculative decoding."""

    def __init__(self, dims: ModelDims, dtype, device, max_len: int, seed: int = 0):
        gen = torch.Generator(device=device).manual_seed(seed)
        self.dims, self.dtype, self.device = dims, dtype, device
        self.embed = _rand(gen, (dims.vocab, dims.hidden), 1.0, dtype, device)
        self.layers = [Layer(dims, dims.hidden, gen, dtype, device) for _ in range(dims.layers)]
        self.norm = _norm_weight(gen, dims.hidden, dtype, device)
        self.lm_head = _rand(gen, (dims.vocab, dims.hidden), dims.hidden ** -0.5, dtype, device)
        self.rope = Rope(dims, max_len, dtype, device)

    def new_cache(self, batch: int, max_len: int) -> KVCache:
        return KVCache.empty(self.dims.layers, self.dims, batch, max_len, self.dtype, self.device)

    def forward(self, tokens, cache: KVCache, pos: int, aux: bool = False):
        """tokens [B, T] at positions pos..pos+T-1 -> (final normed hidden [B, T, H], EAGLE-3 aux states)."""
        x = F.embedding(tokens, self.embed)
        captured = {}
        for i, layer in enumerate(self.layers):
            if aux and i in self.dims.aux_layers:
                captured[i] = x
            x = x + layer.attention(rms_norm(x, layer.ln_attn, self.dims.norm_eps), cache.k[i], cache.v[i],
                                    pos, self.rope)
            x = x + layer.mlp(rms_norm(x, layer.ln_mlp, self.dims.norm_eps))
        aux_states = [captured[i] for i in self.dims.aux_layers] if aux else None
        return rms_norm(x, self.norm, self.dims.norm_eps), aux_states

    def logits(self, h):
        return F.linear(h, self.lm_head)


class DraftHead:
    """EAGLE-3's draft model: fc(3 target hidden states) + a decoder layer over [embedding, hidden]
    (+ more plain decoder layers when asked for) + a smaller-vocabulary lm_head."""

    def __init__(self, target: TargetModel, draft_vocab: int, seed: int = 1, layers: int = 1):
        dims, dtype, device = target.dims, target.dtype, target.device
        gen = torch.Generator(device=device).manual_seed(seed)
        self.dims, self.dtype, self.device, self.rope = dims, dtype, device, target.rope
        self.embed = target.embed  # EAGLE-3 heads reuse the target's embedding
        self.fc = _rand(gen, (dims.hidden, 3 * dims.hidden), (3 * dims.hidden) ** -0.5, dtype, device)
        self.ln_hidden = _norm_weight(gen, dims.hidden, dtype, device)
        self.layer = Layer(dims, 2 * dims.hidden, gen, dtype, device)  # its qkv reads [embedding, hidden]
        self.more = [Layer(dims, dims.hidden, gen, dtype, device) for _ in range(layers - 1)]
        self.norm = _norm_weight(gen, dims.hidden, dtype, device)
        self.lm_head = _rand(gen, (draft_vocab, dims.hidden), dims.hidden ** -0.5, dtype, device)
        # The draft vocabulary's target token ids (SGLang's hot-token map).
        self.hot_ids = torch.randperm(dims.vocab, generator=gen, device=device)[:draft_vocab]

    @property
    def n_layers(self) -> int:
        return 1 + len(self.more)

    def new_cache(self, batch: int, max_len: int) -> KVCache:
        return KVCache.empty(self.n_layers, self.dims, batch, max_len, self.dtype, self.device)

    def _layer_input(self, tokens, hidden):
        """(fc'd hidden [B, T, H], the first layer's input [embedding, hidden], each normed)."""
        eps = self.dims.norm_eps
        if hidden.shape[-1] != self.dims.hidden:
            hidden = F.linear(hidden, self.fc)
        return hidden, torch.cat([rms_norm(F.embedding(tokens, self.embed), self.layer.ln_attn, eps),
                                  rms_norm(hidden, self.ln_hidden, eps)], -1)

    def forward(self, tokens, hidden, cache: KVCache, pos: int):
        """tokens [B, T], hidden [B, T, 3H] (target's) or [B, T, H] (own) -> (normed, pre-norm hidden)."""
        eps = self.dims.norm_eps
        hidden, x = self._layer_input(tokens, hidden)
        r = hidden + self.layer.attention(x, cache.k[0], cache.v[0], pos, self.rope)
        out = r + self.layer.mlp(rms_norm(r, self.layer.ln_mlp, eps))
        for i, layer in enumerate(self.more, 1):
            out = out + layer.attention(rms_norm(out, layer.ln_attn, eps), cache.k[i], cache.v[i], pos, self.rope)
            out = out + layer.mlp(rms_norm(out, layer.ln_mlp, eps))
        return rms_norm(out, self.norm, eps), out

    def logits(self, h):
        return F.linear(h, self.lm_head)

    def catch_up(self, tokens, hidden3, cache: KVCache, pos: int) -> None:
        """KV-only catch-up: the draft cache entries a full forward of tokens [B, T] with the target's
        aux states hidden3 [B, T, 3H] would write at pos.., and nothing else (embed, fc, norms, K/V
        projection, RoPE, write).  A deeper head's later layers read the first layer's attention
        output, so there it is the full forward."""
        if self.more:
            self.forward(tokens, hidden3, cache, pos)
            return
        _, x = self._layer_input(tokens, hidden3)
        self.layer.write_kv(x, cache.k[0], cache.v[0], pos, self.rope)


class StepSet:
    """The pieces of one speculative step, and target forwards of q tokens, at one batch size.

    Inputs and outputs are static tensors and positions are fixed (the context length), so
    every method can be captured in a CUDA graph and replayed: each replay rewrites the same
    cache slots.
    """

    def __init__(self, target: TargetModel, draft: DraftHead, tcache: KVCache, dcache: KVCache,
                 bs: int, context_len: int, num_steps: int, seed: int = 2, max_q: int = 1,
                 catch_up_window: int = 1):
        dev, dims = target.device, target.dims
        gen = torch.Generator(device=dev).manual_seed(seed)
        t = num_steps + 1
        self.target, self.draft, self.bs, self.ctx, self.num_steps = target, draft, bs, context_len, num_steps
        self.tcache, self.dcache = tcache.batch(bs), dcache.batch(bs)
        self.rows = torch.arange(bs, device=dev)
        self.tok1 = torch.randint(0, dims.vocab, (bs, 1), generator=gen, device=dev)
        self.tokens = torch.randint(0, dims.vocab, (bs, t), generator=gen, device=dev)  # last token + drafts
        self.tok_q = torch.randint(0, dims.vocab, (bs, max(max_q, 1)), generator=gen, device=dev)
        self.hidden1 = torch.randn((bs, 1, dims.hidden), generator=gen, device=dev).to(target.dtype)
        self.aux = torch.randn((bs, t, 3 * dims.hidden), generator=gen, device=dev).to(target.dtype)
        self.last_accepted = torch.randint(0, t, (bs,), generator=gen, device=dev)
        self.out_token = torch.zeros(bs, dtype=torch.long, device=dev)
        self.out_q = torch.zeros((bs, max(max_q, 1)), dtype=torch.long, device=dev)
        self.out_accept = torch.zeros(bs, dtype=torch.long, device=dev)
        self.out_aux = torch.zeros_like(self.aux)
        self.out_drafts = torch.zeros((bs, max(num_steps - 1, 1)), dtype=torch.long, device=dev)
        self.out_hidden = torch.zeros((bs, dims.hidden), dtype=target.dtype, device=dev)
        # The last token's aux states, kept per request (drawn last: the other inputs stay as they were).
        # Contiguous as the patch's per-slot buffer: a strided [bs, 1, 3H] view of `aux` made the fc's
        # GEMM 60x slower at batch 256 on an H200 (2.76 against 0.044 ms).
        self.aux1 = torch.randn((bs, 1, 3 * dims.hidden), generator=gen, device=dev).to(target.dtype)
        # The window of plain steps whose catch-up is written in one pass (drawn after the rest).
        self.window = catch_up_window
        self.tok_w = torch.randint(0, dims.vocab, (bs, catch_up_window), generator=gen, device=dev)
        self.aux_w = torch.zeros((bs, catch_up_window, 3 * dims.hidden), dtype=target.dtype, device=dev)

    def plain(self) -> None:
        h, _ = self.target.forward(self.tok1, self.tcache, self.ctx)
        self.out_token.copy_(self.target.logits(h)[:, -1].argmax(-1))

    def forward_fn(self, q: int) -> Callable[[], None]:
        """The target's forward of q tokens per request + greedy argmax at each (q = 1: the plain step)."""
        if q == 1:
            return self.plain

        def forward() -> None:
            h, _ = self.target.forward(self.tok_q[:, :q], self.tcache, self.ctx)
            self.out_q[:, :q].copy_(self.target.logits(h).argmax(-1))
        return forward

    def verify(self) -> None:
        h, aux = self.target.forward(self.tokens, self.tcache, self.ctx, aux=True)
        choice = self.target.logits(h).argmax(-1)  # the target's token after each position
        # A draft is accepted while every draft before it matched the target's choice.
        matched = (self.tokens[:, 1:] == choice[:, :-1]).long().cumprod(-1)
        self.out_accept.copy_(matched.sum(-1) + 1)
        self.out_aux.copy_(torch.cat(aux, -1))  # the draft-extend's input

    def draft_chain(self) -> None:
        tok, hid = self.tok1, self.hidden1
        for i in range(self.num_steps - 1):
            hn, hid = self.draft.forward(tok, hid, self.dcache, self.ctx + 1 + i)
            top = torch.softmax(self.draft.logits(hn).float(), -1).argmax(-1)  # topk 1
            tok = self.draft.hot_ids[top]
            self.out_drafts[:, i:i + 1].copy_(tok)

    def catchup(self) -> None:
        """A window of a switching server's plain steps' draft work: each step copies its one new
        token's aux states aside (the patch's ring), then the KV-only catch-up of the whole window
        runs at once, at the context.  With a window of 1 that is one step's catch-up."""
        if self.window == 1:
            self.draft.catch_up(self.tok1, self.aux1, self.dcache, self.ctx)
            return
        for i in range(self.window):
            self.aux_w[:, i].copy_(self.aux1[:, 0])
        self.draft.catch_up(self.tok_w, self.aux_w, self.dcache, self.ctx)

    def resume(self) -> None:
        """The first speculative step after plain steps: one full 1-token draft forward at the
        last position (attention over the context, MLP, norm, LM head) + top-1, the state a
        speculative step that accepted nothing would have left."""
        hn, hid = self.draft.forward(self.tok1, self.aux1, self.dcache, self.ctx)
        top = torch.softmax(self.draft.logits(hn)[:, -1].float(), -1).argmax(-1)
        self.out_token.copy_(self.draft.hot_ids[top])
        self.out_hidden.copy_(hid[:, -1])

    def extend(self) -> None:
        hn, hid = self.draft.forward(self.tokens, self.aux, self.dcache, self.ctx)
        last = self.draft.logits(hn)[self.rows, self.last_accepted]
        self.out_token.copy_(self.draft.hot_ids[torch.softmax(last.float(), -1).argmax(-1)])
        self.out_hidden.copy_(hid[self.rows, self.last_accepted])


def fused_attention_only():
    """On CUDA, SDPA may not fall back to its unfused math kernel (it would misstate the cost)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    fused = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]
    if hasattr(SDPBackend, "CUDNN_ATTENTION"):
        fused.append(SDPBackend.CUDNN_ATTENTION)
    return sdpa_kernel(fused)



def check_attention(dims: ModelDims, dtype, device, context_len: int, queries, seed: int = 0) -> dict[int, float]:
    """Relative error of the attention as timed (fused kernels on CUDA) against a plain float32
    computation (kv heads repeated, explicit causal mask) on the same inputs, for 1 and each
    number of queries per request in `queries`."""
    gen = torch.Generator(device=device).manual_seed(seed)
    errors = {}
    for n in sorted({1, *queries}):
        q = torch.randn((2, n, dims.heads, dims.head_dim), generator=gen, device=device).to(dtype)
        k, v = (torch.randn((2, dims.kv_heads, context_len + n, dims.head_dim), generator=gen, device=device).to(dtype)
                for _ in range(2))
        if device.type == "cuda":
            with fused_attention_only():
                out = attend(q, k, v, context_len).float()
        else:
            out = attend(q, k, v, context_len).float()
        kf, vf = (x.float().repeat_interleave(dims.group, 1) for x in (k, v))
        scores = q.float().transpose(1, 2) @ kf.transpose(-1, -2) / dims.head_dim ** 0.5
        allowed = torch.arange(context_len + n, device=device)[None, :] <= (context_len + torch.arange(n, device=device))[:, None]
        ref = (scores.masked_fill(~allowed, float("-inf")).softmax(-1) @ vf).transpose(1, 2)
        errors[n] = float((out - ref).norm() / ref.norm())
    return errors
