"""The sweep config: one YAML file says what `dynspec sweep` measures, parsed once into SweepConfig.

Every problem is reported as one line, "FILE: key.path: problem", and nothing runs.
Model paths may be left as placeholders for the sim and emulate backends; the live
backend refuses them (check_live), naming the key to fill in.
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import Field, field_validator, model_validator

from dynspec.models import StrictModel, Workload, field_default
from dynspec.live.arm import Arm, sharing_problem
from dynspec.io.typed_yaml import parse_model, read_yaml

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
MAX_RATE = 1e6  # requests per second
# Run ids name folders: a safe character set, one line, a bounded length.
RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


def run_id_problem(run_id: str) -> str:
    """Why run_id cannot name a run folder ("" when it can)."""
    if RUN_ID.fullmatch(run_id):
        return ""
    return f"run id {run_id[:40]!r}: use at most 128 letters, digits, '.', '_' and '-', starting with a letter or digit"


@dataclass(frozen=True, order=True)
class Level:
    """One load level.  Closed loop (rate inf): `concurrency` clients, each sending its next request
    when its last ends (bench_serving --max-concurrency C).  Open loop: requests arrive at `rate` per
    second (gamma intervals of shape `burstiness`; 1 is Poisson), at most `concurrency` in flight
    (0: no cap), as bench_serving --request-rate R [--max-concurrency C]."""

    concurrency: int
    rate: float = math.inf

    @property
    def closed(self) -> bool:
        return math.isinf(self.rate)

    @property
    def label(self) -> str:
        """c8, rate2.5, rate2.5_c64: in file names and log lines."""
        if self.closed:
            return f"c{self.concurrency}"
        return f"rate{self.rate:g}" + (f"_c{self.concurrency}" if self.concurrency else "")


def level_name(arm: str, level: Level | int, repeat: int) -> str:
    """An arm's level and repeat in file names and log lines: baseline_c8_r0, eagle3_rate2.5_r1."""
    level = Level(level) if isinstance(level, int) else level
    return f"{arm}_{level.label}_r{repeat}"


