"""dynspec.analysis.cache: a table is computed once per inputs and code, and a broken cache only costs time."""

from __future__ import annotations


import pandas as pd
import pytest

from dynspec.analysis import cache


@pytest.fixture
def calls(tmp_path, monkeypatch):
    monkeypatch.setenv("DYNSPEC_CACHE", str(tmp_path / "c"))
    made = []

    def compute(x):
        def f():
            made.append(x)
            return pd.DataFrame({"profile": ["p"], "worst: of envelope": [0.97 + x], "at C": [16]})
        return f
    return made, compute


def test_the_same_inputs_and_code_compute_once(calls, monkeypatch):
    made, compute = calls
    first = cache.cached_table("t", compute(0.0), "p", [1, 2])
    again = cache.cached_table("t", compute(0.0), "p", [1, 2])
    pd.testing.assert_frame_equal(first, again)
    assert made == [0.0]
    cache.cached_table("t", compute(0.01), "p", [1, 2, 4])  # other levels: another table
    assert made == [0.0, 0.01]
    monkeypatch.setattr(cache, "code_digest", lambda: "changed code")  # the simulator changed
    assert cache.cached_table("t", compute(0.02), "p", [1, 2])["worst: of envelope"].iloc[0] == pytest.approx(0.99)
    assert made == [0.0, 0.01, 0.02]


def test_a_corrupt_or_unwritable_cache_is_recomputed_not_an_error(calls, tmp_path, monkeypatch):
    made, compute = calls
    cache.cached_table("t", compute(0.0), "k")
    (f,) = (tmp_path / "c" / "t").iterdir()
    f.write_text("{not json")
    assert cache.cached_table("t", compute(0.0), "k")["at C"].iloc[0] == 16
    assert len(made) == 2

    def full_disk(path, text):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(cache, "write_text", full_disk)
    assert cache.cached_table("t", compute(0.0), "other")["at C"].iloc[0] == 16
    assert len(made) == 3


def test_the_code_digest_changes_with_a_module_or_a_profile_and_nothing_else(tmp_path):
    import shutil
    from pathlib import Path

    pkg = tmp_path / "dynspec"
    shutil.copytree(Path(cache.__file__).parents[1], pkg, ignore=shutil.ignore_patterns("__pycache__"))
    d0 = cache.tree_digest(pkg)
    assert d0 == cache.code_digest()  # the installed package's digest is this tree's
    (pkg / "__pycache__").mkdir()
    (pkg / "sim" / "__pycache__").mkdir()
    (pkg / "sim" / "__pycache__" / "engine.cpython-311.pyc").write_bytes(b"compiled")
    assert cache.tree_digest(pkg) == d0
    with open(pkg / "sim" / "engine.py", "a") as f:
        f.write("# a change to the simulator\n")
    d1 = cache.tree_digest(pkg)
    assert d1 != d0
    with open(pkg / "sim" / "profiles" / "seed-blackwell.yaml", "a") as f:
        f.write("# a refit\n")
    assert cache.tree_digest(pkg) not in (d0, d1)
