"""SIGTERM handled as Ctrl-C: a command stopped by `kill` or a job scheduler runs the same
cleanup and prints the same one line as one interrupted at the keyboard, instead of dying
between a temporary file and its rename."""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Iterator


class Terminated(KeyboardInterrupt):
    """KeyboardInterrupt raised for SIGTERM."""


def _raise(signum, _frame):
    raise Terminated(f"signal {signum}")


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM raises KeyboardInterrupt (main thread only; elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)
