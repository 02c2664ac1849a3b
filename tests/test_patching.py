"""`dynspec patch status|apply|revert` against the real SGLang wheels (0.5.8, 0.5.9, 0.5.10).

Each test unpacks a wheel into a temporary site-packages-like directory and works
on that copy; nothing is installed.  "Untouched" is checked on the whole tree:
every file's bytes, and no file or folder added or removed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dynspec.sglang import patching
from dynspec.cli import main as cli_main
from dynspec.realsglang.wheels import unpack

PATCHSET = patching.patches_root() / "sglang-0.5.9"
MANIFEST = json.loads((PATCHSET / "manifest.json").read_text())
TOUCHED = sorted(MANIFEST["files"])


def snapshot(root: Path) -> dict[str, str]:
    """relative path -> sha256 for every file, and 'dir' for every folder."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        out[rel] = "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = cli_main(["patch", *args])
    cap = capsys.readouterr()
    return code, cap.out, cap.err


@pytest.fixture(scope="session")
def pristine(tmp_path_factory) -> dict[str, Path]:
    """One unpacked wheel per version, never modified; tests copy it."""
    base = tmp_path_factory.mktemp("wheels")
    return {v: unpack(v, base / v) for v in ("0.5.8", "0.5.9", "0.5.10")}


@pytest.fixture
def site(pristine, tmp_path):
    """A fresh copy of an unpacked wheel: site("0.5.9") -> the directory holding sglang/."""
    def make(version: str = "0.5.9") -> Path:
        dest = tmp_path / f"site-{version}"
        shutil.copytree(pristine[version], dest, symlinks=True)
        return dest
    return make


# --- the round trip on the real 0.5.9 wheel --------------------------------------------


def test_status_apply_revert_round_trip(site, pristine, capsys):
    root = site("0.5.9")
    before = snapshot(root)

    code, out, _ = run(capsys, "status", "--sglang-path", str(root))
    assert code == 0 and out.splitlines() == [f"unpatched 0.5.9 {root / 'sglang'}"]

    code, out, _ = run(capsys, "apply", "--sglang-path", str(root), "--dry-run")
    assert code == 0 and out.startswith("would patch")
    assert snapshot(root) == before

    code, out, err = run(capsys, "apply", "--sglang-path", str(root))
    assert code == 0 and out.startswith("patched:"), err
    after = snapshot(root)
    for rel in TOUCHED:
        assert after[rel] != before[rel], f"{rel} was not changed"
        assert after[rel] == MANIFEST["files"][rel]["patched_sha256"]
    # Only the touched files and the backup changed.
    changed = {k for k in set(before) | set(after) if before.get(k) != after.get(k)}
    assert changed - set(TOUCHED) <= {k for k in after if k.startswith("sglang/.dynspec-backup")}
    code, out, _ = run(capsys, "status", "--sglang-path", str(root))
    assert code == 0 and out.startswith("patched 0.5.9 ")

    # Idempotent: a second apply changes nothing and says so.
    code, out, _ = run(capsys, "apply", "--sglang-path", str(root))
    assert code == 0 and out.startswith("already patched")
    assert snapshot(root) == after

    code, out, _ = run(capsys, "revert", "--sglang-path", str(root), "--dry-run")
    assert code == 0 and snapshot(root) == after

    code, out, err = run(capsys, "revert", "--sglang-path", str(root))
    assert code == 0 and out.startswith("reverted:"), err
    assert snapshot(root) == before == snapshot(pristine["0.5.9"])  # byte for byte, backup gone

    code, out, _ = run(capsys, "revert", "--sglang-path", str(root))
    assert code == 0 and out.startswith("not patched") and snapshot(root) == before


def test_sglang_package_dir_is_accepted_too(site, capsys):
    root = site("0.5.9")
    code, out, _ = run(capsys, "status", "--sglang-path", str(root / "sglang"))
    assert code == 0 and out.startswith("unpatched 0.5.9 ")


def test_revert_without_backup_reverses_the_series(site, capsys):
    root = site("0.5.9")
    before = snapshot(root)
    assert run(capsys, "apply", "--sglang-path", str(root))[0] == 0
    shutil.rmtree(root / "sglang" / patching.BACKUP_DIR)
    code, out, err = run(capsys, "revert", "--sglang-path", str(root))
    assert code == 0, err
    assert snapshot(root) == before


