"""Every sample output in README.md and docs/ is what its command prints today
(scripts/doc_samples.py; `--write` refreshes them)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("doc_samples", ROOT / "scripts" / "doc_samples.py")
doc_samples = importlib.util.module_from_spec(spec)
sys.modules["doc_samples"] = doc_samples  # dataclasses look their module up there
spec.loader.exec_module(doc_samples)

SAMPLES = doc_samples.samples()


def test_the_docs_hold_samples():
    assert len(SAMPLES) >= 2, "a sample marker was lost from the docs"


@pytest.mark.parametrize("sample", SAMPLES, ids=[f"{s.path.name}:{s.cmd[:40]}" for s in SAMPLES])
def test_sample_matches_what_the_command_prints(sample):
    assert sample.run() == sample.shown, f"stale: run `python scripts/doc_samples.py --write` ({sample.cmd})"


def test_a_stale_sample_is_found_and_rewritten(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("before\n<!-- sample: dynspec policy check never -->\n```\nok: always\n```\nafter\n")
    (s,) = doc_samples.samples([doc])
    assert s.run() == "ok: never\n" != s.shown
