"""A long run that a crash does not lose: each finished unit of work appended to a JSON Lines file.

    {"config": {...}}                       line 1: what the run is (the caller's resolved config)
    {"key": "member:7", "rows": [...]}      one line per finished unit, fsynced as it finishes

Reopened with the same config, the units already there are handed back and not run again; with
another config the journal is refused in one line and left as it is (two runs' rows mixed
silently would be worse than starting over).  A half-written last line, what a crash mid-append
leaves, is dropped on reopening.  The config should name the code that made the rows
(`code_digest`), so a resumed run never joins rows of code that has since changed.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from dynspec.io.atomic import open_append, write_text
from dynspec.io.jsonl import loads, read_text


class JournalError(ValueError):
    """A journal that cannot be resumed: another run's, or not a journal."""


def code_digest(root: str | Path | None = None) -> str:
    """sha256 over the dynspec package's Python sources (paths and bytes): results simulated by
    the same code have the same digest, whatever the git state."""
    root = Path(root) if root is not None else Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for p in sorted(root.rglob("*.py")):
        h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


class Journal:
    """done: the rows of each unit finished so far, by key; add() appends one more."""

    def __init__(self, path: str | Path, config: dict):
        self.path = Path(path)
        self.config = json.loads(json.dumps(config))  # as it reads back: tuples become lists
        self.done: dict[str, list[dict]] = {}
        if self.path.exists() and self.path.stat().st_size:
            self._resume()
        else:
            write_text(self.path, json.dumps({"config": self.config}) + "\n")

    def _resume(self) -> None:
        text = read_text(self.path, JournalError)
        lines = text.split("\n")
        torn = not text.endswith("\n")  # a crash mid-append: the last line is not whole
        whole = lines[:-1]  # text ends with "\n" or the last piece is torn: either way not a whole line
        first = loads(whole[0], f"{self.path}:1", JournalError) if whole else None
        if not isinstance(first, dict) or not isinstance(first.get("config"), dict):
            raise JournalError(f"{self.path}: not a dynspec journal (no config on line 1)")
        if first["config"] != self.config:
            differ = sorted(k for k in set(first["config"]) | set(self.config)
                            if first["config"].get(k) != self.config.get(k))
            raise JournalError(f"{self.path}: made by another run (differs in {', '.join(differ)}); "
                               "remove it to start over, or run with the options that made it")
        for i, line in enumerate(whole[1:], 2):
            entry = loads(line, f"{self.path}:{i}", JournalError)
            if not isinstance(entry, dict) or not isinstance(entry.get("key"), str) or not isinstance(entry.get("rows"), list):
                raise JournalError(f"{self.path}:{i}: not a journal entry (needs key and rows)")
            self.done[entry["key"]] = entry["rows"]
        if torn:
            write_text(self.path, "".join(f"{line}\n" for line in whole))

    def add(self, key: str, rows: list[dict]) -> None:
        line = json.dumps({"key": key, "rows": rows}, default=_scalar) + "\n"
        with open_append(self.path) as f:  # one write; flushed and synced before the next unit starts
            f.write(line.encode())
            f.flush()
            os.fsync(f.fileno())
        self.done[key] = json.loads(line)["rows"]


def _scalar(value: object) -> object:
    """numpy's scalars as the Python numbers they hold (json knows only Python's)."""
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON data")
