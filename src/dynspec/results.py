"""The one results table: a row per (arm, concurrency, repeat), whatever the backend.

Per-request records from the simulator, the emulator or a live server are reduced
to a row here, with sglang.bench_serving's definitions:
  output_throughput = generated tokens / (last completion - first dispatch)
  steady_output_throughput = tokens streamed while a closed loop holds all C requests in flight
      (after the first C have their first token, up to the last dispatch) / that window, steady_s
  TPOT = (e2e - ttft) / (output tokens - 1)    (requests with more than one token)
  ITL  = gaps between streamed chunks
Warm-up requests never reach these functions.
"""

from __future__ import annotations

import csv
import io
import math
import os
import re
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from dynspec.io.atomic import open_append, write_text

# Percentiles every results file carries (TTFT, TPOT, ITL, E2E): 50 is the "median" column.
# A config may ask for more; each adds its own columns after these (extra_columns).
DEFAULT_PERCENTILES = (50.0, 90.0, 95.0, 99.0)
LATENCIES = ("ttft", "tpot", "itl", "e2e")
# Column order of every results file.  Names follow sglang.bench_serving where it has one.
# request_rate is the level's offered rate in requests/s: inf for a closed-loop level (as
# bench_serving records it), where concurrency is the level; for an open-loop level
# concurrency is the cap on requests in flight (0: none).
ID_COLUMNS = ["run_id", "arm", "policy", "backend", "profile", "concurrency", "request_rate", "repeat"]
METRIC_COLUMNS = [
    "completed", "failed", "duration_s", "total_input_tokens", "total_output_tokens",
    "output_throughput", "request_throughput", "request_goodput", "slo_attainment",
    *[f"{s}_{m}_ms" for m in LATENCIES for s in ("mean", "median", "p90", "p95", "p99")],
    "accept_length", "spec_step_fraction", "switches", "emulator_lag_s", "error",
    "steady_output_throughput", "steady_s",
]
# emulator_lag_s: how far an emulator fell behind its profile during the level (rows' clock); an
# emulated level lagging more than EMULATOR_LAG_LIMIT of its duration measured a slower server.
EMULATOR_LAG_LIMIT = 0.02
RESULT_COLUMNS = ID_COLUMNS + METRIC_COLUMNS
# The schema from 2026-11-30 to 2026-12-06 (no steady window): still read, those columns NaN.
PREVIOUS_COLUMNS = [c for c in RESULT_COLUMNS if c not in ("steady_output_throughput", "steady_s")]
TEXT_COLUMNS = ["run_id", "arm", "policy", "backend", "profile", "error"]
# The schema before 2026-11-30 (median and p99 only, no rates, no goodput): still read, its
# missing columns NaN (request_rate inf: every level then was closed-loop).
LEGACY_COLUMNS = [
    "run_id", "arm", "policy", "backend", "profile", "concurrency", "repeat",
    "completed", "failed", "duration_s", "total_input_tokens", "total_output_tokens",
    "output_throughput", "request_throughput",
    *[f"{s}_{m}_ms" for m in LATENCIES for s in ("mean", "median", "p99")],
    "accept_length", "spec_step_fraction", "switches", "error",
]
_EXTRA = re.compile(r"p(\d{1,2}(?:\.\d{1,3})?|100)_(ttft|tpot|itl|e2e)_ms")


def percentile_label(p: float) -> str:
    """50 -> "median", 99 -> "p99", 99.9 -> "p99.9": the column prefix of a percentile."""
    return "median" if p == 50 else f"p{p:g}"


def extra_columns(percentiles) -> list[str]:
    """Columns a list of percentiles adds beyond the fixed ones."""
    fixed = set(DEFAULT_PERCENTILES)
    return [f"{percentile_label(p)}_{m}_ms" for m in LATENCIES for p in sorted(set(percentiles)) if p not in fixed]


