"""Results made by hand, brought into dynspec's one table.

Two formats: the JSONL that `python -m sglang.bench_serving --output-file F` appends
(one object per run), and the JSON that `vllm bench serve --save-result` writes (one
object per file).  Both already use bench_serving's metric definitions, so the numbers
are copied, not recomputed; what a format lacks is NaN.

`dynspec import-results FILE... --out results.csv` turns them into a results file.
"""

from __future__ import annotations

import json
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from dynspec.io.jsonl import read_json, read_jsonl, read_text
from dynspec.results import make_row, percentile_label
from dynspec.live.server_info import dynspec_state


class ReaderError(ValueError):
    """A results file that cannot be read; one line naming the file (and line) and the problem."""


_METRICS = ("ttft", "tpot", "itl", "e2e")
_MAX_COUNT = 2 ** 53  # counts above this are not exact as floats, and no benchmark runs that many requests


def _num(d: dict, key: str, where: str) -> float:
    """A metric as a finite non-negative float; NaN when the file does not give it."""
    v = d.get(key)
    if v is None:
        return math.nan
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise ReaderError(f"{where}: {key} is {str(v)[:40]!r}, not a finite non-negative number")
    return float(v)


def _count(d: dict, key: str, where: str) -> int:
    v = d.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < _MAX_COUNT:
        raise ReaderError(f"{where}: {key} is {str(v)[:40]!r}, not a count of requests")
    return v


def _policy(server_info, where: str) -> str:
    """What the server ran, as far as its /get_server_info says."""
    if server_info is None:
        return ""
    if not isinstance(server_info, dict):
        raise ReaderError(f"{where}: server_info is a {type(server_info).__name__}, not an object")
    block = dynspec_state(server_info)
    if block and block.get("policy"):
        return str(block["policy"])
    if isinstance(server_info.get("decode"), list) and server_info["decode"]:
        server_info = server_info["decode"][0]
    if not isinstance(server_info, dict):
        raise ReaderError(f"{where}: server_info.decode[0] is not an object")
    if "speculative_algorithm" in server_info:
        return "always" if server_info.get("speculative_algorithm") else "none"
    return ""


def _level(obj: dict, where: str) -> tuple[int, float]:
    """(concurrency, request_rate) of a run: a closed-loop level (--max-concurrency N, rate inf) or
    an open-loop one (--request-rate R, concurrency its cap or 0 for none)."""
    c = obj.get("max_concurrency")
    rate = obj.get("request_rate", math.inf)
    if rate in ("inf", "Infinity", None):
        rate = math.inf
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not rate > 0:
        raise ReaderError(f"{where}: request_rate is {str(rate)[:40]!r}, not a rate in requests/s")
    if c is None and not math.isinf(rate):
        return 0, float(rate)
    if not isinstance(c, int) or isinstance(c, bool) or not 1 <= c < _MAX_COUNT:
        raise ReaderError(f"{where}: max_concurrency is {c!r}; a run is a level with --max-concurrency N "
                          f"(closed loop) or --request-rate R (open loop)")
    return c, float(rate)


def _failed(obj: dict, where: str) -> float:
    if obj.get("failed") is not None:
        return _count(obj, "failed", where)
    errors = obj.get("errors")
    if isinstance(errors, list):
        return sum(1 for e in errors if e)
    return math.nan


def _text(v, where: str) -> str:
    """A name for the arm column: a short string on one line."""
    if not isinstance(v, str) or not v.isprintable() or len(v) > 200:
        raise ReaderError(f"{where}: the arm name {str(v)[:40]!r} is not a printable string of at most 200 characters")
    return v


def _repeat(seen: dict[tuple[str, tuple[int, float]], int], arm: str, c: tuple[int, float]) -> int:
    r = seen.get((arm, c), 0)
    seen[(arm, c)] = r + 1
    return r


def _check(obj, where: str, needed: tuple[str, ...]) -> dict:
    if not isinstance(obj, dict):
        raise ReaderError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    missing = [k for k in needed if k not in obj]
    if missing:
        raise ReaderError(f"{where}: not a benchmark result (missing {', '.join(missing)})")
    return obj


_PCT_KEY = re.compile(r"p(\d{1,2}(?:\.\d{1,3})?)_(ttft|tpot|itl|e2el|e2e_latency)_ms")


def _metrics(obj: dict, accept_key: str, e2e_key: str, where: str) -> dict:
    """The metric columns both tools report, under their own names for some; each checked.
    Percentiles are taken as the file has them (bench_serving 0.5.9: median, p99, p90 E2E,
    p95 ITL; vLLM: its --metric-percentiles), the rest NaN; goodput where vLLM measured it."""
    metrics = {
        "completed": _count(obj, "completed", where), "failed": _failed(obj, where),
        "duration_s": _num(obj, "duration", where),
        "total_input_tokens": _num(obj, "total_input_tokens", where),
        "total_output_tokens": _num(obj, "total_output_tokens", where),
        "output_throughput": _num(obj, "output_throughput", where),
        "request_throughput": _num(obj, "request_throughput", where),
        "request_goodput": _num(obj, "request_goodput", where),
        "accept_length": _num(obj, accept_key, where),
    }
    for m in _METRICS:
        src = e2e_key if m == "e2e" else m
        for s in ("mean", "median"):
            metrics[f"{s}_{m}_ms"] = _num(obj, f"{s}_{src}_ms", where)
    for key in obj:
        hit = _PCT_KEY.fullmatch(key)
        if hit:
            p, m = float(hit.group(1)), hit.group(2)
            m = "e2e" if m in ("e2el", "e2e_latency") else m
            metrics[f"{percentile_label(p)}_{m}_ms"] = _num(obj, key, where)
    return metrics


