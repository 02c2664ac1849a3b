"""Crash-safe patching: a kill at any step of apply or revert is finished by the next command.

Works on a small synthetic SGLang tree and patch set (three files, one in a nested
folder), so the journal logic is tested apart from the contents of any real patch.
A child process runs apply or revert with patch_transaction.AFTER_STEP set to print each step
and sleep; the test kills it (SIGKILL) right after step k, for every k.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dynspec.sglang import patch_transaction, patching

VERSION = "9.9.9"
UPSTREAM = {
    "sglang/srt/a.py": "".join(f"line {i}\n" for i in range(40)),
    "sglang/srt/x/b.py": "".join(f"b {i}\n" for i in range(30)),
    "sglang/c.py": "def f():\n    return 1\n" * 5,
}


def _patched(text: str) -> str:
    lines = text.splitlines(keepends=True)
    lines.insert(3, "# dynspec was here\n")
    lines[10] = lines[10].replace("1", "2") if "1" in lines[10] else "changed\n"
    return "".join(lines)


@pytest.fixture
def tree(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "site"
    (root / "sglang").mkdir(parents=True)
    (root / "sglang" / "__init__.py").write_text("")
    (root / "sglang" / "_version.py").write_text(f'__version__ = "{VERSION}"\n')
    folder = tmp_path / "patches" / f"sglang-{VERSION}"
    folder.mkdir(parents=True)
    for i, (rel, text) in enumerate(UPSTREAM.items(), 1):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
        diff = difflib.unified_diff(text.splitlines(keepends=True), _patched(text).splitlines(keepends=True),
                                    f"a/{rel}", f"b/{rel}")
        (folder / f"000{i}-edit.patch").write_text("".join(diff))
    manifest = patching.build_manifest(VERSION, folder, root)
    (folder / "manifest.json").write_text(json.dumps(manifest))
    monkeypatch.setenv(patching.ENV_PATCHES, str(tmp_path / "patches"))
    return root


def state(root: Path) -> str:
    return patching.status(patching.find_sglang(root)).state


def tree_hashes(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


CHILD = textwrap.dedent("""
    import sys, time
    from dynspec.sglang import patch_transaction, patching
    seen = []
    def step(label):
        seen.append(label)
        print(label, flush=True)
        if len(seen) == int(sys.argv[3]):
            time.sleep(30)  # the window: the parent kills here
    patch_transaction.AFTER_STEP = step
    op = patching.do_apply if sys.argv[1] == "apply" else patching.do_revert
    print(op(patching.find_sglang(sys.argv[2])).message, flush=True)
""")


KILLS = {"n": 0}


@pytest.fixture(scope="module", autouse=True)
def tally():
    yield
    print(f"\n[patch journal] {KILLS['n']} kills mid-operation, every one finished by the next command")


def kill_after(root: Path, op: str, k: int) -> list[str]:
    """Run `op` in a child, SIGKILL it once it reports step k; the steps it reported."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-c", CHILD, op, str(root), str(k)], stdout=subprocess.PIPE, text=True, env=env)
    seen = []
    try:
        for line in proc.stdout:
            seen.append(line.strip())
            if len(seen) == k:
                break
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        proc.stdout.close()
    return seen


def steps_of(root: Path, op: str) -> int:
    """How many steps an uninterrupted op reports (with AFTER_STEP counting, not sleeping)."""
    seen = []
    patch_transaction.AFTER_STEP = seen.append
    try:
        (patching.do_apply if op == "apply" else patching.do_revert)(patching.find_sglang(root))
    finally:
        patch_transaction.AFTER_STEP = None
    return len(seen)


@pytest.mark.parametrize("op, then", [("apply", "apply"), ("apply", "revert"), ("revert", "revert"),
                                      ("revert", "apply")])
def test_every_interrupted_state_is_recovered_by_the_next_command(tree, capsys, op, then):
    from dynspec.cli import main

    pristine = tree_hashes(tree)
    if op == "revert":
        patching.do_apply(patching.find_sglang(tree))
    start = tree_hashes(tree)
    n = steps_of(tree, op)
    assert n == (1 + 3 + 1 if op == "revert" else 1 + 4 + 3)  # journal, renames (backup, state, targets), backup gone
    (patching.do_revert if op == "apply" else patching.do_apply)(patching.find_sglang(tree))  # back to the start
    assert tree_hashes(tree) == start
    for k in range(1, n + 1):
        seen = kill_after(tree, op, k)
        assert len(seen) == k, seen
        KILLS["n"] += 1
        assert state(tree) == patching.INTERRUPTED  # status recognises it, and changes nothing
        code = main(["patch", "status", "--sglang-path", str(tree)])
        out = capsys.readouterr().out
        assert code == 1 and out.startswith("interrupted"), out
        code = main(["patch", then, "--sglang-path", str(tree)])
        out = capsys.readouterr()
        assert code == 0 and out.out.startswith(f"finished an interrupted {op}"), out
        want = "patched" if then == "apply" else "unpatched"
        assert state(tree) == want
        if then == "revert":
            assert tree_hashes(tree) == pristine  # byte for byte, backup and journal gone
        assert not list(tree.rglob(f"*{patching.TMP_SUFFIX}")) and not (tree / "sglang" / patching.JOURNAL).exists()
        # back to where the interrupted op starts
        if (op == "apply") == (then == "apply"):
            (patching.do_revert if op == "apply" else patching.do_apply)(patching.find_sglang(tree))
        assert tree_hashes(tree) == start


