"""JSON and JSON Lines in, bounded: a file that is not UTF-8 JSON, or nests too deeply, is a one-line error."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path


def loads(text: str, where: str, error: type[Exception]) -> object:
    """One JSON value; error("WHERE: not JSON (why)") for bad syntax or nesting deep enough to
    exhaust the parser's recursion (a few kilobytes of brackets do)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"{where}: not JSON ({exc.msg} at line {exc.lineno})") from None
    except RecursionError:
        raise error(f"{where}: not JSON (nested too deeply)") from None


def read_text(path: Path, error: type[Exception]) -> str:
    """A file's text; error naming the file when it cannot be read or is not UTF-8."""
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise error(f"{path}: cannot read ({exc.strerror or exc})") from None


def read_json(path: Path, error: type[Exception]) -> object:
    """A JSON file's value; error("PATH: why") when it is unreadable, not UTF-8 or not JSON."""
    return loads(read_text(path, error), str(path), error)


def read_jsonl(path: Path, error: type[Exception]) -> Iterator[tuple[int, object]]:
    """(line number, value) for each non-blank line of path; raises error("PATH:N: not JSON (why)")."""
    for i, line in enumerate(read_text(path, error).splitlines(), 1):
        if line.strip():
            yield i, loads(line, f"{path}:{i}", error)
