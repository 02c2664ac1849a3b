"""Small files written whole or not at all: a temporary file beside the target, synced, renamed.

A crash leaves the old file or the new one, never half of either.  (Results tables and
request logs stream their own way: `results.ResultsWriter`, `bench.write_requests`.)
"""

from __future__ import annotations

import json
import os
from pathlib import Path


def write_text(path: str | Path, text: str) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with tmp.open("w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)  # only left when the write failed
    return path


def write_json(path: str | Path, data, indent: int = 2) -> Path:
    return write_text(path, json.dumps(data, indent=indent, default=str) + "\n")