def bench_serving_row(obj: object, *, where: str, arm: str | None = None, run_id: str = "",
                      profile: str = "", backend: str = "live", repeat: int = 0) -> dict:
    obj = _check(obj, where, ("completed", "duration", "output_throughput", "mean_ttft_ms"))
    c, rate = _level(obj, where)
    metrics = _metrics(obj, "accept_length", "e2e_latency", where)
    ids = dict(run_id=run_id, arm=_text(arm or obj.get("tag") or obj.get("backend") or "bench_serving", where),
               policy=_policy(obj.get("server_info"), where), backend=backend, profile=profile,
               concurrency=c, request_rate=rate, repeat=repeat)
    return make_row(ids, metrics)


def read_bench_serving(path: str | Path, *, arm: str | None = None, run_id: str | None = None,
                       profile: str = "", backend: str = "live") -> list[dict]:
    """Rows from an sglang.bench_serving JSONL file, one per line; repeats numbered in file order."""
    path = Path(path)
    if not path.is_file():
        raise ReaderError(f"{path}: no such file")
    rows: list[dict] = []
    seen: dict[tuple[str, tuple[int, float]], int] = {}
    for i, obj in read_jsonl(path, ReaderError):
        row = bench_serving_row(obj, where=f"{path}:{i}", arm=arm, run_id=run_id or path.stem,
                                profile=profile, backend=backend)
        row["repeat"] = _repeat(seen, row["arm"], (row["concurrency"], row["request_rate"]))
        rows.append(row)
    if not rows:
        raise ReaderError(f"{path}: no results in the file")
    return rows


def vllm_row(obj: object, *, where: str, arm: str | None = None, run_id: str = "", profile: str = "",
             backend: str = "live", repeat: int = 0) -> dict:
    obj = _check(obj, where, ("completed", "duration", "output_throughput"))
    c, rate = _level(obj, where)
    # vLLM's acceptance length counts the bonus token, as SGLang's does.
    metrics = _metrics(obj, "spec_decode_acceptance_length", "e2el", where)
    spec = obj.get("spec_decode_acceptance_length") is not None
    ids = dict(run_id=run_id, arm=_text(arm or obj.get("label") or obj.get("backend") or "vllm", where),
               policy="always" if spec else "", backend=backend, profile=profile, concurrency=c, request_rate=rate,
               repeat=repeat)
    return make_row(ids, metrics)


def read_vllm_bench(path: str | Path, *, arm: str | None = None, run_id: str | None = None,
                    profile: str = "", backend: str = "live") -> list[dict]:
    """One row from a `vllm bench serve --save-result` JSON file."""
    path = Path(path)
    if not path.is_file():
        raise ReaderError(f"{path}: no such file")
    obj = read_json(path, ReaderError)
    return [vllm_row(obj, where=str(path), arm=arm, run_id=run_id or path.stem, profile=profile,
                     backend=backend)]


def read_external(path: str | Path, **kwargs) -> list[dict]:
    """Either format, told apart by content: a JSONL of bench_serving runs or one vLLM JSON object."""
    path = Path(path)
    if not path.is_file():
        raise ReaderError(f"{path}: no such file")
    text = read_text(path, ReaderError).strip()
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError):
        return read_bench_serving(path, **kwargs)  # several lines: JSONL (or not JSON at all: it says where)
    if isinstance(obj, dict) and ("mean_e2e_latency_ms" in obj or "accept_length" in obj):
        return read_bench_serving(path, **kwargs)
    return read_vllm_bench(path, **kwargs)


def merge_repeats(rows: list[dict]) -> list[dict]:
    """Number repeats across files: the n-th run of (arm, concurrency) gets repeat n."""
    seen: dict[tuple[str, tuple[int, float]], int] = {}
    for row in rows:
        row["repeat"] = _repeat(seen, row["arm"], (row["concurrency"], row["request_rate"]))
    return rows


@dataclass(frozen=True)
class ImportConfig:
    """What `dynspec import-results` was asked (its provenance record's config)."""

    files: tuple[Path, ...]
    out: Path
    arm: str | None = None
    run_id: str | None = None
    profile: str = ""

    @classmethod
    def from_args(cls, args) -> "ImportConfig":
        return cls(files=tuple(Path(f) for f in args.files), out=Path(args.out), arm=args.arm, run_id=args.run_id,
                   profile=args.profile)


def _import(args) -> int:
    from dynspec.results import write_table

    cfg = ImportConfig.from_args(args)
    rows = []
    try:
        for f in cfg.files:
            rows += read_external(f, arm=cfg.arm, run_id=cfg.run_id, profile=cfg.profile)
        write_table(merge_repeats(rows), cfg.out)
    except (ReaderError, ValueError, OSError) as exc:
        from dynspec.cli import one_line

        print(f"dynspec import-results: {one_line(exc)}", file=sys.stderr)
        return 2
    from dynspec import provenance

    provenance.write(provenance.beside(cfg.out), "import-results", cfg, argv=provenance.argv_of(args),
                     outputs=[cfg.out])
    print(f"{len(rows)} rows -> {cfg.out}")
    return 0


def add_cli(sub) -> None:
    p = sub.add_parser("import-results", help="sglang.bench_serving JSONL / vLLM bench serve JSON -> results table")
    p.add_argument("files", nargs="+", help="bench_serving --output-file JSONL or vllm --save-result JSON files")
    p.add_argument("--out", required=True, help="results file to write (.csv or .parquet)")
    p.add_argument("--arm", help="arm name for every row (default: the file's tag/label, else its backend)")
    p.add_argument("--run-id", help="run id for every row (default: each file's name)")
    p.add_argument("--profile", default="", help="profile column (what the run measured, if known)")
    p.set_defaults(func=_import)
