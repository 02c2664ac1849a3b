"""The installed SGLang that `dynspec patch` writes into, and its writes: all files or none,
across crashes.  A refusal is one line for the user and changes nothing."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from dynspec.io.lock import held, lock_file

BACKUP_DIR = ".dynspec-backup"


class Refusal(Exception):
    """Refuse the operation: one line for the user, exit 2, nothing changed."""


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class Target:
    root: Path  # the directory that holds sglang/ (site-packages)
    version: str | None

    @property
    def pkg(self) -> Path:
        return self.root / "sglang"

    @property
    def backup(self) -> Path:
        return self.pkg / BACKUP_DIR


# --- one command at a time ------------------------------------------------------------
#
# A second apply or revert must not take the first one's live journal for a crashed one.  The
# lock (dynspec.io.lock) is a file beside the system's temporary files, so the tree itself stays
# as it was.


def lock_path(target: Target) -> Path:
    return lock_file("patch", target.pkg)


@contextlib.contextmanager
def exclusive(target: Target) -> Iterator[None]:
    """Hold the tree's lock for the block; a Refusal naming the holder when another has it."""
    with held(lock_path(target), f"another dynspec patch command (pid {{pid}}) is working on {target.pkg}", Refusal):
        yield


# --- writing: all files or none, across crashes -----------------------------------------
#
# Every new file is first a fsynced temp file beside its target.  Then a journal
# (<sglang>/.dynspec-journal.json) lists each temp, its target and the new bytes' hash,
# and only then do the renames start; the journal goes once the last one is done.  A
# crash between renames leaves the journal, and the next apply or revert finishes the
# renames from the temps (roll forward: every temp was complete before the first rename).

JOURNAL = ".dynspec-journal.json"
TMP_SUFFIX = ".dynspec-tmp"
# Called with a label after the journal is written, after each rename and after the backup goes;
# tests set it to widen the window in which a kill interrupts an operation.
AFTER_STEP = None


def _step(label: str) -> None:
    if AFTER_STEP is not None:
        AFTER_STEP(label)


def _check_writable(paths: list[Path]) -> None:
    for p in paths:
        d = p if p.is_dir() else p.parent
        if not os.access(d, os.W_OK | os.X_OK) or (p.is_file() and not os.access(p, os.W_OK)):
            raise Refusal(f"no write permission for {p}")


def _check_no_links(root: Path, paths: list[Path]) -> None:
    """Refuse a target, or a folder on the way to it below root, that is a symbolic link:
    a rename would replace the link with a file, a write into a linked folder lands outside the tree."""
    for p in paths:
        rel = p.relative_to(root)
        for k in range(2, len(rel.parts) + 1):  # the installed package folder itself may be a link
            q = root.joinpath(*rel.parts[:k])
            if q.is_symlink():
                raise Refusal(f"{q} is a symbolic link; dynspec replaces regular files in real folders only")