def _known(columns: list[str]) -> bool:
    """A header this module reads: the current or legacy columns, then extra percentile columns."""
    for base in (RESULT_COLUMNS, PREVIOUS_COLUMNS, LEGACY_COLUMNS):
        if columns[:len(base)] == base and all(_EXTRA.fullmatch(c) for c in columns[len(base):]):
            return True
    return False


@dataclass
class RequestRecord:
    """One measured request.  Times in seconds on one clock (wall or virtual)."""

    start: float  # dispatch
    end: float  # completion (or failure)
    output_tokens: int = 0
    input_tokens: int = 0
    ttft: float | None = None
    itls: list[float] = field(default_factory=list)
    ok: bool = True
    error: str = ""
    # A digest of the generated token ids where the server streams them (SGLang's /generate): with
    # greedy sampling, the same prompt must give the same digest on every arm (dynspec.live.identity).
    output_digest: str = ""

    @property
    def e2e(self) -> float:
        return self.end - self.start

    def to_dict(self) -> dict:
        return asdict(self)

    def in_profile_time(self, time_scale: float) -> "RequestRecord":
        """This request on the profile's clock, from an emulator that ran `time_scale` times faster:
        every time multiplied by it, so TTFT, TPOT, throughput and SLOs mean what they would on
        the machine the profile describes."""
        return replace(self, start=self.start * time_scale, end=self.end * time_scale,
                       ttft=None if self.ttft is None else self.ttft * time_scale,
                       itls=[x * time_scale for x in self.itls])


def _stats(prefix: str, values: Sequence[float], percentiles) -> dict[str, float]:
    ps = sorted(set(DEFAULT_PERCENTILES) | set(percentiles))
    if len(values) == 0:
        return {f"mean_{prefix}_ms": math.nan, **{f"{percentile_label(p)}_{prefix}_ms": math.nan for p in ps}}
    a = np.asarray(values, dtype=float) * 1000.0
    q = np.percentile(a, ps)
    return {f"mean_{prefix}_ms": float(a.mean()),
            **{f"{percentile_label(p)}_{prefix}_ms": float(v) for p, v in zip(ps, q)}}


def _tpot(r: RequestRecord) -> float | None:
    return (r.e2e - r.ttft) / (r.output_tokens - 1) if r.ttft is not None and r.output_tokens > 1 else None


def good_requests(requests: Sequence[RequestRecord], slo: dict[str, float]) -> int:
    """Requests that succeeded and met every given SLO (ms; keys ttft, tpot, e2e), as vLLM's
    --goodput: a request of one output token counts TPOT 0."""
    n = 0
    for r in requests:
        if not r.ok or r.ttft is None:
            continue
        got = {"ttft": r.ttft, "tpot": _tpot(r) or 0.0, "e2e": r.e2e}
        if all(got[k] * 1000.0 <= v for k, v in slo.items()):
            n += 1
    return n


def _token_times(r: RequestRecord) -> np.ndarray:
    """When each output token of a request arrived: what the first chunk carried at its first token,
    then one per inter-token gap (evenly spread from first token to end where the gaps do not add up)."""
    first = r.start + (r.ttft or 0.0)
    n, gaps = r.output_tokens, len(r.itls)
    if 0 <= gaps < n:
        return first + np.concatenate([np.zeros(n - gaps), np.cumsum(np.asarray(r.itls, dtype=float))])
    return np.linspace(first, r.end, n)


def steady_window(requests: Sequence[RequestRecord], concurrency: int) -> tuple[float, float]:
    """(tokens per second, seconds) while a closed loop of `concurrency` clients keeps every client
    waiting on the server: from the moment the first wave's last request has its first token to the
    last dispatch.  The first wave's prefills and the drain, whose length hangs on which request
    happened to go last, are left out.  NaN where the level has no such window."""
    reqs = sorted(requests, key=lambda r: r.start)
    ok = [r for r in reqs if r.ok and r.ttft is not None]
    if concurrency < 1 or len(ok) != len(reqs) or len(reqs) <= concurrency:
        return math.nan, math.nan
    t0 = max(r.start + (r.ttft or 0.0) for r in reqs[:concurrency])
    t1 = reqs[-1].start
    if t1 <= t0:
        return math.nan, math.nan
    tokens = 0
    for r in ok:
        times = _token_times(r)
        tokens += int(np.searchsorted(times, t1, side="right") - np.searchsorted(times, t0, side="right"))
    return tokens / (t1 - t0), t1 - t0


