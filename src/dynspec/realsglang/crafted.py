"""Real-shaped models whose EAGLE-3 draft is right at a chosen rate: speculation that can pay.

Weights decide acceptance, not cost: a target with a preset's shapes (Llama-3.1-8B: 32 layers,
hidden 4096, the full 128256-token vocabulary, bf16) costs per step what the real model costs,
whatever its weights.  These are constructed so that

* the target's greedy output follows a planted map g, x -> g(x), one cycle through each class of
  the `active` tokens (ids first_id.., equal contiguous ranges), so a request stays in the class
  its prompt ends in.  Active embeddings are orthogonal; the attention and MLP layers are random
  at full size (they cost what trained ones do) with outputs scaled by `sigma`, too weak to move
  the output off g;
* the draft head (draft_head, reading its input token itself) proposes g(input) for a share p
  of a class's tokens, chosen at random along the cycle, and another token of the class for the
  rest: each draft position is right with probability p, so a chain of n draft steps accepts
  1 + p + ... + p^n tokens a step, whatever the batch.

Built where it runs (`--device cuda`: seconds on one GPU), written one shard at a time: no
weights travel.  `crafted.json` beside the models holds the construction and the accept
lengths it predicts; the prompt classes are what a sweep config's `prompts.id_ranges` takes.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

from dynspec.calibrate.model_shapes import PRESETS, ModelDims
from dynspec.realsglang.draft_head import draft_tensors, slow_dims


class CraftError(ValueError):
    """A construction that cannot be built; the message is one line."""


@dataclass(frozen=True)
class Crafted:
    dims: ModelDims
    accuracy: tuple[float, ...] = (0.6,)  # per class: the share of draft positions that are right
    active: int = 4096  # at most the hidden size (orthogonal embeddings)
    first_id: int = 1000  # below it tokenizers keep their special tokens
    draft_vocab: int = 32000  # as a released EAGLE-3 head for Llama-3.1-8B; ids are the target's
    sigma: float = 0.05
    steps: int = 3  # the draft chain the predicted accept length is for (--speculative-num-steps)
    seed: int = 0
    match_logit: float = 40.0  # attention logit of the matching key: far above the others

    def __post_init__(self) -> None:
        d = self.dims
        if not self.accuracy or not all(0.0 <= p <= 1.0 for p in self.accuracy):
            raise CraftError("--draft-accuracy: each class's accuracy is in [0, 1], e.g. 0.6 or 0.9,0.3")
        if not 0 < self.active <= d.hidden:
            raise CraftError(f"active tokens: 1..{d.hidden} (the hidden size) for orthogonal embeddings")
        if self.active % len(self.accuracy) or self.active // len(self.accuracy) < 3:
            raise CraftError(f"{self.active} active tokens do not split into {len(self.accuracy)} classes of 3 or more")
        if self.first_id < 3 or self.first_id + self.active > min(d.vocab, self.draft_vocab):
            raise CraftError(f"active ids {self.first_id}..{self.first_id + self.active - 1} must lie in 3..{min(d.vocab, self.draft_vocab) - 1}")
        if d.kv_heads < 2 or d.kv_heads % 2 or d.head_dim % 4:
            raise CraftError("the draft head needs an even number (>= 2) of KV heads and head_dim % 4 == 0")

    def classes(self) -> list[dict]:
        """Each class: its token ids [lo, hi), draft accuracy and predicted accept length."""
        n = self.active // len(self.accuracy)
        return [{"lo": self.first_id + k * n, "hi": self.first_id + (k + 1) * n, "accuracy": p,
                 "accept_length": accept_length(p, self.steps)} for k, p in enumerate(self.accuracy)]


def accept_length(p: float, steps: int) -> float:
    """Tokens per speculative step when each draft position is right with probability p."""
    return sum(p ** i for i in range(steps + 1))


def parse_accuracy(text: str) -> tuple[float, ...]:
    try:
        vals = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise CraftError(f"--draft-accuracy {text!r}: a number in [0, 1] per class, e.g. 0.6 or 0.9,0.3") from None
    if not vals or not all(math.isfinite(v) and 0.0 <= v <= 1.0 for v in vals):
        raise CraftError(f"--draft-accuracy {text!r}: a number in [0, 1] per class, e.g. 0.6 or 0.9,0.3")
    return vals


def _maps(c: Crafted, gen):
    """g (one cycle per class), its inverse and the draft's proposal, over active indices."""
    import torch

    n = c.active // len(c.accuracy)
    g = torch.empty(c.active, dtype=torch.long)
    propose = torch.empty(c.active, dtype=torch.long)
    for k, p in enumerate(c.accuracy):
        order = torch.randperm(n, generator=gen) + k * n  # the cycle, in order
        g[order] = order.roll(-1)
        right = round(p * n)
        if n - right == 1:  # a lone wrong token has no other class token's row to take
            right = n if p > 0.5 else n - 2
        members = torch.randperm(n, generator=gen) + k * n
        propose[members[:right]] = g[members[:right]]
        wrong = members[right:]
        propose[wrong] = g[wrong.roll(-1)]  # a cyclic shift: every proposal row used once
    ginv = torch.argsort(g)
    return g, ginv, propose


