"""The scripts under benchmarks/ and experiments/<study>/ are not a package: tests load one by its
file name."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load(name: str):
    """benchmarks/<name>.py, or a study's experiments/*/<name>.py, as a fresh module (its main()
    and helpers, nothing run)."""
    found = [ROOT / "benchmarks" / f"{name}.py"] + sorted(ROOT.glob(f"experiments/*/{name}.py"))
    path = next(p for p in found if p.is_file())
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