def test_patch_files_apply_with_patch_p1(site):
    """The .patch files are plain unified diffs: `patch -p1` from site-packages gives the same bytes."""
    if shutil.which("patch") is None:
        pytest.skip("GNU patch not installed")
    root = site("0.5.9")
    for entry in MANIFEST["patches"]:
        subprocess.run(["patch", "-p1", "--quiet", "--no-backup-if-mismatch", "-i", str(PATCHSET / entry["file"])],
                       cwd=root, check=True)
    for rel in TOUCHED:
        assert hashlib.sha256((root / rel).read_bytes()).hexdigest() == MANIFEST["files"][rel]["patched_sha256"]
    assert patching.status(patching.find_sglang(root)).state == patching.PATCHED


def test_cli_entry_point_runs(site):
    root = site("0.5.9")
    res = subprocess.run([sys.executable, "-m", "dynspec", "patch", "status", "--sglang-path", str(root)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and res.stdout.startswith("unpatched 0.5.9"), res.stderr


# --- refusals: exit 2, one line, nothing changed ----------------------------------------


def assert_refused(capsys, root: Path, before: dict, *args: str, expect: str) -> None:
    code, out, err = run(capsys, *args, "--sglang-path", str(root))
    assert code == 2, (out, err)
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and expect in lines[0], lines
    assert snapshot(root) == before


@pytest.mark.parametrize("version", ["0.5.8", "0.5.10"])
def test_other_versions_are_refused_untouched(site, capsys, version):
    root = site(version)
    before = snapshot(root)
    code, out, _ = run(capsys, "status", "--sglang-path", str(root))
    assert code == 1 and out.startswith(f"unsupported-version {version} ")
    for op in ("apply", "revert"):
        assert_refused(capsys, root, before, op, expect="unsupported")
        assert_refused(capsys, root, before, op, "--dry-run", expect="unsupported")


def test_foreign_modified_file_is_refused(site, capsys):
    root = site("0.5.9")
    target = root / TOUCHED[0]
    target.write_bytes(target.read_bytes() + b"# a local edit\n")
    before = snapshot(root)
    code, out, _ = run(capsys, "status", "--sglang-path", str(root))
    assert code == 1 and out.startswith("foreign-modified 0.5.9 ") and TOUCHED[0] in out
    assert_refused(capsys, root, before, "apply", expect="foreign-modified")
    assert_refused(capsys, root, before, "revert", expect="foreign-modified")


def test_edit_after_patching_blocks_revert(site, capsys):
    root = site("0.5.9")
    assert run(capsys, "apply", "--sglang-path", str(root))[0] == 0
    target = root / TOUCHED[-1]
    target.write_bytes(target.read_bytes().replace(b"dynspec", b"dynspek", 1))
    before = snapshot(root)
    assert_refused(capsys, root, before, "revert", expect="foreign-modified")
    assert_refused(capsys, root, before, "apply", expect="foreign-modified")


def test_partly_patched_is_foreign(site, capsys, pristine):
    root = site("0.5.9")
    assert run(capsys, "apply", "--sglang-path", str(root))[0] == 0
    shutil.copyfile(pristine["0.5.9"] / TOUCHED[0], root / TOUCHED[0])
    before = snapshot(root)
    code, out, _ = run(capsys, "status", "--sglang-path", str(root))
    assert code == 1 and out.startswith("foreign-modified") and "partly patched" in out
    assert_refused(capsys, root, before, "revert", expect="foreign-modified")


def test_no_sglang_found(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    for op in ("status", "apply", "revert"):
        assert_refused(capsys, empty, {}, op, expect="no sglang found")


@contextlib.contextmanager
def read_only(path: Path, monkeypatch):
    """Make `path` unwritable for real: chmod for a normal user, chattr +i for root
    (root ignores modes); where neither works, deny it through os.access."""
    if os.geteuid() != 0:
        mode = path.stat().st_mode
        path.chmod(0o555)
        try:
            yield
        finally:
            path.chmod(mode)
        return
    if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode == 0:
        try:
            yield
        finally:
            subprocess.run(["chattr", "-i", str(path)], check=True)
        return
    real = os.access
    monkeypatch.setattr(patching.os, "access",
                        lambda p, m, **kw: False if str(p).startswith(str(path)) else real(p, m, **kw))
    yield


def test_no_write_permission(site, capsys, monkeypatch):
    root = site("0.5.9")
    before = snapshot(root)
    with read_only(root / "sglang" / "srt" / "speculative", monkeypatch):
        assert_refused(capsys, root, before, "apply", expect="no write permission")
    # And a patched tree whose files cannot be restored.
    assert run(capsys, "apply", "--sglang-path", str(root))[0] == 0
    before = snapshot(root)
    with read_only(root / "sglang" / "srt" / "managers", monkeypatch):
        assert_refused(capsys, root, before, "revert", expect="no write permission")


def test_failed_replace_rolls_back_everything(site, capsys, monkeypatch):
    root = site("0.5.9")
    before = snapshot(root)
    real_replace = os.replace
    calls = {"n": 0}

    def flaky(src, dst):
        calls["n"] += 1
        if calls["n"] == 4:  # after the backup files and one patched file went in
            raise OSError(5, "simulated I/O error")
        return real_replace(src, dst)

    monkeypatch.setattr(patching.os, "replace", flaky)
    assert_refused(capsys, root, before, "apply", expect="rolled back")
    assert calls["n"] >= 4


# --- damaged patch sets -----------------------------------------------------------------


@pytest.fixture
def patch_copy(tmp_path, monkeypatch):
    """A private copy of the patch folders, selected through DYNSPEC_PATCHES."""
    dest = tmp_path / "patches"
    shutil.copytree(patching.patches_root(), dest, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setenv(patching.ENV_PATCHES, str(dest))
    return dest / "sglang-0.5.9"


def _rehash(folder: Path) -> None:
    """Keep the manifest's patch hashes in step (so the damage is inside the diff)."""
    m = json.loads((folder / "manifest.json").read_text())
    for e in m["patches"]:
        e["sha256"] = hashlib.sha256((folder / e["file"]).read_bytes()).hexdigest()
    (folder / "manifest.json").write_text(json.dumps(m))


def test_damaged_patch_bytes_are_refused(site, capsys, patch_copy):
    root = site("0.5.9")
    before = snapshot(root)
    p = patch_copy / MANIFEST["patches"][0]["file"]
    p.write_bytes(p.read_bytes().replace(b"dynspec", b"dynspex", 1))
    assert_refused(capsys, root, before, "apply", expect="damaged patch file")


def test_damaged_hunk_is_refused(site, capsys, patch_copy):
    root = site("0.5.9")
    before = snapshot(root)
    p = patch_copy / MANIFEST["patches"][1]["file"]
    text = p.read_text().splitlines(keepends=True)
    i = next(i for i, line in enumerate(text) if line.startswith(" ") and line.strip())
    text[i] = " # this context line is not in upstream\n"
    p.write_text("".join(text))
    _rehash(patch_copy)
    assert_refused(capsys, root, before, "apply", expect="does not match")


def test_truncated_patch_is_refused(site, capsys, patch_copy):
    root = site("0.5.9")
    before = snapshot(root)
    p = patch_copy / MANIFEST["patches"][0]["file"]
    p.write_text(p.read_text()[: len(p.read_text()) // 2])
    _rehash(patch_copy)
    assert_refused(capsys, root, before, "apply", expect="damaged patch file")


def test_bad_manifest_is_refused(site, capsys, patch_copy):
    root = site("0.5.9")
    before = snapshot(root)
    (patch_copy / "manifest.json").write_text("{not json")
    assert_refused(capsys, root, before, "apply", expect="damaged patch set")
    assert_refused(capsys, root, before, "revert", expect="damaged patch set")


def test_wrong_patched_hash_is_refused(site, capsys, patch_copy):
    root = site("0.5.9")
    before = snapshot(root)
    m = json.loads((patch_copy / "manifest.json").read_text())
    m["files"][TOUCHED[0]]["patched_sha256"] = "0" * 64
    (patch_copy / "manifest.json").write_text(json.dumps(m))
    assert_refused(capsys, root, before, "apply", expect="does not match")


def _earlier_release(patch_copy: Path) -> Path:
    """The series as an earlier release shipped it (one added line differs), beside the copy."""
    earlier = patch_copy.parent.parent / "earlier" / "sglang-0.5.9"
    shutil.copytree(patch_copy, earlier)
    p = earlier / MANIFEST["patches"][0]["file"]
    text = p.read_text().splitlines(keepends=True)
    i = next(i for i, line in enumerate(text) if line.startswith("+") and not line.startswith("+++") and line.strip("+ \n"))
    text[i] = text[i].rstrip("\n") + "  # an earlier release\n"
    p.write_text("".join(text))
    _rehash(earlier)
    return earlier


def test_a_tree_patched_by_an_earlier_release_is_updated_and_reverted(site, pristine, capsys, patch_copy):
    earlier = _earlier_release(patch_copy)
    m = patching.build_manifest("0.5.9", earlier, pristine["0.5.9"])
    (earlier / "manifest.json").write_text(json.dumps(m))
    root = site("0.5.9")
    pristine_tree = snapshot(root)
    # installed by the earlier release (its own patch set), backup and all
    assert patching.do_apply(patching.find_sglang(root), root=earlier.parent).code == 0
    # without the earlier hashes in this release's manifest the tree is foreign
    code, out, _ = run(capsys, "status", "--sglang-path", str(root))
    assert code == 1 and out.startswith("foreign-modified")
    # `dynspec patch manifest` hands them on from the manifest it replaces
    current = json.loads((patch_copy / "manifest.json").read_text())
    new = patching.build_manifest("0.5.9", patch_copy, pristine["0.5.9"], previous=m)
    assert new["patches"] == current["patches"]
    rel = next(r for r, e in new["files"].items() if "earlier_patched_sha256" in e)
    assert new["files"][rel]["earlier_patched_sha256"] == [m["files"][rel]["patched_sha256"]]
    (patch_copy / "manifest.json").write_text(json.dumps(new))
    code, out, _ = run(capsys, "status", "--sglang-path", str(root))
    assert code == 1 and out.startswith("patched-by-another-dynspec 0.5.9") and "apply" in out
    code, out, err = run(capsys, "apply", "--sglang-path", str(root))
    assert code == 0 and out.startswith("patched:"), err
    assert run(capsys, "status", "--sglang-path", str(root))[1].startswith("patched 0.5.9")
    # back to the earlier release's bytes, then revert: upstream byte for byte, backup gone
    assert patching.do_revert(patching.find_sglang(root)).code == 0
    assert patching.do_apply(patching.find_sglang(root), root=earlier.parent).code == 0
    code, out, err = run(capsys, "revert", "--sglang-path", str(root))
    assert code == 0 and out.startswith("reverted:"), err
    assert snapshot(root) == pristine_tree


def test_an_earlier_release_without_its_backup_is_refused(site, pristine, capsys, patch_copy):
    earlier = _earlier_release(patch_copy)
    m = patching.build_manifest("0.5.9", earlier, pristine["0.5.9"])
    (earlier / "manifest.json").write_text(json.dumps(m))
    (patch_copy / "manifest.json").write_text(json.dumps(
        patching.build_manifest("0.5.9", patch_copy, pristine["0.5.9"], previous=m)))
    root = site("0.5.9")
    assert patching.do_apply(patching.find_sglang(root), root=earlier.parent).code == 0
    shutil.rmtree(root / "sglang" / patching.BACKUP_DIR)
    before = snapshot(root)
    assert_refused(capsys, root, before, "apply", expect="an earlier dynspec release patched it")
    assert_refused(capsys, root, before, "revert", expect="an earlier dynspec release patched it")


def test_the_shipped_manifests_know_the_earlier_releases():
    """Trees patched by earlier dynspec releases are recognised (their hashes are in git history)."""
    m = json.loads((PATCHSET / "manifest.json").read_text())
    earlier = m["files"]["sglang/srt/speculative/eagle_worker_v2.py"].get("earlier_patched_sha256", [])
    assert len(earlier) >= 1 and m["files"]["sglang/srt/speculative/eagle_worker_v2.py"]["patched_sha256"] not in earlier


# --- the unified-diff applier -----------------------------------------------------------

OLD = "a\nb\nc\nd\ne\n"
NEW = "a\nB\nc\nd\ne\nf"
DIFF = """--- a/pkg/x.py
+++ b/pkg/x.py
@@ -1,3 +1,3 @@
 a
-b
+B
 c
@@ -4,2 +4,3 @@
 d
 e
+f
\\ No newline at end of file
"""


def test_apply_and_reverse_hunks():
    (fp,) = patching.parse_unified(DIFF)
    assert fp.path == "pkg/x.py"
    assert patching.apply_hunks(OLD, fp.hunks) == NEW
    assert patching.apply_hunks(NEW, fp.hunks, reverse=True) == OLD
    with pytest.raises(patching.PatchApplyError):
        patching.apply_hunks(OLD.replace("c", "C"), fp.hunks)
    with pytest.raises(patching.PatchApplyError):
        patching.apply_hunks(NEW, fp.hunks)  # already applied


@pytest.mark.parametrize("bad", [
    DIFF.replace("@@ -1,3 +1,3 @@", "@@ -1,9 +1,3 @@"),  # header longer than the hunk
    DIFF.replace("@@ -1,3 +1,3 @@", "@@ one @@"),
    DIFF.replace(" c\n", "?c\n"),
    "just some text\n",
    DIFF.replace("+++ b/pkg/x.py", "+++ b/pkg/y.py"),
])
def test_malformed_diffs(bad):
    with pytest.raises(patching.PatchFormatError):
        patching.parse_unified(bad)


def test_version_is_read_without_importing(pristine):
    for v, root in pristine.items():
        assert patching.read_version(root / "sglang") == v
    assert "0.5.9" in patching.available_versions()
