"""A tiny Llama target, an EAGLE-3 draft that is often right, and a word-level tokenizer.

Made on the spot (no download), small enough for a 2-core CPU, shaped like the real thing
so that SGLang loads them with its own loaders.  The weights are constructed, not trained:

* Target (`LlamaForCausalLM`).  Token embeddings are orthogonal.  The LM head plants a random
  permutation `g` of the vocabulary: from token x it predicts g(x), unless the random attention
  and MLP layers (scaled by `sigma`) push the residual stream elsewhere.  So the next token
  depends on the context, and greedy output follows g most of the time (`follow_rate`).
* Draft (`LlamaForCausalLMEagle3`, one layer, `draft_head`): it proposes g(g(token one back)),
  right whenever the target follows g, and only if the draft KV cache one and two positions
  back is right: acceptance after a plain stretch tests the draft catch-up.

`make_models(out)` writes `out/target` and `out/draft`; `expected_follow_rate` measures g-following
with Hugging Face transformers (tests use it to check the construction, not SGLang).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from dynspec.realsglang.draft_head import draft_tensors, slow_dims

SPECIAL = ("[UNK]", "<s>", "</s>")


@dataclass(frozen=True)
class TinyShape:
    vocab_size: int = 256  # at most hidden_size: token embeddings are orthogonal
    hidden_size: int = 256
    intermediate_size: int = 512
    num_layers: int = 8  # EAGLE-3 captures layers 2, L//2 and L-3: they must differ
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 64
    rope_theta: float = 10000.0
    sigma: float = 1.7  # scale of the target's random layers: larger leaves g more often
    seed: int = 0


def _llama_config(s: TinyShape, **over) -> dict:
    cfg = dict(vocab_size=s.vocab_size, hidden_size=s.hidden_size, intermediate_size=s.intermediate_size,
               num_attention_heads=s.num_heads, num_key_value_heads=s.num_kv_heads, head_dim=s.head_dim,
               max_position_embeddings=4096, rms_norm_eps=1e-6, rope_theta=s.rope_theta, hidden_act="silu",
               bos_token_id=1, eos_token_id=2, tie_word_embeddings=False, torch_dtype="float32",
               model_type="llama")
    cfg.update(over)
    return cfg


def tokenizer_files(folder: Path, vocab_size: int) -> None:
    from dynspec.sglang.bench_serving import build_tiny_tokenizer

    build_tiny_tokenizer(folder, vocab_size, SPECIAL, pad_token="[UNK]", bos_token="<s>", eos_token="</s>",
                         model_max_length=4096)
    (folder / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))


def rope(x, position: int, theta: float):
    """Neox-style rotary embedding of the last dim of x at one position (as SGLang's Llama)."""
    import torch

    half = x.shape[-1] // 2
    freqs = theta ** (-torch.arange(half, dtype=torch.float64) * 2 / x.shape[-1])
    ang = position * freqs
    cos, sin = torch.cos(ang).to(x.dtype), torch.sin(ang).to(x.dtype)
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)


def build_weights(s: TinyShape):
    """(target tensors, draft tensors, permutation g) as float32 torch tensors."""
    import torch

    gen = torch.Generator().manual_seed(s.seed)
    V, H, I, d = s.vocab_size, s.hidden_size, s.intermediate_size, s.head_dim
    nh, nkv = s.num_heads, s.num_kv_heads
    if V > H or nkv != 2 or d % 4:
        raise ValueError("the construction needs vocab_size <= hidden_size, 2 KV heads and head_dim % 4 == 0")

    def randn(*shape):
        return torch.randn(*shape, generator=gen)

    # Orthogonal token embeddings of RMS 1: norm(E_x) = E_x, and linear maps can permute tokens exactly.
    Q, _ = torch.linalg.qr(randn(H, H))
    E = Q[:V] * H ** 0.5
    g = torch.randperm(V, generator=gen)
    ginv = torch.argsort(g)

    # Target: lm_head row g(x) is E_x, so a residual stream near E_x scores g(x) highest.
    W = torch.zeros(V, H).index_add_(0, g, E / H ** 0.5)
    T = {"model.embed_tokens.weight": E, "model.norm.weight": torch.ones(H), "lm_head.weight": W}
    for i in range(s.num_layers):
        p = f"model.layers.{i}."
        T[p + "input_layernorm.weight"] = torch.ones(H)
        T[p + "post_attention_layernorm.weight"] = torch.ones(H)
        T[p + "self_attn.q_proj.weight"] = randn(nh * d, H) / H ** 0.5
        T[p + "self_attn.k_proj.weight"] = randn(nkv * d, H) / H ** 0.5
        T[p + "self_attn.v_proj.weight"] = randn(nkv * d, H) / H ** 0.5
        T[p + "self_attn.o_proj.weight"] = randn(H, nh * d) / (nh * d) ** 0.5 * s.sigma
        T[p + "mlp.gate_proj.weight"] = randn(I, H) / H ** 0.5
        T[p + "mlp.up_proj.weight"] = randn(I, H) / H ** 0.5
        T[p + "mlp.down_proj.weight"] = randn(H, I) / I ** 0.5 * s.sigma

    # Draft (draft_head): it reads the tokens one and two steps before its input and proposes
    # g(g(token one back)), which is g(input) wherever the target followed g.
    slow = slow_dims(d)
    K = torch.zeros(d, V)
    K[slow] = randn(len(slow), H) @ E.T / H  # column y: the key of token y
    K = K / K[slow].norm(dim=0).mean() * 17.0  # |q||k| about 290 at a match: ~20 logits above the rest
    P = randn(d, H) / H ** 0.5  # values: the token projected to head_dim
    B, _ = torch.linalg.qr(randn(H, d))
    Dr = draft_tensors(E, (ginv, ginv[ginv]), (None, None), g[g], K, [P], B, heads=nh, kv_heads=nkv,
                       intermediate=I, vocab_rows=V)
    return T, Dr, g


