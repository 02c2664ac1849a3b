"""The one results table: a row per (arm, concurrency, repeat), whatever the backend.

Per-request records from the simulator, the emulator or a live server are reduced
to a row here, with sglang.bench_serving's definitions:
  output_throughput = generated tokens / (last completion - first dispatch)
  TPOT = (e2e - ttft) / (output tokens - 1)    (requests with more than one token)
  ITL  = gaps between streamed chunks
Warm-up requests never reach these functions.
"""

from __future__ import annotations

import csv
import io
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from dynspec.atomic import open_append, write_text

# Column order of every results file.  Names follow sglang.bench_serving where it has one.
ID_COLUMNS = ["run_id", "arm", "policy", "backend", "profile", "concurrency", "repeat"]
METRIC_COLUMNS = [
    "completed", "failed", "duration_s", "total_input_tokens", "total_output_tokens",
    "output_throughput", "request_throughput",
    *[f"{s}_{m}_ms" for m in ("ttft", "tpot", "itl", "e2e") for s in ("mean", "median", "p99")],
    "accept_length", "spec_step_fraction", "switches", "error",
]
RESULT_COLUMNS = ID_COLUMNS + METRIC_COLUMNS
TEXT_COLUMNS = ["run_id", "arm", "policy", "backend", "profile", "error"]


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

    @property
    def e2e(self) -> float:
        return self.end - self.start

    def to_dict(self) -> dict:
        return asdict(self)


def _stats(prefix: str, values: Sequence[float]) -> dict[str, float]:
    if len(values) == 0:
        return {f"mean_{prefix}_ms": math.nan, f"median_{prefix}_ms": math.nan, f"p99_{prefix}_ms": math.nan}
    a = np.asarray(values, dtype=float) * 1000.0
    return {
        f"mean_{prefix}_ms": float(a.mean()),
        f"median_{prefix}_ms": float(np.median(a)),
        f"p99_{prefix}_ms": float(np.percentile(a, 99)),
    }


def summarize(
    requests: Iterable[RequestRecord],
    *,
    accept_length: float = math.nan,
    spec_step_fraction: float = math.nan,
    switches: float = math.nan,
    error: str = "",
) -> dict:
    """Reduce per-request records to the metric columns of one results row."""
    reqs = list(requests)
    ok = [r for r in reqs if r.ok]
    out_tokens = sum(r.output_tokens for r in ok)
    if ok:
        duration = max(r.end for r in ok) - min(r.start for r in reqs)
    else:
        duration = math.nan
    row = {
        "completed": len(ok),
        "failed": len(reqs) - len(ok),
        "duration_s": duration,
        "total_input_tokens": sum(r.input_tokens for r in ok),
        "total_output_tokens": out_tokens,
        "output_throughput": out_tokens / duration if ok and duration > 0 else math.nan,
        "request_throughput": len(ok) / duration if ok and duration > 0 else math.nan,
    }
    row.update(_stats("ttft", [r.ttft for r in ok if r.ttft is not None]))
    row.update(_stats("tpot", [(r.e2e - r.ttft) / (r.output_tokens - 1)
                               for r in ok if r.ttft is not None and r.output_tokens > 1]))
    row.update(_stats("itl", [x for r in ok for x in r.itls]))
    row.update(_stats("e2e", [r.e2e for r in ok]))
    row.update(accept_length=accept_length, spec_step_fraction=spec_step_fraction,
               switches=switches, error=error)
    return row


def make_row(ids: dict, metrics: dict) -> dict:
    """A full results row in column order; unknown keys are refused, missing ones are NaN."""
    extra = set(ids) - set(ID_COLUMNS) | set(metrics) - set(METRIC_COLUMNS)
    if extra:
        raise ValueError(f"unknown result columns: {', '.join(sorted(extra))}")
    merged = {**ids, **metrics}
    return {c: merged.get(c, "" if c in TEXT_COLUMNS else math.nan) for c in RESULT_COLUMNS}


