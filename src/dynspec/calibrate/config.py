"""What `dynspec calibrate` measures: its settings (`CalibrateConfig`), validated once, and its error.

torch is imported on first use only (`import_torch`): `dynspec --help` imports every command module.
"""

from __future__ import annotations

import shlex
from functools import cached_property
from pathlib import Path

from pydantic import Field, ValidationInfo, computed_field, field_validator, model_validator

from dynspec.calibrate.model_shapes import PRESETS, ModelDims, resolve_shape
from dynspec.sglang.hook import DEFAULT_CATCH_UP_WINDOW
from dynspec.models import Model, Workload, field_default

DTYPES = {"bfloat16": 2, "float16": 2, "float32": 4}  # bytes per element
STEP_KINDS = ("plain", "draft", "verify", "extend", "extend_eager", "catchup", "resume")
DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 160, 192, 224, 256)
CHUNK_TOKENS = 8192  # SGLang's default chunked-prefill size, written into the profile


class CalibrateError(ValueError):
    """Bad input; the message is one line, shown as `dynspec calibrate: MESSAGE`."""


def import_torch():
    """torch, imported on first use: `dynspec --help` imports every command module, and torch
    is not a dependency of the rest of dynspec."""
    try:
        import torch
    except ImportError:
        raise CalibrateError("needs PyTorch (pip install torch)") from None
    return torch


class CalibrateConfig(Model):
    """What `dynspec calibrate` measures, built from its options (config_from_args)."""

    shape: str
    name: str
    out: Path
    accept_length: float = 2.5
    draft_vocab: int = Field(32000, ge=1)
    draft_layers: int = Field(1, ge=1)
    batch_sizes: tuple[int, ...] = DEFAULT_BATCH_SIZES
    contexts: tuple[int, ...] = (1024,)
    tokens_per_request: tuple[int, ...] = (1, 2, 4, 8)
    input_len: int = Field(field_default(Workload, "input_len"), ge=1)  # the prefill timings' prompt length
    num_steps: int = Field(3, ge=1)
    catch_up_window: int = Field(DEFAULT_CATCH_UP_WINDOW, ge=1, le=64)  # as the 0.5.9 patch's default
    concentration: float = Field(10.0, gt=0)
    repeats: int = Field(20, ge=1)
    warmup: int = Field(5, ge=0)
    dtype: str = "bfloat16"
    device: str = "cuda"
    cuda_graphs: bool = True
    seed: int = 0
    raw_out: Path | None = None

    @field_validator("batch_sizes", "contexts", "tokens_per_request")
    @classmethod
    def _increasing(cls, values: tuple[int, ...], info: ValidationInfo) -> tuple[int, ...]:
        least = 2 if info.field_name == "batch_sizes" else 1  # a profile step table has two or more
        if len(values) < least or any(v < 1 for v in values) or any(a >= b for a, b in zip(values, values[1:])):
            raise ValueError(f"must be {'at least two ' if least == 2 else ''}positive, strictly increasing "
                             f"integers, got {','.join(map(str, values))}")
        return values

    @field_validator("dtype")
    @classmethod
    def _dtype(cls, dtype: str) -> str:
        if dtype not in DTYPES:
            raise ValueError(f"must be one of {', '.join(DTYPES)}, got {dtype!r}")
        return dtype

    @field_validator("device")
    @classmethod
    def _device(cls, device: str) -> str:
        if device.split(":")[0] not in ("cuda", "cpu"):
            raise ValueError(f"must be cuda, cuda:N or cpu, got {device!r}")
        return device

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        if not name.strip():
            raise ValueError("must not be empty")
        return name

    @field_validator("out")
    @classmethod
    def _out(cls, out: Path) -> Path:
        if out.suffix not in (".yaml", ".yml"):
            raise ValueError(f"{out}: a profile is written as .yaml")
        return out

    @model_validator(mode="after")
    def _consistent(self) -> CalibrateConfig:
        # Checks of one option against another: their messages name both.
        if not (1.0 < self.accept_length <= 1 + self.num_steps):
            raise ValueError(f"--accept-length must be in (1, {1 + self.num_steps}] for --num-steps "
                             f"{self.num_steps} (tokens per request per verify, bonus included), "
                             f"got {self.accept_length:g}")
        if self.draft_vocab > self.dims.vocab:  # dims: a bad --shape's ShapeError is a ValueError, reported as is
            raise ValueError(f"--draft-vocab {self.draft_vocab} exceeds the {self.shape_name} vocabulary "
                             f"({self.dims.vocab})")
        return self

    # Recorded with the options: the shapes they resolved to.
    @computed_field  # type: ignore[prop-decorator]  # pydantic's documented form, which mypy cannot follow
    @cached_property
    def dims(self) -> ModelDims:
        return resolve_shape(self.shape)

    @property
    def shape_name(self) -> str:
        return self.shape if self.shape in PRESETS else Path(self.shape).parent.name or Path(self.shape).stem

    @property
    def verify_tokens(self) -> int:
        return self.num_steps + 1

    @property
    def forward_tokens(self) -> tuple[int, ...]:
        """The q of every target-forward timing: the requested curve, plus 1 (the plain step)."""
        return tuple(sorted({1, *self.tokens_per_request}))

    @property
    def raw_path(self) -> Path:
        return self.raw_out or self.out.with_name(self.out.stem + ".raw.json")

    def command(self) -> str:
        """The command line that reproduces this run, every setting explicit."""
        def csv(xs):
            return ",".join(map(str, xs))
        parts = ["dynspec", "calibrate", "--shape", self.shape, "--draft-vocab", str(self.draft_vocab),
                 "--draft-layers", str(self.draft_layers), "--batch-sizes", csv(self.batch_sizes),
                 "--context", csv(self.contexts), "--tokens-per-request", csv(self.tokens_per_request),
                 "--input-len", str(self.input_len), "--num-steps", str(self.num_steps),
                 "--accept-length", f"{self.accept_length:g}", "--concentration", f"{self.concentration:g}",
                 "--repeats", str(self.repeats), "--warmup", str(self.warmup), "--dtype", self.dtype,
                 "--device", self.device, "--seed", str(self.seed)]
        if not self.cuda_graphs:
            parts.append("--no-cuda-graphs")
        parts += ["--name", self.name, "--out", str(self.out)]
        if self.raw_out:
            parts += ["--raw-out", str(self.raw_out)]
        return shlex.join(parts)


def parse_ints(text: str, option: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise CalibrateError(f"{option} takes comma-separated integers, got {text!r}") from None
