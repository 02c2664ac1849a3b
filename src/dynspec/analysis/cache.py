"""Tables that depend only on dynspec's code and their inputs, computed once and kept.

The report's "By profile" section simulates every shipped profile at a dozen levels (about
20 s); the answer changes only when a profile or the simulator does.  The key is a digest of
the inputs and of every module and profile in the installed dynspec, so any change to the code
recomputes; a cache that cannot be read or written is recomputed, never an error.
Location: $DYNSPEC_CACHE, else ~/.cache/dynspec (outside the checkout: `make report` leaves
`git status` clean)."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

import pandas as pd

from dynspec.io.atomic import write_text


def cache_dir() -> Path:
    return Path(os.environ.get("DYNSPEC_CACHE") or Path.home() / ".cache" / "dynspec")


@lru_cache(maxsize=1)
def code_digest() -> str:
    """A digest of dynspec's own sources and shipped profiles."""
    return tree_digest(Path(__file__).resolve().parents[1])  # src/dynspec, every subpackage


def tree_digest(root: Path) -> str:
    h = hashlib.sha256()
    for f in sorted([*root.rglob("*.py"), *root.glob("sim/profiles/*.yaml")]):
        h.update(f.relative_to(root).as_posix().encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def cached_table(name: str, compute: Callable[[], pd.DataFrame], *inputs) -> pd.DataFrame:
    """compute(), or the table it returned for the same inputs and the same code before.

    inputs: JSON-serializable values that, with the code, determine the table."""
    key = hashlib.sha256(json.dumps([code_digest(), inputs], sort_keys=True, default=str).encode()).hexdigest()
    path = cache_dir() / name / f"{key[:24]}.json"
    try:
        return pd.read_json(path, orient="table")
    except (OSError, ValueError):
        pass
    table = compute()
    try:
        write_text(path, table.to_json(orient="table", index=False))
    except OSError:
        pass  # read-only home, full disk: the table is still right, only not kept
    return table


def envelope_by_profile(profiles, levels) -> pd.DataFrame:
    """crossover.envelope_by_profile, kept per profile set and level list."""
    from dynspec.analysis import crossover

    return cached_table("by-profile", lambda: crossover.envelope_by_profile(profiles, levels),
                        [p.model_dump(mode="json") for p in profiles], list(levels))