def build(c: Crafted, device: str = "cpu"):
    """(target tensors as (name, tensor) pairs in layer order, draft tensors, g): float32 on
    device; the target's pairs are yielded lazily so a large model is never whole in memory."""
    import torch

    d = c.dims
    H, dh = d.hidden, d.head_dim
    gen = torch.Generator().manual_seed(c.seed)  # maps and small matrices: the same on every device
    g, ginv, propose = _maps(c, gen)
    Q, _ = torch.linalg.qr(torch.randn(H, H, generator=gen))
    E = (Q[:c.active] * H ** 0.5).to(device)
    slow = slow_dims(dh)
    K = torch.zeros(dh, c.active)
    K[slow] = torch.randn(len(slow), H, generator=gen) @ E.cpu().T / H
    K = (K / K[slow].norm(dim=0).mean() * (c.match_logit * dh ** 0.5) ** 0.5).to(device)
    pairs = d.kv_heads // 2
    P = [(torch.randn(dh, H, generator=gen) / H ** 0.5).to(device) for _ in range(pairs)]
    B, _ = torch.linalg.qr(torch.randn(H, dh * pairs, generator=gen))
    # The head reads the input token itself (draft_head): its proposals are right wherever they
    # are meant to be, whatever the draft KV cache holds before the current position.
    draft = draft_tensors(E, (None, None), (None, ginv.to(device)), propose, K, P, B.to(device), heads=d.heads,
                          kv_heads=d.kv_heads, intermediate=d.intermediate, vocab_rows=c.draft_vocab,
                          first_id=c.first_id)
    return _target(c, E, g, device), draft, g


def _target(c: Crafted, E, g, device: str):
    import torch

    d = c.dims
    H, dh, I = d.hidden, d.head_dim, d.intermediate
    layer_gen = torch.Generator(device=device).manual_seed(c.seed + 1)

    def randn(*shape, scale: float = 1.0):
        return torch.randn(*shape, generator=layer_gen, device=device) * scale

    embed = randn(d.vocab, H)  # inactive tokens: random, never generated
    embed[c.first_id:c.first_id + c.active] = E
    head = torch.zeros(d.vocab, H, device=device)
    head[g.to(device) + c.first_id] = E / H ** 0.5  # row g(x) is E_x: a stream near E_x scores g(x)
    yield "model.embed_tokens.weight", embed
    yield "lm_head.weight", head
    yield "model.norm.weight", torch.ones(H, device=device)
    for i in range(d.layers):
        p = f"model.layers.{i}."
        yield p + "input_layernorm.weight", torch.ones(H, device=device)
        yield p + "post_attention_layernorm.weight", torch.ones(H, device=device)
        yield p + "self_attn.q_proj.weight", randn(d.heads * dh, H, scale=H ** -0.5)
        yield p + "self_attn.k_proj.weight", randn(d.kv_heads * dh, H, scale=H ** -0.5)
        yield p + "self_attn.v_proj.weight", randn(d.kv_heads * dh, H, scale=H ** -0.5)
        yield p + "self_attn.o_proj.weight", randn(H, d.heads * dh, scale=c.sigma * (d.heads * dh) ** -0.5)
        yield p + "mlp.gate_proj.weight", randn(I, H, scale=H ** -0.5)
        yield p + "mlp.up_proj.weight", randn(I, H, scale=H ** -0.5)
        yield p + "mlp.down_proj.weight", randn(H, I, scale=c.sigma * I ** -0.5)


def _config(c: Crafted, dtype: str, **over) -> dict:
    d = c.dims
    cfg = dict(vocab_size=d.vocab, hidden_size=d.hidden, intermediate_size=d.intermediate,
               num_attention_heads=d.heads, num_key_value_heads=d.kv_heads, head_dim=d.head_dim,
               max_position_embeddings=8192, rms_norm_eps=d.norm_eps, rope_theta=d.rope_theta,
               hidden_act="silu", bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
               torch_dtype=dtype, model_type="llama")
    cfg.update(over)
    return cfg


