"""JSON Lines in, one value per non-blank line; a line that is not JSON is a one-line error."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path


def read_jsonl(path: Path, error: type[Exception]) -> Iterator[tuple[int, object]]:
    """(line number, value) for each non-blank line of path; raises error("PATH:N: not JSON (why)")."""
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield i, json.loads(line)
        except json.JSONDecodeError as exc:
            raise error(f"{path}:{i}: not JSON ({exc.msg})") from None