def summarize(
    requests: Iterable[RequestRecord],
    *,
    concurrency: int | None = None,
    percentiles=DEFAULT_PERCENTILES,
    slo: dict[str, float] | None = None,
    accept_length: float = math.nan,
    spec_step_fraction: float = math.nan,
    switches: float = math.nan,
    error: str = "",
) -> dict:
    """Reduce per-request records to the metric columns of one results row.

    slo (ms, keys among ttft, tpot, e2e): request_goodput is the requests per second that
    met all of them, slo_attainment their share of every measured request (failed included).
    concurrency: a closed loop's C, for the steady window (steady_window); None for an open loop.
    """
    reqs = list(requests)
    ok = [r for r in reqs if r.ok]
    out_tokens = sum(r.output_tokens for r in ok)
    if ok:
        duration = max(r.end for r in ok) - min(r.start for r in reqs)
    else:
        duration = math.nan
    rated = bool(ok) and duration > 0
    good = good_requests(reqs, slo) if slo else None
    row: dict[str, float | str] = {
        "completed": len(ok),
        "failed": len(reqs) - len(ok),
        "duration_s": duration,
        "total_input_tokens": sum(r.input_tokens for r in ok),
        "total_output_tokens": out_tokens,
        "output_throughput": out_tokens / duration if rated else math.nan,
        "request_throughput": len(ok) / duration if rated else math.nan,
        "request_goodput": good / duration if good is not None and rated else (0.0 if good == 0 else math.nan),
        "slo_attainment": good / len(reqs) if good is not None and reqs else math.nan,
    }
    row.update(_stats("ttft", [r.ttft for r in ok if r.ttft is not None], percentiles))
    row.update(_stats("tpot", [t for t in map(_tpot, ok) if t is not None], percentiles))
    row.update(_stats("itl", [x for r in ok for x in r.itls], percentiles))
    row.update(_stats("e2e", [r.e2e for r in ok], percentiles))
    row.update(accept_length=accept_length, spec_step_fraction=spec_step_fraction,
               switches=switches, error=error)
    steady, steady_s = steady_window(reqs, concurrency) if concurrency else (math.nan, math.nan)
    row.update(steady_output_throughput=steady, steady_s=steady_s)
    return row


def make_row(ids: dict, metrics: dict) -> dict:
    """A full results row in column order (extra percentile columns last, as given); unknown keys
    are refused, missing ones are NaN (request_rate: inf, a closed-loop level)."""
    extra = [k for k in metrics if k not in METRIC_COLUMNS and _EXTRA.fullmatch(k)]
    unknown = set(ids) - set(ID_COLUMNS) | set(metrics) - set(METRIC_COLUMNS) - set(extra)
    if unknown:
        raise ValueError(f"unknown result columns: {', '.join(sorted(unknown))}")
    merged = {"request_rate": math.inf, **ids, **metrics}
    return {c: merged.get(c, "" if c in TEXT_COLUMNS else math.nan) for c in RESULT_COLUMNS + extra}


def _split(row: dict) -> tuple[dict, dict]:
    return {k: v for k, v in row.items() if k in ID_COLUMNS}, {k: v for k, v in row.items() if k not in ID_COLUMNS}


