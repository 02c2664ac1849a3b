"""The sweep config: one YAML file says what `dynspec sweep` measures, parsed once into SweepConfig.

Every problem is reported as one line, "FILE: key.path: problem", and nothing runs.
Model paths may be left as placeholders for the sim and emulate backends; the live
backend refuses them (check_live), naming the key to fill in.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from dynspec.typed_yaml import parse_model, read_yaml

BACKENDS = ("live", "sim", "emulate")
SIM_ARMS = ("baseline", "eagle3", "dynamic")  # what the simulator/emulator can model; or policy:SPEC
PLACEHOLDERS = ("{model}", "{draft_model}", "{port}", "{host}", "{python}")  # {python}: dynspec's interpreter
# What a path left for the user to fill in looks like.
_PLACEHOLDER_PATH = re.compile(r"FILL[_ -]?ME|^/path/to/|<[^>]*>|TODO|CHANGEME", re.IGNORECASE)


# Upper bounds: far beyond any real sweep, low enough that a typo (1e6 repeats, a level of
# 10^30 requests) is refused instead of running for years or exhausting memory.
MAX_CONCURRENCY = 65536
MAX_TOKENS = 1 << 22  # input or output tokens per request
MAX_PROMPTS = 1_000_000
MAX_REPEATS = 100
MAX_SECONDS = 7 * 24 * 3600.0  # any timeout
MAX_TIME_SCALE = 10_000.0
# Run ids name folders: a safe character set, one line, a bounded length.
RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


def run_id_problem(run_id: str) -> str:
    """Why run_id cannot name a run folder ("" when it can)."""
    if RUN_ID.fullmatch(run_id):
        return ""
    return f"run id {run_id[:40]!r}: use at most 128 letters, digits, '.', '_' and '-', starting with a letter or digit"


class ConfigError(ValueError):
    """A config that cannot be used; the message is one line naming the file and the key."""


class _Strict(BaseModel):
    # strict: YAML's true is not 1 and 1e30 is not an integer; no .inf or .nan anywhere.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class Timeouts(_Strict):
    startup_s: float = Field(1800.0, gt=0, le=MAX_SECONDS)  # a TP-8 model load plus CUDA-graph capture takes minutes
    level_s: float = Field(3600.0, gt=0, le=MAX_SECONDS)
    request_s: float = Field(600.0, gt=0, le=MAX_SECONDS)
    shutdown_grace_s: float = Field(30.0, ge=0, le=MAX_SECONDS)


class Prompts(_Strict):
    source: Literal["random", "jsonl", "sharegpt"] = "random"
    path: str | None = None
    # Random prompts draw token ids below this; every tokenizer in use has at least 32000.
    vocab_size: int = Field(32000, ge=2, le=1 << 24)

    @model_validator(mode="after")
    def _path(self) -> "Prompts":
        if self.source == "random" and self.path is not None:
            raise ValueError("path is only for source jsonl or sharegpt")
        if self.source != "random" and not self.path:
            raise ValueError(f"source {self.source} needs a path")
        return self


class Emulate(_Strict):
    time_scale: float = Field(1.0, gt=0, le=MAX_TIME_SCALE)  # the emulator runs this many times faster than the profile


class Arm(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=64)  # used in file names
    description: str = ""
    sim_arm: str = "baseline"
    launch: list[str] = []  # argv of the live server, with {model} {draft_model} {port} {host}
    env: dict[str, str] = {}
    api: Literal["generate", "openai"] = "generate"

    @field_validator("launch", mode="before")
    @classmethod
    def _split(cls, v):
        return shlex.split(v) if isinstance(v, str) else v

    @field_validator("sim_arm")
    @classmethod
    def _sim_arm(cls, v: str) -> str:
        if v in SIM_ARMS:
            return v
        if v.startswith("policy:"):
            from dynspec.policy import PolicySpecError, check_spec

            try:
                return "policy:" + check_spec(v.removeprefix("policy:"))
            except PolicySpecError as exc:
                raise ValueError(str(exc)) from None
        raise ValueError(f"{v!r} is not one of {', '.join(SIM_ARMS)} or policy:SPEC")

    @field_validator("env", mode="before")
    @classmethod
    def _env_strings(cls, v):
        # YAML turns 1 and true into numbers and booleans; the environment wants strings.
        # Only scalars are turned into strings: a list or mapping (an alias, say) is left for the type check.
        if isinstance(v, dict):
            return {str(k): "1" if x is True else "0" if x is False else str(x) if isinstance(x, (int, float)) else x
                    for k, x in v.items()}
        return v

    @property
    def speculates(self) -> bool:
        """Whether the live server needs a draft model."""
        return "{draft_model}" in " ".join(self.launch)


class SweepConfig(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    description: str = ""
    hardware: str = ""
    backend: Literal["live", "sim", "emulate"] = "live"  # the CLI's --backend overrides it
    model: str | None = None
    draft_model: str | None = None
    profile: str = "seed-blackwell"  # what the sim and emulate backends model
    host: str = "127.0.0.1"
    concurrency: list[Annotated[int, Field(le=MAX_CONCURRENCY)]] = Field(min_length=1, max_length=1024)
    num_prompts: int | None = Field(None, ge=1, le=MAX_PROMPTS)  # None: max(prompts_per_client*C, min_prompts)
    prompts_per_client: int = Field(5, ge=1, le=MAX_PROMPTS)
    min_prompts: int = Field(50, ge=1, le=MAX_PROMPTS)
    input_len: int = Field(1024, ge=1, le=MAX_TOKENS)
    output_len: int = Field(256, ge=1, le=MAX_TOKENS)
    prompts: Prompts = Prompts()
    warmup_requests: int = Field(2, ge=0, le=MAX_PROMPTS)
    repeats: int = Field(1, ge=1, le=MAX_REPEATS)
    seed: int = 0
    timeouts: Timeouts = Timeouts()
    emulate: Emulate = Emulate()
    arms: list[Arm] = Field(min_length=1)

    @field_validator("concurrency")
    @classmethod
    def _levels(cls, v: list[int]) -> list[int]:
        if any(c < 1 for c in v):
            raise ValueError("concurrency levels must be at least 1")
        if len(set(v)) != len(v):
            raise ValueError("concurrency levels must not repeat")
        return v

    @field_validator("arms")
    @classmethod
    def _unique_arms(cls, v: list[Arm]) -> list[Arm]:
        names = [a.name for a in v]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"arm names must be unique ({', '.join(dup)} repeats)")
        return v

    def prompts_for(self, concurrency: int) -> int:
        """Measured requests at one level: the config's num_prompts, else max(5*C, 50) by default."""
        if self.num_prompts is not None:
            return self.num_prompts
        return max(self.prompts_per_client * concurrency, self.min_prompts)

    def arm(self, name: str) -> Arm:
        for a in self.arms:
            if a.name == name:
                return a
        raise KeyError(name)