def _temp(path: Path, data: bytes, mode: int) -> Path:
    """A new file beside path holding data, synced (mkstemp: O_EXCL, never follows a link)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TMP_SUFFIX, dir=path.parent)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.chmod(tmp, mode)
    return Path(tmp)


def _fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_all(target: Target, files: dict[Path, bytes], *, op: str, remove: Path | None = None) -> None:
    """Replace every file with new bytes, or none (then remove the folder `remove`), through the
    journal; a failing rename rolls back the ones already done."""
    root = target.root
    _check_no_links(root, list(files) + [target.pkg / JOURNAL] + ([remove] if remove else []))
    temps: dict[Path, Path] = {}
    saved: dict[Path, bytes | None] = {}
    try:
        for path, data in files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            saved[path] = path.read_bytes() if path.exists() else None
            temps[path] = _temp(path, data, path.stat().st_mode & 0o7777 if path.exists() else 0o644)
        journal = {"format": 1, "op": op,
                   "renames": [{"path": str(p.relative_to(root)), "tmp": str(t.relative_to(root)),
                                "sha256": sha256(files[p])} for p, t in temps.items()],
                   "remove": str(remove.relative_to(root)) if remove else None}
        os.replace(_temp(target.pkg / JOURNAL, (json.dumps(journal, indent=2) + "\n").encode(), 0o644),
                   target.pkg / JOURNAL)
        _fsync_dir(target.pkg)
    except OSError as exc:
        for tmp in temps.values():
            tmp.unlink(missing_ok=True)
        if isinstance(exc, PermissionError):
            raise Refusal(f"no write permission for {exc.filename or 'a target directory'}") from None
        raise Refusal(f"cannot write ({exc}); nothing changed") from None
    _step("journal")
    done: list[Path] = []
    try:
        for path, tmp in temps.items():
            os.replace(tmp, path)
            done.append(path)
            _step(f"rename {path.relative_to(root)}")
    except OSError as exc:
        for path in done:  # roll back what was already replaced
            old = saved[path]
            if old is None:
                path.unlink(missing_ok=True)
            else:
                os.replace(_temp(path, old, path.stat().st_mode & 0o7777), path)
        for tmp in temps.values():
            tmp.unlink(missing_ok=True)
        (target.pkg / JOURNAL).unlink(missing_ok=True)
        raise Refusal(f"write failed ({exc}); rolled back, nothing changed") from None
    for d in {p.parent for p in temps}:
        _fsync_dir(d)
    if remove is not None:
        shutil.rmtree(remove, ignore_errors=True)
        _step("remove")
    (target.pkg / JOURNAL).unlink()


def _journal_entry(root: Path, rel: object, what: str, jpath: Path) -> Path:
    """A path the journal names, only if it stays inside the tree (a planted journal moves nothing)."""
    if not isinstance(rel, str) or not rel or Path(rel).is_absolute() or ".." in Path(rel).parts:
        raise Refusal(f"{jpath}: damaged journal ({what} {rel!r}); remove it after checking the files")
    return root / rel


def recover(target: Target, touched: Iterable[str] = ()) -> str:
    """Finish an apply or revert a crash interrupted, and clear stray temp files (beside the
    package, the backup and the `touched` files); returns what was done ("" when there was nothing)."""
    jpath = target.pkg / JOURNAL
    note = ""
    if jpath.is_symlink():
        raise Refusal(f"{jpath} is a symbolic link; remove it")
    if jpath.exists():
        from dynspec.io.jsonl import read_json

        j = read_json(jpath, Refusal)
        if not isinstance(j, dict) or j.get("op") not in ("apply", "revert") or not isinstance(j.get("renames"), list):
            raise Refusal(f"{jpath}: damaged journal; remove it after checking the files")
        todo: list[tuple[Path, Path]] = []  # every entry is checked before the first rename
        for r in j["renames"]:
            if not isinstance(r, dict):
                raise Refusal(f"{jpath}: damaged journal; remove it after checking the files")
            path = _journal_entry(target.root, r.get("path"), "path", jpath)
            tmp = _journal_entry(target.root, r.get("tmp"), "tmp", jpath)
            if tmp.parent != path.parent or not tmp.name.endswith(TMP_SUFFIX):
                raise Refusal(f"{jpath}: damaged journal (temp {tmp} is not beside {path})")
            _check_no_links(target.root, [path, tmp])
            if tmp.is_file() and sha256(tmp.read_bytes()) == r.get("sha256"):
                todo.append((tmp, path))
            elif not (path.is_file() and sha256(path.read_bytes()) == r.get("sha256")):
                raise Refusal(f"cannot finish the interrupted {j['op']}: {path} is not its new version and its "
                              f"temp file is gone; nothing changed")
        gone = None
        if j.get("remove") is not None:
            gone = _journal_entry(target.root, j["remove"], "remove", jpath)
            if gone != target.backup:
                raise Refusal(f"{jpath}: damaged journal (would remove {gone})")
        for tmp, path in todo:
            os.replace(tmp, path)
        if gone is not None:
            shutil.rmtree(gone, ignore_errors=True)
        jpath.unlink()
        note = f"finished an interrupted {j['op']}; "
    _clean_strays(target, touched)
    return note


def _clean_strays(target: Target, touched: Iterable[str]) -> None:
    """Temp files an interrupted operation left before its journal was written."""
    dirs = {target.pkg}
    for rel in touched:
        dirs |= {(target.root / rel).parent, (target.backup / rel).parent}
    dirs.add(target.backup)
    for d in dirs:
        if d.is_dir() and not d.is_symlink():
            for stray in d.glob(f".*{TMP_SUFFIX}"):
                stray.unlink(missing_ok=True)