def arm_kinds(run_dir: str | Path) -> dict[str, str]:
    """Each arm of a run folder's saved config and the kind of server it is (its sim_arm:
    baseline, eagle3, policy:never ...), so that scripts pool a repeated server (baseline-2) with
    its kind.  The results' policy column cannot: an unpatched EAGLE-3 server and the patched one
    told `always` both say always.  Empty when the folder has no readable config."""
    try:
        data = yaml.safe_load((Path(run_dir) / "config.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return {}
    arms = data.get("arms") if isinstance(data, dict) else None
    return {a["name"]: str(a.get("sim_arm", "baseline")) for a in arms or () if isinstance(a, dict) and "name" in a}


class ConfigError(ValueError):
    """A config that cannot be used; the message is one line naming the file and the key."""


class Timeouts(StrictModel):
    startup_s: float = Field(1800.0, gt=0, le=MAX_SECONDS)  # a TP-8 model load plus CUDA-graph capture takes minutes
    level_s: float = Field(3600.0, gt=0, le=MAX_SECONDS)
    request_s: float = Field(600.0, gt=0, le=MAX_SECONDS)
    shutdown_grace_s: float = Field(30.0, ge=0, le=MAX_SECONDS)
    health_s: float = Field(10.0, gt=0, le=MAX_SECONDS)  # /health before each level: a hung server fails fast


class Prompts(StrictModel):
    """What a level sends (dynspec.live.prompts): random ids or a dataset file, and output lengths."""

    source: Literal["random", "jsonl", "sharegpt", "mtbench"] = "random"
    path: str | None = None
    # Random prompts draw token ids below this; every tokenizer in use has at least 32000.
    vocab_size: int = Field(32000, ge=2, le=1 << 24)
    # fixed: output_len each; dataset: the file's lengths; range: uniform in [range_ratio x output_len,
    # output_len] (random prompts: the input length too), as bench_serving's --random-range-ratio.
    output_lens: Literal["fixed", "dataset", "range"] = "fixed"
    range_ratio: float = Field(1.0, ge=0, le=1)
    tokenizer: str | None = None  # counts a ShareGPT reply's tokens (else 4 UTF-8 bytes per token)
    # Random prompts in classes of token ids, [lo, hi) each (e.g. the crafted models' classes, whose
    # drafts are right at different rates): each prompt's ids from one class, the classes taken in
    # turn prompt by prompt (interleaved) or the level's prompts split into consecutive blocks, one
    # class after the other (in_turn: closed-loop clients meet a shift of class mid-level).
    id_ranges: list[Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=2, max_length=2)]] | None = None
    class_order: Literal["interleaved", "in_turn"] = "interleaved"

    @model_validator(mode="after")
    def _path(self) -> "Prompts":
        if self.source == "random" and self.path is not None:
            raise ValueError("path is only for source jsonl, sharegpt or mtbench")
        if self.source != "random" and not self.path:
            raise ValueError(f"source {self.source} needs a path")
        if self.output_lens == "dataset" and self.source in ("random", "mtbench"):
            raise ValueError(f"output_lens dataset: source {self.source} gives no output lengths (fixed or range)")
        if self.output_lens == "range" and self.range_ratio >= 1:
            raise ValueError("output_lens range needs range_ratio below 1 (1 is output_lens fixed)")
        if self.id_ranges is not None:
            if self.source != "random":
                raise ValueError("id_ranges is only for source random")
            if not self.id_ranges:
                raise ValueError("id_ranges: give at least one [lo, hi] range")
            for lo, hi in self.id_ranges:
                if not lo < hi:
                    raise ValueError(f"id_ranges: [{lo}, {hi}] is empty (ids lo..hi-1; lo < hi)")
        if self.tokenizer is not None and not (self.source == "sharegpt" and self.output_lens == "dataset"):
            raise ValueError("tokenizer only counts ShareGPT replies (source sharegpt, output_lens dataset)")
        return self


class LoadPhase(StrictModel):
    """One phase of a level whose load moves: `requests` prompts sent with at most `concurrency`
    in flight (closed loop), then the next phase's."""

    concurrency: int = Field(ge=1, le=MAX_CONCURRENCY)
    requests: int = Field(ge=1, le=MAX_PROMPTS)


class SLO(StrictModel):
    """Service-level objectives in ms, as vLLM's --goodput ttft:X tpot:Y e2el:Z: a request is good
    when it succeeds and meets every one given."""

    ttft_ms: float | None = Field(None, gt=0, le=MAX_SECONDS * 1000)
    tpot_ms: float | None = Field(None, gt=0, le=MAX_SECONDS * 1000)
    e2e_ms: float | None = Field(None, gt=0, le=MAX_SECONDS * 1000)

    @model_validator(mode="after")
    def _some(self) -> "SLO":
        if self.as_dict() == {}:
            raise ValueError("give at least one of ttft_ms, tpot_ms, e2e_ms")
        return self

    def as_dict(self) -> dict[str, float]:
        """{"ttft": ms, ...}: what dynspec.results.summarize takes."""
        return {k.removesuffix("_ms"): v for k, v in self.model_dump().items() if v is not None}


class Metrics(StrictModel):
    # TTFT, TPOT, ITL and E2E at these percentiles (50, 90, 95 and 99 are always in the results;
    # others add columns); the report shows these.
    percentiles: list[float] = Field([50.0, 90.0, 95.0, 99.0], min_length=1, max_length=16)
    slo: SLO | None = None

    @field_validator("percentiles", mode="before")
    @classmethod
    def _floats(cls, v):
        # YAML's 99 is an int; a percentile is a number either way (but not a boolean).
        return [float(x) if isinstance(x, int) and not isinstance(x, bool) else x for x in v] \
            if isinstance(v, list) else v

    @field_validator("percentiles")
    @classmethod
    def _range(cls, v: list[float]) -> list[float]:
        for p in v:
            if not 0 < p <= 100 or round(p, 3) != p:
                raise ValueError(f"percentile {p:g} must be in (0, 100] with at most 3 decimals")
        if len(set(v)) != len(v):
            raise ValueError("percentiles must not repeat")
        return v


