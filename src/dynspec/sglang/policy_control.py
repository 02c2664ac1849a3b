"""DYNSPEC_POLICY_CONTROL: a file that names the policy a running patched server uses.

An operator (or a benchmark comparing policies on one server process, where two server
processes of the same build measure several percent apart) writes a policy spec into the
file, e.g. `echo always > /tmp/dynspec-policy`; the Controller looks at the file at most
every POLL_INTERVAL_S of wall time, between decode steps, and swaps the new policy in.

This module only watches the file: `PolicyControl.read()` says what the file holds when its
modification time or size changed since the last look.  Building and swapping the policy is
the Controller's (dynspec.sglang.hook), which reads the clock and calls `read()` only when a
poll is due, so the common path of a decode step pays one float comparison.

Standard library only: this runs inside SGLang's scheduler.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Generic, TypeVar

P = TypeVar("P")

ENV_POLICY_CONTROL = "DYNSPEC_POLICY_CONTROL"

# How often (wall seconds, at most) the file is stat'ed: a quarter second is far below what an
# operator or a benchmark phase notices and far above a decode step (milliseconds), so the stat
# costs nothing measurable per step.
POLL_INTERVAL_S = 0.25

# A spec is one short line; a larger file is a mistake (a wrong path), not a policy.
MAX_BYTES = 4096


class PolicyControl:
    """One control file: `read()` returns its spec when it changed since the last look, else None.

    A missing or empty file returns None (the policy in force stays); so does a file that cannot
    be read or holds more than one line, after one log line per such change."""

    def __init__(self, path: str, logger: logging.Logger, *, interval_s: float = POLL_INTERVAL_S):
        self.path = path
        self.interval_s = interval_s
        self.log = logger
        self._sig: tuple[int, int, int] | None = None  # (inode, mtime_ns, size) at the last look
        self._error: str | None = None  # the last stat error logged, so it is logged once

    def read(self) -> str | None:
        """The file's spec (stripped) if its inode, mtime or size changed since the last call; None
        when unchanged, missing, empty, unreadable or not one line."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self._sig = None  # if it comes back, it is read again
            return None
        except OSError as exc:
            if str(exc) != self._error:
                self._error = str(exc)
                self.log.warning("dynspec: cannot stat the policy control file %s (%s); the policy stays",
                                 self.path, exc)
            return None
        self._error = None
        # The inode too: a spec of the same length renamed into place within the file system's
        # timestamp granularity (a few ms on ext4) has the old mtime and size.
        sig = (st.st_ino, st.st_mtime_ns, st.st_size)
        if sig == self._sig:
            return None
        self._sig = sig
        try:
            with open(self.path, "rb") as f:
                raw = f.read(MAX_BYTES + 1)
            text = raw.decode("utf-8").strip()
            if len(raw) > MAX_BYTES or "\n" in text:
                raise ValueError(f"not one policy spec line (first bytes: {raw[:40]!r})")
        except (OSError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
            self.log.warning("dynspec: policy control file %s unreadable (%s); the policy stays", self.path, exc)
            return None
        # Empty: a writer truncated the file and has not written yet (`echo x > file`); the next
        # poll sees the size change and reads the spec.
        return text or None


class Shelf(Generic[P]):
    """Policies swapped out, by spec: a spec swapped back in gets the policy it had, with what it
    had learned (as if it had kept a server of its own, idle meanwhile), not a fresh one."""

    def __init__(self) -> None:
        self._by_spec: dict[str, P] = {}

    def swap(self, old_spec: str, old_policy: P, new_spec: str, build: Callable[[str], P]) -> P:
        """The policy for `new_spec` (shelved, else `build(new_spec)`), `old_policy` shelved under
        `old_spec`.  If `build` raises, nothing has changed."""
        policy = self._by_spec.pop(new_spec, None)
        if policy is None:
            policy = build(new_spec)
        self._by_spec[old_spec] = old_policy
        return policy
