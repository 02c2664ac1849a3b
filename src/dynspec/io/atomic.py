"""Files written whole or not at all, and appends that never follow a link.

write_text / write_bytes / write_frame / write_json: a new temporary file beside the target (mkstemp: O_EXCL, so a planted name or
symbolic link is never followed), synced, renamed over the target.  A crash leaves the
old file or the new one, never half of either.  open_append: for logs and tables that grow
a line at a time (results.ResultsWriter, the arms' server logs), refusing a link.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any, BinaryIO


def write_text(path: str | Path, text: str) -> Path:
    return write_bytes(path, text.encode("utf-8"))


def write_bytes(path: str | Path, data: bytes) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide results from the group that shares a run folder
        os.replace(tmp, path)
    except OSError as exc:
        if exc.filename:
            raise
        raise OSError(exc.errno, exc.strerror, str(path)) from None  # a write's error names no file
    finally:
        Path(tmp).unlink(missing_ok=True)  # only left when the write failed
    return path


def write_frame(path: str | Path, df: Any) -> Path:
    """A pandas DataFrame to .parquet, else CSV (no index), whole or not at all."""
    parquet = str(path).endswith(".parquet")
    return write_bytes(path, df.to_parquet(index=False) if parquet else df.to_csv(index=False).encode())


def write_json(path: str | Path, data: Any, indent: int = 2) -> Path:
    return write_text(path, json.dumps(data, indent=indent, default=str) + "\n")


def open_append(path: str | Path) -> BinaryIO:
    """path opened to append bytes, created if missing; OSError (ELOOP) if it is a symbolic link."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    return os.fdopen(fd, "ab")


_TEMP = re.compile(r"^\..+\.[A-Za-z0-9_]{8}\.tmp$")  # write_bytes's: .NAME.<mkstemp's 8 characters>.tmp


def remove_stale_temps(folder: str | Path) -> list[Path]:
    """Remove the temporary files an interrupted write_bytes left under folder (a process killed
    between mkstemp and rename runs no cleanup).  Only for a folder the caller holds the lock of:
    another writer's temporary file would go too.  Returns what was removed."""
    gone = []
    for p in Path(folder).rglob(".*.tmp"):
        if _TEMP.match(p.name) and p.is_file() and not p.is_symlink():
            p.unlink(missing_ok=True)
            gone.append(p)
    return gone