def parse_config(data: object, src: str = "<config>") -> SweepConfig:
    cfg = parse_model(SweepConfig, data, src, ConfigError, "sweep config")
    for i, arm in enumerate(cfg.arms):
        for word in re.findall(r"\{[^{}]*\}", " ".join(arm.launch)):
            if word not in PLACEHOLDERS:
                raise ConfigError(f"{src}: arms.{i}.launch: unknown placeholder {word} "
                                  f"(known: {' '.join(PLACEHOLDERS)})")
    return cfg


def load_config(path: str | Path) -> SweepConfig:
    """Read and validate a sweep config; raise ConfigError with one line naming file and key."""
    path = Path(path)
    cfg = parse_config(read_yaml(path, ConfigError, "config"), str(path))
    if cfg.prompts.path is not None:
        # A prompt file is named relative to the config that names it.
        p = Path(cfg.prompts.path)
        if not p.is_absolute():
            p = path.parent / p
        if not p.is_file():
            raise ConfigError(f"{path}: prompts.path: no such file {p}")
        cfg = cfg.model_copy(update={"prompts": cfg.prompts.model_copy(update={"path": str(p.resolve())})})
    return cfg


def is_placeholder(value: str | None) -> bool:
    return not value or not value.strip() or bool(_PLACEHOLDER_PATH.search(value))


def check_live(cfg: SweepConfig, src: str = "<config>") -> None:
    """What the live backend needs beyond the schema: real model paths, a launch line per arm."""
    if is_placeholder(cfg.model):
        raise ConfigError(f"{src}: model: fill in the target model's path (got {cfg.model!r})")
    for i, arm in enumerate(cfg.arms):
        if not arm.launch:
            raise ConfigError(f"{src}: arms.{i}.launch: the live backend needs the server's command line")
        if arm.speculates and is_placeholder(cfg.draft_model):
            raise ConfigError(f"{src}: draft_model: fill in the draft model's path "
                              f"(arm {arm.name} speculates; got {cfg.draft_model!r})")
        if "{port}" not in " ".join(arm.launch):
            raise ConfigError(f"{src}: arms.{i}.launch: must contain --port {{port}} so dynspec knows "
                              f"where the server listens")


def resolved_yaml(cfg: SweepConfig) -> str:
    """The config as it was used: every default filled in."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
