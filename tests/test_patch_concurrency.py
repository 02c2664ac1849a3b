"""benchmarks/patch_concurrency.py: many patch commands at once on the sglang 0.5.9 wheel's files, and
the checks it makes afterwards, which must see a half-patched tree."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from benchmark_scripts import load

from dynspec.realsglang.wheels import unpack
from dynspec.sglang import patching

bench = load("patch_concurrency")


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    return unpack("0.5.9", tmp_path_factory.mktemp("wheel") / "site")


def test_a_half_patched_tree_is_seen(pristine, tmp_path):
    site = tmp_path / "site"
    shutil.copytree(pristine, site, symlinks=True)
    assert bench.manifest_side(site) == "unpatched"
    assert patching.do_apply(patching.find_sglang(site)).code == patching.EXIT_OK
    assert bench.manifest_side(site) == "patched"
    one = sorted(patching.load_patchset("0.5.9").files)[0]
    shutil.copy2(pristine / one, site / one)  # one file back to upstream, the others patched
    assert bench.manifest_side(site) == "half"


@pytest.mark.parametrize("op, rc, out, err, kind", [
    ("apply", 2, "", "refused: another dynspec patch command (pid 7) is working on x; nothing changed",
     "refused by the lock"),
    ("apply", 0, "patched: sglang 0.5.9 at x: 3 files; upstream copies kept in y for revert", "", "applied"),
    ("revert", 0, "reverted: sglang 0.5.9 at x: 3 files restored byte for byte", "", "reverted"),
    ("revert", 0, "not patched: sglang 0.5.9 at x; nothing to revert", "", "already there"),
    ("apply", 0, "already patched: sglang 0.5.9 at x; nothing changed", "", "already there"),
    ("apply", 2, "", "refused: sglang 0.5.9 at x is foreign-modified: ...; nothing changed", "failed"),
])
def test_each_command_is_counted_by_what_it_did(op, rc, out, err, kind):
    assert bench.classify(op, subprocess.CompletedProcess([], rc, out, err)) == kind


@pytest.mark.slow  # a dozen dynspec processes at once
def test_commands_at_once_leave_the_tree_whole(capsys):
    assert bench.main(["--commands", "12", "--rounds", "1", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    assert "failed 0, half-patched trees 0" in out and "refused by the lock" in out
