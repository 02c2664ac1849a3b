"""SIGTERM handled as Ctrl-C: a command stopped by `kill` or a job scheduler runs the same
cleanup and prints the same one line as one interrupted at the keyboard, instead of dying
between a temporary file and its rename."""

from __future__ import annotations

import logging
import signal
import threading
from contextlib import contextmanager
from typing import Iterator


class Terminated(KeyboardInterrupt):
    """KeyboardInterrupt raised for SIGTERM."""


def _raise(signum, _frame):
    raise Terminated(f"signal {signum}")


def _raise_quietly(signum, _frame):
    # What unwinds after an interrupt (a notebook's kernel shut down under a cell that was
    # waiting for it) logs its own tracebacks; the command's one line says all there is.
    logging.disable(logging.CRITICAL)
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise Terminated(f"signal {signum}")


@contextmanager
def sigterm_as_interrupt(quiet: bool = False) -> Iterator[None]:
    """Within the block, SIGTERM raises KeyboardInterrupt (main thread only; elsewhere a no-op).
    quiet: SIGTERM and SIGINT also silence logging from then on, for a command that prints its
    own one line when interrupted."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signums = (signal.SIGTERM, signal.SIGINT) if quiet else (signal.SIGTERM,)
    old = {n: signal.signal(n, _raise_quietly if quiet else _raise) for n in signums}
    try:
        yield
    finally:
        for n, h in old.items():
            signal.signal(n, h)
