"""One process at a time on a thing (a run id, a report, an SGLang tree): flock(2) on a small
file, released by the kernel when its holder exits however it exits, so there is no stale lock to
break.  The file stays behind, empty but for the last holder's pid."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import tempfile
from pathlib import Path
from typing import Iterator


def lock_file(kind: str, thing: Path) -> Path:
    """Where the lock of `thing` (a folder, which need not exist yet) lives: beside the system's
    temporary files, named after its absolute path, so taking it changes nothing in the tree."""
    key = hashlib.sha256(str(Path(thing).resolve()).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"dynspec-{kind}-{key}.lock"


@contextlib.contextmanager
def held(path: Path, busy: str, error: type[Exception]) -> Iterator[None]:
    """Hold the lock at `path` for the block; when another process holds it, `error` with `busy`
    (a message with a {pid} field) and "nothing changed"."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as exc:
        raise error(f"cannot open the lock {path} ({exc.strerror})") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            raise error(f"{busy.format(pid=owner)}; nothing changed") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock
