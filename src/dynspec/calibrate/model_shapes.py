"""A dense decoder's shapes: the presets, or a Hugging Face config.json (nothing downloaded).

What `dynspec calibrate` builds with random weights; no torch needed to read them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dynspec.io.jsonl import read_json


class ShapeError(ValueError):
    """Shapes that cannot be built; the message is one line."""


@dataclass(frozen=True)
class ModelDims:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    rope_theta: float = 500000.0
    norm_eps: float = 1e-5
    head_dim: int = 0  # 0: hidden // heads (most Llama-style configs leave it out)

    def __post_init__(self) -> None:
        if min(self.hidden, self.layers, self.heads, self.kv_heads, self.intermediate, self.vocab) < 1:
            raise ShapeError("model dimensions must be positive")
        if not self.head_dim:
            if self.hidden % self.heads:
                raise ShapeError(f"hidden {self.hidden} does not split into {self.heads} heads")
            object.__setattr__(self, "head_dim", self.hidden // self.heads)
        if self.head_dim % 2 or self.heads % self.kv_heads:
            raise ShapeError(f"heads need an even head_dim (got {self.head_dim}) and must split into kv_heads "
                                 f"groups (got {self.heads} heads, {self.kv_heads} kv heads)")

    @property
    def group(self) -> int:
        return self.heads // self.kv_heads

    @property
    def aux_layers(self) -> tuple[int, ...]:
        # EAGLE-3 fuses three target hidden states; SGLang takes the inputs of layers 2, n/2, n-3.
        n = self.layers
        return tuple(min(max(i, 0), n - 1) for i in (2, n // 2, n - 3))

    def kv_bytes_per_token(self, layers: int, dtype_bytes: int) -> int:
        return 2 * layers * self.kv_heads * self.head_dim * dtype_bytes

    def describe(self) -> str:
        return (f"hidden {self.hidden}, layers {self.layers}, heads {self.heads}, kv heads {self.kv_heads}, "
                f"head dim {self.head_dim}, intermediate {self.intermediate}, vocab {self.vocab}")


PRESETS = {
    "llama-3.1-8b": ModelDims(hidden=4096, layers=32, heads=32, kv_heads=8, intermediate=14336, vocab=128256),
    "tiny": ModelDims(hidden=64, layers=4, heads=4, kv_heads=2, intermediate=128, vocab=512),  # tests, CPU
}

# A Hugging Face config.json's keys -> ModelDims fields (the Llama family's names).
_HF_KEYS = {"hidden_size": "hidden", "num_hidden_layers": "layers", "num_attention_heads": "heads",
            "intermediate_size": "intermediate", "vocab_size": "vocab"}
_HF_OPTIONAL = {"num_key_value_heads": "kv_heads", "rope_theta": "rope_theta", "rms_norm_eps": "norm_eps",
                "head_dim": "head_dim"}


def dims_from_hf_config(path: Path) -> ModelDims:
    """A dense decoder's shapes from its Hugging Face config.json (nothing downloaded)."""
    root = read_json(path, ShapeError)  # unreadable, not UTF-8, not JSON or nested too deeply: one line
    if not isinstance(root, dict):
        raise ShapeError(f"{path}: a config.json is a JSON object")
    cfg: dict[str, Any] = root.get("text_config", root)  # multimodal configs nest the language model's
    if any(k in cfg for k in ("num_local_experts", "n_routed_experts", "num_experts")):
        raise ShapeError(f"{path}: a mixture-of-experts model; calibrate builds dense Llama-style decoders only")
    missing = [k for k in _HF_KEYS if not isinstance(cfg.get(k), int)]
    if missing:
        raise ShapeError(f"{path}: missing or not an integer: {', '.join(missing)}")
    kw = {field: cfg[key] for key, field in _HF_KEYS.items()}
    kw.update({field: cfg[key] for key, field in _HF_OPTIONAL.items() if cfg.get(key) is not None})
    kw.setdefault("kv_heads", kw["heads"])
    return ModelDims(**kw)


def resolve_shape(shape: str) -> ModelDims:
    if shape in PRESETS:
        return PRESETS[shape]
    if shape.endswith(".json") or Path(shape).exists():
        return dims_from_hf_config(Path(shape))
    raise ShapeError(f"unknown --shape {shape!r} (a preset: {', '.join(PRESETS)}; or a path to a config.json)")