def test_a_kill_before_the_journal_leaves_only_temp_files_that_the_next_command_clears(tree):
    target = patching.find_sglang(tree)
    before = tree_hashes(tree)
    stray = tree / "sglang" / "srt" / f".a.py.abc123{patching.TMP_SUFFIX}"
    stray.write_text("half")
    assert state(tree) == patching.UNPATCHED and tree_hashes(tree) != before
    assert patching.do_apply(target).message.startswith("patched")
    assert not stray.exists()


def test_a_planted_journal_moves_nothing_outside_the_tree(tree, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    journal = {"format": 1, "op": "apply", "remove": None,
               "renames": [{"path": "../victim.txt", "tmp": "../x.dynspec-tmp", "sha256": "0" * 64}]}
    (tree / "sglang" / patching.JOURNAL).write_text(json.dumps(journal))
    with pytest.raises(patching.Refusal, match="damaged journal"):
        patching.do_apply(patching.find_sglang(tree))
    assert victim.read_text() == "keep"


def test_symlinked_targets_and_backup_are_refused(tree, tmp_path):
    target = patching.find_sglang(tree)
    outside = tmp_path / "outside"
    outside.mkdir()
    (target.backup).symlink_to(outside)
    with pytest.raises(patching.Refusal, match="symbolic link"):
        patching.do_apply(target)
    assert not any(outside.iterdir())
    target.backup.unlink()
    # a target file that is a link would become a regular file: refused, the link stays
    a = tree / "sglang" / "srt" / "a.py"
    real = tmp_path / "a_real.py"
    real.write_text(a.read_text())
    a.unlink()
    a.symlink_to(real)
    with pytest.raises(patching.Refusal, match="symbolic link"):
        patching.do_apply(target)
    assert a.is_symlink() and real.read_text() == UPSTREAM["sglang/srt/a.py"]
    # and revert of a patched tree whose file was since made a link
    a.unlink()
    a.write_text(UPSTREAM["sglang/srt/a.py"])
    patching.do_apply(target)
    real.write_text(a.read_text())
    a.unlink()
    a.symlink_to(real)
    with pytest.raises(patching.Refusal, match="symbolic link"):
        patching.do_revert(target)
    assert a.is_symlink() and state(tree) == patching.PATCHED


def test_a_journal_that_cannot_be_finished_changes_nothing(tree):
    """Two renames to finish, the second one's temp gone and its file edited: refused before the first."""
    target = patching.find_sglang(tree)
    kill_after(tree, "apply", 1)  # journal written, nothing renamed yet
    journal = json.loads((tree / "sglang" / patching.JOURNAL).read_text())
    last = journal["renames"][-1]
    (tree / last["tmp"]).unlink()
    (tree / last["path"]).write_text("edited by hand\n")
    before = tree_hashes(tree)
    with pytest.raises(patching.Refusal, match="cannot finish the interrupted apply"):
        patching.do_apply(target)
    assert tree_hashes(tree) == before


def test_a_second_command_is_refused_while_the_first_holds_the_tree(tree, capsys):
    """A second apply must not take the first one's live journal for a crashed one and finish it."""
    from dynspec.cli import main

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-c", CHILD, "apply", str(tree), "1"], stdout=subprocess.PIPE,
                            text=True, env=env)
    try:
        assert proc.stdout.readline().strip() == "journal"  # the child now sleeps with its journal live
        during = tree_hashes(tree)
        for op in ("apply", "revert", "status"):
            code = main(["patch", op, "--sglang-path", str(tree)])
            out = capsys.readouterr()
            assert code == 2 and out.out == "", (op, out)
            assert f"another dynspec patch command (pid {proc.pid})" in out.err and out.err.count("\n") == 1
        assert tree_hashes(tree) == during
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        proc.stdout.close()
    # its lock went with it; the next command finishes what it started
    assert main(["patch", "apply", "--sglang-path", str(tree)]) == 0
    assert capsys.readouterr().out.startswith("finished an interrupted apply")
    assert state(tree) == patching.PATCHED


RACER = textwrap.dedent("""
    import random, sys
    from dynspec.sglang import patching
    random.seed(int(sys.argv[2]))
    target = patching.find_sglang(sys.argv[1])
    for _ in range(4):
        op = random.choice([patching.do_apply, patching.do_revert])
        try:
            op(target)
        except patching.Refusal as exc:
            assert "another dynspec patch command" in str(exc), exc
""")


def test_concurrent_commands_never_leave_a_half_patched_tree(tree):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    pristine = tree_hashes(tree)
    for rnd in range(3):
        procs = [subprocess.Popen([sys.executable, "-c", RACER, str(tree), str(rnd * 100 + i)], env=env,
                                  stderr=subprocess.PIPE, text=True) for i in range(12)]
        errs = [p.communicate(timeout=120)[1] for p in procs]
        assert all(p.returncode == 0 for p in procs), errs
        assert state(tree) in (patching.PATCHED, patching.UNPATCHED)
    patching.do_revert(patching.find_sglang(tree))
    assert tree_hashes(tree) == pristine