class ResultsWriter:
    """Appends rows to a CSV, flushed and fsynced per row, so a crash loses none.

    A partly written last line (a crash mid-write) is dropped when the file is reopened.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists() and self.path.stat().st_size:
            self._repair()
        else:
            self._write_text(",".join(RESULT_COLUMNS) + "\n")

    def _write_text(self, text: str) -> None:
        write_text(self.path, text)

    def _repair(self) -> None:
        _, torn = read_rows(self.path)
        text = self.path.read_text()
        if torn:
            self._write_text(text[: text.rfind("\n") + 1])
        elif not text.endswith("\n"):  # a whole last row that lost only its newline stays
            self._write_text(text + "\n")

    def append(self, row: dict) -> None:
        row = make_row({k: v for k, v in row.items() if k in ID_COLUMNS},
                       {k: v for k, v in row.items() if k not in ID_COLUMNS})
        buf = io.StringIO(newline="")
        csv.DictWriter(buf, fieldnames=RESULT_COLUMNS).writerow(row)
        with open_append(self.path) as f:  # one write per row; never through a link
            f.write(buf.getvalue().encode())
            f.flush()
            os.fsync(f.fileno())

    def done_keys(self) -> set[tuple[str, int, int]]:
        """(arm, concurrency, repeat) already measured: what --resume skips."""
        return {(r["arm"], int(r["concurrency"]), int(r["repeat"])) for r in read_rows(self.path)[0]}


def _row_problem(record: list[str]) -> str:
    """Why a CSV record is not a results row ("" when it is one)."""
    if len(record) != len(RESULT_COLUMNS):
        return f"{len(record)} fields, not {len(RESULT_COLUMNS)}"
    row = dict(zip(RESULT_COLUMNS, record))
    for c in ("concurrency", "repeat"):
        if not row[c].isdigit():
            return f"{c} is {row[c][:20]!r}"
    for c in METRIC_COLUMNS:
        if c != "error" and row[c] not in ("", "nan"):
            try:
                float(row[c])
            except ValueError:
                return f"{c} is {row[c][:20]!r}"
    return ""


def read_rows(path: Path) -> tuple[list[dict], bool]:
    """The rows of a results file and whether its last line is half-written (a crash mid-append:
    no newline and not a whole row).  ValueError naming the file (and line) for anything else."""
    from dynspec.jsonl import read_text

    text = read_text(path, ValueError)
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        records = [(reader.line_num, rec) for rec in reader]  # line_num: the record's last line
    except csv.Error as exc:
        raise ValueError(f"{path}:{reader.line_num}: not a results row ({exc})") from None
    if not records or records[0][1] != RESULT_COLUMNS:
        raise ValueError(f"{path}: not a dynspec results file (header differs)")
    rows, torn = [], False
    for i, (line, rec) in enumerate(records[1:], 1):
        problem = _row_problem(rec)
        if problem and i == len(records) - 1 and not text.endswith("\n"):
            torn = True
        elif problem:
            raise ValueError(f"{path}:{line}: not a results row ({problem})")
        else:
            rows.append(dict(zip(RESULT_COLUMNS, rec)))
    return rows, torn


def write_table(rows: Sequence[dict], path: str | Path) -> Path:
    """Write rows to .csv or .parquet atomically (temp file, then rename)."""
    import pandas as pd

    path = Path(path)
    if path.suffix not in (".csv", ".parquet"):
        raise ValueError(f"{path}: results go to a .csv or .parquet file")
    if len(path.name.encode()) > 250:  # refused before any folder is made for it
        raise ValueError(f"{str(path)[:60]}...: file name too long")
    path.parent.mkdir(parents=True, exist_ok=True)
    df = pd.DataFrame([make_row({k: v for k, v in r.items() if k in ID_COLUMNS},
                                {k: v for k, v in r.items() if k not in ID_COLUMNS}) for r in rows],
                      columns=RESULT_COLUMNS)
    tmp = path.with_name(path.name + ".tmp")
    if path.suffix == ".csv":
        df.to_csv(tmp, index=False)
    else:
        df.to_parquet(tmp, index=False)
    os.replace(tmp, path)
    return path


def read_table(path: str | Path):
    """Read a results file (.csv or .parquet) into a DataFrame with the schema's columns."""
    import pandas as pd

    path = Path(path)
    if path.suffix == ".parquet":
        df = pd.read_parquet(path)
    else:
        # The csv module writes NaN as "nan" (ResultsWriter); only numeric columns may be missing.
        na = {c: ["", "nan", "NaN"] for c in RESULT_COLUMNS if c not in TEXT_COLUMNS}
        df = pd.read_csv(path, keep_default_na=False, na_values=na, dtype={c: str for c in TEXT_COLUMNS})
    missing = [c for c in RESULT_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"{path}: missing result columns: {', '.join(missing)}")
    for c in TEXT_COLUMNS:
        df[c] = df[c].astype(object).where(df[c].notna(), "").astype(str)
    return df