def make_models(out: str | Path, shape: TinyShape = TinyShape(), dtype: str = "float32") -> tuple[Path, Path]:
    """Write out/target and out/draft (config, safetensors, tokenizer); return their paths."""
    import torch
    from safetensors.torch import save_file

    out = Path(out)
    target, draft = out / "target", out / "draft"
    for folder in (target, draft):
        folder.mkdir(parents=True, exist_ok=True)
        tokenizer_files(folder, shape.vocab_size)
    (target / "config.json").write_text(json.dumps(
        _llama_config(shape, architectures=["LlamaForCausalLM"], num_hidden_layers=shape.num_layers,
                      torch_dtype=dtype), indent=1))
    (draft / "config.json").write_text(json.dumps(
        _llama_config(shape, architectures=["LlamaForCausalLMEagle3"], num_hidden_layers=1,
                      draft_vocab_size=shape.vocab_size, target_hidden_size=shape.hidden_size,
                      torch_dtype=dtype), indent=1))
    T, D, g = build_weights(shape)
    cast = getattr(torch, dtype)
    save_file({k: v.to(cast).contiguous() for k, v in T.items()}, str(target / "model.safetensors"))
    save_file({k: v.to(cast).contiguous() for k, v in D.items()}, str(draft / "model.safetensors"))
    (out / "tiny-shape.json").write_text(json.dumps({**asdict(shape), "dtype": dtype}, indent=1))
    torch.save(g, out / "permutation.pt")
    return target, draft


def expected_follow_rate(models: str | Path, prompts: list[list[int]], max_new_tokens: int = 24) -> float:
    """Share of greedy target steps (Hugging Face transformers) that follow the planted g."""
    import torch
    from transformers import LlamaForCausalLM

    models = Path(models)
    g = torch.load(models / "permutation.pt")
    model = LlamaForCausalLM.from_pretrained(models / "target", torch_dtype=torch.float32).eval()
    follow = total = 0
    for ids in prompts:
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), max_new_tokens=max_new_tokens, do_sample=False)[0].tolist()
        seq = out[len(ids) - 1:]
        follow += sum(int(g[a]) == b for a, b in zip(seq, seq[1:]))
        total += len(seq) - 1
    return follow / total


def make_dummy_models(out: str | Path, preset: str = "llama-3.1-8b", draft_vocab: int = 32000) -> tuple[Path, Path]:
    """Configs and a tokenizer (no weights) for a real-shaped target and EAGLE-3 head, to serve
    with `--load-format dummy`: SGLang fills the weights with random values, so the draft is
    almost never right (accept length about 1) while every step costs what it costs at these
    shapes.  `draft_vocab` as a released EAGLE-3 head for the target (32000 for Llama-3.1-8B)."""
    from dynspec.calibrate.model_shapes import PRESETS

    m = PRESETS[preset]
    out = Path(out)
    target, draft = out / "target", out / "draft"
    common = dict(vocab_size=m.vocab, hidden_size=m.hidden, intermediate_size=m.intermediate,
                  num_attention_heads=m.heads, num_key_value_heads=m.kv_heads, head_dim=m.head_dim,
                  max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=m.rope_theta, hidden_act="silu",
                  bos_token_id=1, eos_token_id=2, tie_word_embeddings=False, torch_dtype="bfloat16",
                  model_type="llama")
    for folder in (target, draft):
        folder.mkdir(parents=True, exist_ok=True)
        tokenizer_files(folder, m.vocab)
    (target / "config.json").write_text(json.dumps(
        {**common, "architectures": ["LlamaForCausalLM"], "num_hidden_layers": m.layers}, indent=1))
    (draft / "config.json").write_text(json.dumps(
        {**common, "architectures": ["LlamaForCausalLMEagle3"], "num_hidden_layers": 1,
         "draft_vocab_size": draft_vocab, "target_hidden_size": m.hidden}, indent=1))
    return target, draft
