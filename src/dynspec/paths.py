"""Where the repository is, so that notebooks and commands find configs and data from any folder.

Relative paths in notebook parameters are taken from the repository root: the same notebook
runs from the repo root (`papermill notebooks/02_sweep.ipynb ...`), from notebooks/
(Jupyter's default) or from the pipeline, and finds the same files."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]  # src/dynspec/paths.py -> the checkout


def from_repo(path: str | Path | None) -> Path | None:
    """An absolute path as given; a relative one under the repository root; None stays None."""
    if path is None:
        return None
    p = Path(path).expanduser()
    return p if p.is_absolute() else REPO_ROOT / p