class ResultsWriter:
    """Appends rows to a CSV, flushed and fsynced per row, so a crash loses none.

    columns: RESULT_COLUMNS plus any extra percentile columns (extra_columns).  A partly
    written last line (a crash mid-write) is dropped when the file is reopened; a file with
    other columns (the legacy schema, other percentiles) is rewritten in these, values kept.
    """

    def __init__(self, path: str | Path, columns: list[str] | None = None):
        self.path = Path(path)
        self.columns = list(columns or RESULT_COLUMNS)
        if not _known(self.columns):
            raise ValueError(f"not a results schema: {', '.join(self.columns)}")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists() and self.path.stat().st_size:
            self._repair()
        else:
            self._write_text(",".join(self.columns) + "\n")

    def _write_text(self, text: str) -> None:
        write_text(self.path, text)

    def _repair(self) -> None:
        rows, torn, header = _read(self.path)
        text = self.path.read_text()
        if header != self.columns:
            buf = io.StringIO(newline="")
            w = csv.DictWriter(buf, fieldnames=self.columns, restval="nan", extrasaction="ignore")
            w.writeheader()
            w.writerows(rows)
            self._write_text(buf.getvalue())
        elif torn:
            self._write_text(text[: text.rfind("\n") + 1])
        elif not text.endswith("\n"):  # a whole last row that lost only its newline stays
            self._write_text(text + "\n")

    def append(self, row: dict) -> None:
        row = make_row(*_split(row))
        buf = io.StringIO(newline="")
        csv.DictWriter(buf, fieldnames=self.columns, restval="nan", extrasaction="ignore").writerow(row)
        try:
            with open_append(self.path) as f:  # one write per row; never through a link
                f.write(buf.getvalue().encode())
                f.flush()
                os.fsync(f.fileno())
        except OSError as exc:
            if exc.filename:
                raise
            raise OSError(exc.errno, exc.strerror, str(self.path)) from None  # a write's error names no file

    def done_keys(self) -> set[tuple[str, int, float, int]]:
        """(arm, concurrency, request_rate, repeat) already measured: what --resume skips."""
        return {level_key(r) for r in read_rows(self.path)[0]}


def level_key(row: dict) -> tuple[str, int, float, int]:
    """A row's level: (arm, concurrency, request_rate, repeat)."""
    return row["arm"], int(row["concurrency"]), float(row["request_rate"]), int(row["repeat"])


def _row_problem(record: list[str], header: list[str]) -> str:
    """Why a CSV record is not a results row ("" when it is one)."""
    if len(record) != len(header):
        return f"{len(record)} fields, not {len(header)}"
    row = dict(zip(header, record))
    for c in ("concurrency", "repeat"):
        if not row[c].isdigit():
            return f"{c} is {row[c][:20]!r}"
    for c in header:
        if c not in TEXT_COLUMNS and c not in ("concurrency", "repeat") and row[c] not in ("", "nan"):
            try:
                float(row[c])
            except ValueError:
                return f"{c} is {row[c][:20]!r}"
    return ""


def _read(path: Path) -> tuple[list[dict], bool, list[str]]:
    from dynspec.io.jsonl import read_text

    text = read_text(path, ValueError)
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        records = [(reader.line_num, rec) for rec in reader]  # line_num: the record's last line
    except csv.Error as exc:
        raise ValueError(f"{path}:{reader.line_num}: not a results row ({exc})") from None
    if not records or not _known(records[0][1]):
        raise ValueError(f"{path}: not a dynspec results file (header differs)")
    header = records[0][1]
    rows, torn = [], False
    for i, (line, rec) in enumerate(records[1:], 1):
        problem = _row_problem(rec, header)
        if problem and i == len(records) - 1 and not text.endswith("\n"):
            torn = True
        elif problem:
            raise ValueError(f"{path}:{line}: not a results row ({problem})")
        else:
            row = {c: "" if c in TEXT_COLUMNS else "nan" for c in RESULT_COLUMNS}
            row["request_rate"] = "inf"
            row.update(zip(header, rec))
            rows.append(row)
    return rows, torn, header


def read_rows(path: Path) -> tuple[list[dict], bool]:
    """The rows of a results file (every current column, legacy files' missing ones NaN) and
    whether its last line is half-written (a crash mid-append: no newline and not a whole row).
    ValueError naming the file (and line) for anything else."""
    rows, torn, _ = _read(path)
    return rows, torn