def write(out: str | Path, c: Crafted, *, device: str = "cpu", dtype: str = "bfloat16",
          shard_bytes: int = 2 << 30) -> tuple[Path, Path]:
    """out/target and out/draft (configs, tokenizer, safetensors shards) and out/crafted.json."""
    import torch
    from safetensors.torch import save_file

    from dynspec.realsglang.tinymodels import tokenizer_files

    out = Path(out)
    target, draft = out / "target", out / "draft"
    for folder in (target, draft):
        folder.mkdir(parents=True, exist_ok=True)
        tokenizer_files(folder, c.dims.vocab)
    cast = getattr(torch, dtype)
    tensors, head_tensors, g = build(c, device)
    index: dict[str, str] = {}  # tensor name -> its shard file
    shard: dict[str, torch.Tensor] = {}
    size, n = 0, 0

    def flush():
        nonlocal shard, size, n
        if shard:
            name = f"model-{n:05d}.safetensors"
            save_file(shard, str(target / name))
            index.update({k: name for k in shard})
            shard, size, n = {}, 0, n + 1

    for name, t in tensors:
        t = t.to(cast).contiguous().cpu()
        shard[name] = t
        size += t.numel() * t.element_size()
        if size >= shard_bytes:
            flush()
    flush()
    (target / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": index}, indent=1))
    save_file({k: v.to(cast).contiguous().cpu() for k, v in head_tensors.items()}, str(draft / "model.safetensors"))
    d = c.dims
    (target / "config.json").write_text(json.dumps(
        _config(c, dtype, architectures=["LlamaForCausalLM"], num_hidden_layers=d.layers), indent=1))
    (draft / "config.json").write_text(json.dumps(
        _config(c, dtype, architectures=["LlamaForCausalLMEagle3"], num_hidden_layers=1,
                draft_vocab_size=c.draft_vocab, target_hidden_size=d.hidden), indent=1))
    meta = {**asdict(c), "dims": asdict(d), "dtype": dtype, "classes": c.classes()}
    (out / "crafted.json").write_text(json.dumps(meta, indent=1))
    torch.save(g, out / "cycle.pt")
    return target, draft


def crafted(preset: str, accuracy: str, **kw) -> Crafted:
    if preset not in PRESETS:
        raise CraftError(f"--crafted {preset!r}: one of {', '.join(sorted(PRESETS))}")
    return Crafted(PRESETS[preset], parse_accuracy(accuracy), **kw)


def small_dims(layers: int = 8) -> ModelDims:
    """A shape a 2-core CPU serves: the construction at reduced width and depth."""
    return ModelDims(hidden=256, layers=layers, heads=4, kv_heads=2, intermediate=512, vocab=2048,
                     rope_theta=500000.0)



def _rope(x, positions, theta: float):
    """Neox-style rotary embedding of x [n, heads, d] at integer positions [n] (as SGLang's Llama)."""
    import torch

    half = x.shape[-1] // 2
    freqs = theta ** (-torch.arange(half, dtype=torch.float64) * 2 / x.shape[-1])
    ang = positions[:, None].double() * freqs[None]
    cos, sin = torch.cos(ang)[:, None].to(x.dtype), torch.sin(ang)[:, None].to(x.dtype)
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)


def draft_proposals(models: str | Path, tokens: list[int]) -> list[int]:
    """What the draft head proposes at each position of `tokens` in one extend pass (a reference
    of SGLang's LlamaForCausalLMEagle3 forward in plain torch, float32, the target's hidden
    input left out as the head's fc is zero): proposal p is its guess for the token after
    tokens[p]."""
    import torch
    from safetensors.torch import load_file

    models = Path(models)
    cfg = json.loads((models / "draft" / "config.json").read_text())
    W = {k: v.float() for k, v in load_file(str(models / "draft" / "model.safetensors")).items()}
    embed = _target_tensor(models / "target", "model.embed_tokens.weight").float()
    nh, nkv, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps = cfg["rms_norm_eps"]

    def norm(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

    ids = torch.tensor(tokens)
    n, H = len(tokens), embed.shape[1]
    x = torch.cat([norm(embed[ids], W["midlayer.input_layernorm.weight"]), torch.zeros(n, H)], dim=-1)
    pos = torch.arange(n)
    q = _rope((x @ W["midlayer.self_attn.q_proj.weight"].T).view(n, nh, d), pos, cfg["rope_theta"])
    k = _rope((x @ W["midlayer.self_attn.k_proj.weight"].T).view(n, nkv, d), pos, cfg["rope_theta"])
    v = (x @ W["midlayer.self_attn.v_proj.weight"].T).view(n, nkv, d)
    k, v = k.repeat_interleave(nh // nkv, dim=1), v.repeat_interleave(nh // nkv, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) / d ** 0.5
    scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    attn = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(n, nh * d)
    h = attn @ W["midlayer.self_attn.o_proj.weight"].T  # the residual (fc of the hidden) is 0, the MLP 0
    return (norm(h, W["norm.weight"]) @ W["lm_head.weight"].T).argmax(-1).tolist()


def _target_tensor(folder: Path, name: str):
    from safetensors.torch import load_file

    index = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    return load_file(str(folder / index[name]))[name]


def draft_accuracy(models: str | Path, start: int, length: int) -> float:
    """Share of draft positions right along `length` steps of the cycle from token `start`: each
    position's guess (one extend pass, draft_proposals) against the next token on the cycle."""
    import torch

    g = torch.load(Path(models) / "cycle.pt")
    first = json.loads((Path(models) / "crafted.json").read_text())["first_id"]
    seq = [start]
    for _ in range(length):
        seq.append(int(g[seq[-1] - first]) + first)
    prop = draft_proposals(models, seq[:-1])
    return sum(p == t for p, t in zip(prop, seq[1:])) / length
