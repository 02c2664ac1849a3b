"""A full disk as one line: which file could not be written and what to do, instead of the
chained tracebacks every later write (a log line, the run's status) would add to it."""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

from dynspec.io.atomic import write_text

FULL = (errno.ENOSPC, errno.EDQUOT)


def disk_full_error(exc: BaseException | None) -> OSError | None:
    """The OSError saying the disk (or the user's quota) is full, in exc or what it arose from."""
    while exc is not None:
        if isinstance(exc, OSError) and exc.errno in FULL:
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def is_disk_full(exc: BaseException | None) -> bool:
    return disk_full_error(exc) is not None


def disk_full_line(exc: OSError) -> str:
    where = f" writing {exc.filename}" if exc.filename else ""
    return f"disk full{where} ({os.strerror(exc.errno or errno.ENOSPC)})"


def save_text_anyway(path: Path, text: str) -> None:
    """Write a small file whole if the disk allows, else in place over its old blocks (a full disk
    has no room for the temporary copy an atomic write needs, but the truncated file's blocks are
    free again).  OSError only if even that fails."""
    try:
        write_text(path, text)
    except OSError as exc:
        if not is_disk_full(exc):
            raise
        with open(path, "r+b" if path.exists() else "wb") as f:
            f.truncate(0)
            f.write(text.encode("utf-8"))
            f.flush()
            os.fsync(f.fileno())


class QuietFileHandler(logging.FileHandler):
    """A log file that stops writing once the disk is full (one line said elsewhere), rather than
    printing "--- Logging error ---" and a traceback for every record after it."""

    disk_full = False

    def handleError(self, record: logging.LogRecord) -> None:
        import sys

        if is_disk_full(sys.exc_info()[1]):
            self.disk_full = True
            return
        super().handleError(record)

    def emit(self, record: logging.LogRecord) -> None:
        if not self.disk_full:
            super().emit(record)

    def close(self) -> None:
        try:
            super().close()
        except OSError as exc:  # the buffered tail could not be flushed: the disk is still full
            if not is_disk_full(exc):
                raise
            self.disk_full = True