def write_table(rows: Sequence[dict], path: str | Path) -> Path:
    """Write rows to .csv or .parquet, whole or not at all (dynspec.io.atomic)."""
    import pandas as pd

    path = Path(path)
    if path.suffix not in (".csv", ".parquet"):
        raise ValueError(f"{path}: results go to a .csv or .parquet file")
    if len(path.name.encode()) > 250:  # refused before any folder is made for it
        raise ValueError(f"{str(path)[:60]}...: file name too long")
    path.parent.mkdir(parents=True, exist_ok=True)
    full = [make_row(*_split(r)) for r in rows]
    extra = sorted({k for r in full for k in r} - set(RESULT_COLUMNS), key=lambda c: (c.split("_")[1], c))
    df = pd.DataFrame(full, columns=RESULT_COLUMNS + extra)
    from dynspec.io.atomic import write_frame

    return write_frame(path, df)


def read_table(path: str | Path):
    """Read a results file (.csv or .parquet) into a DataFrame with the schema's columns."""
    import pandas as pd

    path = Path(path)
    if path.suffix == ".parquet":
        df = pd.read_parquet(path)
    else:
        # The csv module writes NaN as "nan" (ResultsWriter); only numeric columns may be missing.
        header = pd.read_csv(path, nrows=0, keep_default_na=False).columns
        na = {c: ["", "nan", "NaN"] for c in header if c not in TEXT_COLUMNS}
        df = pd.read_csv(path, keep_default_na=False, na_values=na, dtype={c: str for c in TEXT_COLUMNS})
    if list(df.columns[:len(LEGACY_COLUMNS)]) == LEGACY_COLUMNS and "request_rate" not in df.columns:
        df.insert(ID_COLUMNS.index("request_rate"), "request_rate", math.inf)  # the legacy schema: closed loop
    missing = [c for c in RESULT_COLUMNS if c not in df.columns]
    if missing and all(c in df.columns for c in LEGACY_COLUMNS):
        for c in missing:  # older schemas: what they did not measure
            df[c] = math.nan
        df = df[RESULT_COLUMNS + [c for c in df.columns if c not in RESULT_COLUMNS]]
    elif missing:
        raise ValueError(f"{path}: missing result columns: {', '.join(missing)}")
    for c in TEXT_COLUMNS:
        df[c] = df[c].astype(object).where(df[c].notna(), "").astype(str)
    return df


def closed_loop(df):
    """The closed-loop rows of a results DataFrame (request_rate inf, or missing in old tables):
    the levels that concurrency alone describes."""
    import pandas as pd

    if "request_rate" not in df:
        return df
    rate = pd.to_numeric(df["request_rate"], errors="coerce")
    return df[rate.isna() | (rate == math.inf)]


def open_loop(df):
    """The open-loop rows (a finite offered request_rate)."""
    import pandas as pd

    if "request_rate" not in df:
        return df.iloc[0:0]
    rate = pd.to_numeric(df["request_rate"], errors="coerce")
    return df[rate.notna() & (rate != math.inf)]


def wall_clock_problem(run_dir: str | Path) -> str:
    """Why a run's rows are not on its profile's clock ("" when they are, or it has no profile).

    An emulated run at time_scale X from before rows were scaled back (run.json without
    `clock: profile`) holds throughputs X times and latencies 1/X times the profile's: fitting,
    tuning or drawing it beside measurements would be off by X."""
    import json

    import yaml

    run_dir = Path(run_dir)
    try:
        info = json.loads((run_dir / "run.json").read_text())
        config = yaml.safe_load((run_dir / "config.yaml").read_text())
        scale = float(((config or {}).get("emulate") or {}).get("time_scale", 1.0))
    except (OSError, ValueError, TypeError, AttributeError, yaml.YAMLError):
        return ""  # not a sweep's run folder: nothing known about its clock
    if isinstance(info, dict) and info.get("backend") == "emulate" and info.get("clock") != "profile" \
            and scale != 1.0:
        return (f"{run_dir}: measured on the wall clock of an emulator {scale:g}x faster than its profile "
                f"(throughputs {scale:g}x the profile's); rerun it: runs now write the profile's clock")
    return ""