class Emulate(StrictModel):
    time_scale: float = Field(1.0, gt=0, le=MAX_TIME_SCALE)  # the emulator runs this many times faster than the profile


DRIVERS = ("bench_serving", "dynspec")


class BenchServing(StrictModel):
    """How the bench_serving driver runs `python -m sglang.bench_serving` (dynspec.sglang.bench_serving)."""

    python: str | None = None  # default: the arm's launch interpreter if it is one, else dynspec's
    tokenizer: str | None = None  # default: the config's model (bench_serving needs a tokenizer)
    pythonpath: list[str] = []  # put first on its PYTHONPATH (e.g. an unpacked SGLang)
    extra_args: list[str] = []  # passed through to bench_serving

    @field_validator("extra_args", mode="before")
    @classmethod
    def _split(cls, v):
        return shlex.split(v) if isinstance(v, str) else v


class SweepConfig(StrictModel):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    description: str = ""
    hardware: str = ""
    backend: Literal["live", "sim", "emulate"] = "live"  # the CLI's --backend overrides it
    model: str | None = None
    draft_model: str | None = None
    profile: str = "seed-blackwell"  # what the sim and emulate backends model
    host: str = "127.0.0.1"
    # The levels: closed-loop concurrencies and/or open-loop request rates (requests/s).
    concurrency: list[Annotated[int, Field(le=MAX_CONCURRENCY)]] = Field([], max_length=1024)
    request_rates: list[Annotated[float, Field(gt=0, le=MAX_RATE)]] = Field([], max_length=1024)
    burstiness: float = Field(1.0, gt=0, le=1000)  # rate levels: gamma shape of the intervals (1: Poisson)
    max_concurrency: int | None = Field(None, ge=1, le=MAX_CONCURRENCY)  # rate levels: cap on requests in flight
    rate_duration_s: float = Field(30.0, gt=0, le=MAX_SECONDS)  # rate levels: num_prompts default rate x this
    num_prompts: int | None = Field(None, ge=1, le=MAX_PROMPTS)  # None: max(prompts_per_client*C, min_prompts)
    # A load that moves within one level (e.g. C 4 -> 64 -> 4): the run's only level, keyed by its
    # peak concurrency; every arm gets the same prompts with the same caps, and is judged over the
    # whole level.
    load_phases: list[LoadPhase] | None = Field(None, min_length=2, max_length=64)
    # The workload's defaults are Workload's (models.py), shared with `dynspec sim` and fit specs.
    prompts_per_client: int = Field(field_default(Workload, "prompts_per_client"), ge=1, le=MAX_PROMPTS)
    min_prompts: int = Field(field_default(Workload, "min_prompts"), ge=1, le=MAX_PROMPTS)
    input_len: int = Field(field_default(Workload, "input_len"), ge=1, le=MAX_TOKENS)
    output_len: int = Field(field_default(Workload, "output_len"), ge=1, le=MAX_TOKENS)
    prompts: Prompts = Prompts()
    warmup_requests: int = Field(2, ge=0, le=MAX_PROMPTS)
    # Live: once every server is up, a short unmeasured burst at each concurrency of its levels, under each
    # of its arms' policies, so no measured level is a fresh process's first at its shapes (a cold
    # server's first level at C=64 stalled 3.5 s longer than the same level warm, on one H100).
    warm_servers: bool = True
    repeats: int = Field(1, ge=1, le=MAX_REPEATS)
    seed: int = 0
    timeouts: Timeouts = Timeouts()
    emulate: Emulate = Emulate()
    metrics: Metrics = Metrics()
    # The client that measures emulate and live levels: bench_serving (the real `python -m
    # sglang.bench_serving`) or dynspec (the built-in generator).  None: bench_serving for live,
    # dynspec for emulate.  An arm's `driver` overrides it.
    driver: Literal["bench_serving", "dynspec"] | None = None
    bench_serving: BenchServing = BenchServing()
    # sequential: one arm's server at a time, every level of that arm, then the next arm.
    # interleaved (live, emulate): every arm's server runs at once, and repeat r measures each level
    # on every arm in turn, in the arms' order when r is even and reversed when odd (ABBA), so that
    # drift and heat over the run fall on all arms alike.  The arms' launch lines must then share the
    # machine (for SGLang: --max-total-tokens and --mem-fraction-static, --sleep-on-idle).
    schedule: Literal["sequential", "interleaved"] = "sequential"
    arms: list[Arm] = Field(min_length=1)

    @field_validator("concurrency")
    @classmethod
    def _levels(cls, v: list[int]) -> list[int]:
        if any(c < 1 for c in v):
            raise ValueError("concurrency levels must be at least 1")
        if len(set(v)) != len(v):
            raise ValueError("concurrency levels must not repeat")
        return v

    @field_validator("request_rates", mode="before")
    @classmethod
    def _rate_floats(cls, v):
        return [float(x) if isinstance(x, int) and not isinstance(x, bool) else x for x in v] \
            if isinstance(v, list) else v

    @field_validator("request_rates")
    @classmethod
    def _rates(cls, v: list[float]) -> list[float]:
        if len(set(v)) != len(v):
            raise ValueError("request rates must not repeat")
        return v

    @model_validator(mode="after")
    def _some_level(self) -> "SweepConfig":
        if self.load_phases is not None:
            peak = max(p.concurrency for p in self.load_phases)
            if self.request_rates or self.num_prompts is not None or self.concurrency not in ([], [peak]):
                raise ValueError(f"load_phases is the run's only level: leave out request_rates and num_prompts, "
                                 f"and concurrency (or give [{peak}], the peak)")
            if sum(p.requests for p in self.load_phases) > MAX_PROMPTS:
                raise ValueError(f"load_phases: more than {MAX_PROMPTS} requests in all")
            return self
        if not self.concurrency and not self.request_rates:
            raise ValueError("give concurrency levels, request_rates, or both")
        return self

    @field_validator("arms")
    @classmethod
    def _unique_arms(cls, v: list[Arm]) -> list[Arm]:
        names = [a.name for a in v]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"arm names must be unique ({', '.join(dup)} repeats)")
        return v

    @model_validator(mode="after")
    def _shared_servers(self) -> "SweepConfig":
        problem = sharing_problem(self.arms, self.schedule)
        if problem:
            raise ValueError(problem)
        return self

    def host_of(self, arm: Arm) -> Arm:
        """The arm whose server `arm` is measured on (itself unless it shares one)."""
        return self.arm(arm.shares) if arm.shares else arm

    def sharers(self, host: Arm) -> list[Arm]:
        """The arms measured on `host`'s server besides its own."""
        return [a for a in self.arms if a.shares == host.name]

    def levels(self) -> list[Level]:
        """Closed-loop levels, then open-loop ones, in the config's order."""
        if self.load_phases is not None:
            return [Level(max(p.concurrency for p in self.load_phases))]
        cap = self.max_concurrency or 0
        return [Level(c) for c in self.concurrency] + [Level(cap, r) for r in self.request_rates]

    def prompt_caps(self) -> list[int] | None:
        """With load_phases: each prompt's cap on requests in flight, in send order; else None."""
        if self.load_phases is None:
            return None
        return [p.concurrency for p in self.load_phases for _ in range(p.requests)]

    @property
    def workload(self) -> Workload:
        """The config's workload fields as a Workload."""
        return Workload(**{name: getattr(self, name) for name in Workload.model_fields})

    def prompts_for(self, level: Level | int) -> int:
        """Measured requests at one level: the config's num_prompts, else Workload.prompts_at
        (max(5*C, 50) by default) for a closed-loop level and max(rate x rate_duration_s, min_prompts)
        for an open-loop one."""
        if self.num_prompts is not None:
            return self.num_prompts
        if self.load_phases is not None:
            return sum(p.requests for p in self.load_phases)
        if isinstance(level, int):
            level = Level(level)
        if level.closed:
            return self.workload.prompts_at(level.concurrency)
        return max(math.ceil(level.rate * self.rate_duration_s), self.min_prompts)

    def result_columns(self) -> list[str]:
        """The results file's columns: the schema's, and one per metric for each extra percentile."""
        from dynspec.results import RESULT_COLUMNS, extra_columns

        return RESULT_COLUMNS + extra_columns(self.metrics.percentiles)

    def summary_args(self) -> dict:
        """What dynspec.results.summarize takes from the config: percentiles and SLOs."""
        return {"percentiles": self.metrics.percentiles, "slo": self.metrics.slo.as_dict() if self.metrics.slo else None}

    def driver_for(self, arm: Arm, backend: str) -> str:
        """The client that measures this arm's levels on this backend."""
        return arm.driver or self.driver or ("bench_serving" if backend == "live" else "dynspec")

    def arm(self, name: str) -> Arm:
        for a in self.arms:
            if a.name == name:
                return a
        raise KeyError(name)


def parse_config(data: object, src: str = "<config>") -> SweepConfig:
    cfg = parse_model(SweepConfig, data, src, ConfigError, "sweep config")
    for i, arm in enumerate(cfg.arms):
        if arm.api == "chat" and cfg.prompts.source == "random":
            raise ConfigError(f"{src}: arms.{i}.api: chat sends text; random token-id prompts need "
                              f"api generate or openai (or prompts from a file)")

    for i, arm in enumerate(cfg.arms):
        for word in re.findall(r"\{[^{}]*\}", " ".join(arm.launch)):
            if word not in PLACEHOLDERS:
                raise ConfigError(f"{src}: arms.{i}.launch: unknown placeholder {word} "
                                  f"(known: {' '.join(PLACEHOLDERS)})")
    return cfg


def bench_serving_problem(cfg: SweepConfig) -> str:
    """What sglang.bench_serving 0.5.9 cannot do of this config ("" when nothing), for every arm it
    may drive: "key: why"."""
    p = cfg.prompts
    if cfg.load_phases is not None:
        return "load_phases: sglang.bench_serving cannot move its concurrency within a level; use driver dynspec"
    if cfg.request_rates and cfg.burstiness != 1.0:
        return "burstiness: sglang.bench_serving 0.5.9 sends Poisson arrivals only (burstiness 1); use driver dynspec"
    if p.source == "jsonl":
        return "prompts.source: the bench_serving driver takes random, sharegpt or mtbench prompts; use driver dynspec"
    if p.source in ("sharegpt", "mtbench") and p.output_lens == "range":
        return (f"prompts.output_lens: bench_serving draws lengths by a range ratio for random prompts only; "
                f"use fixed or dataset with {p.source}")
    if p.source != "random" and p.output_lens == "fixed" and cfg.output_len < 4:
        return "output_len: bench_serving's ShareGPT reader refuses output lengths below 4"
    return ""


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
    tok = cfg.prompts.tokenizer
    if tok is not None and not Path(tok).is_absolute() and (path.parent / tok).is_dir():
        # a local tokenizer folder is named relative to the config too (else: a hub name, left as given)
        cfg = cfg.model_copy(update={"prompts": cfg.prompts.model_copy(
            update={"tokenizer": str((path.parent / tok).resolve())})})
    return cfg


def is_placeholder(value: str | None) -> bool:
    return not value or not value.strip() or bool(_PLACEHOLDER_PATH.search(value))


def check_live(cfg: SweepConfig, src: str = "<config>") -> None:
    """What the live backend needs beyond the schema: real model paths, a launch line per arm."""
    if is_placeholder(cfg.model):
        raise ConfigError(f"{src}: model: fill in the target model's path (got {cfg.model!r})")
    for i, arm in enumerate(cfg.arms):
        if arm.shares:
            continue
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
