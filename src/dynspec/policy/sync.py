"""Tensor-parallel agreement: every rank must take the same decision at every step, or the
collectives hang.  What the ranks agree on goes through a hook the caller supplies, on a schedule
that depends on the step stream only."""

from __future__ import annotations

import zlib
from typing import Callable

from dynspec.policy.buckets import BUCKET_EDGES, bucket_of

# Averages a flat list of floats across ranks (an all-reduce mean) and returns it.
SyncHook = Callable[[list[float]], list[float]]

# Steps between rank agreements for a policy that names no period of its own.
SYNC_EVERY = 64


def state_checksum(key: tuple) -> int:
    """A process-independent 32-bit checksum of a state key (hash() of str is salted per process)."""
    return zlib.crc32(repr(key).encode())



class SyncSchedule:
    """When the TP ranks agree: every `every` decisions, and once as soon as a batch-size
    bucket has had both modes tried `explore` times (so that a bucket just explored is not
    decided blind until the next periodic agreement).

    A function of the step stream only (step counter, batch sizes, modes), never of a
    policy's state: a rank whose policy has failed still joins every agreement."""

    __slots__ = ("every", "explore", "_seen")

    def __init__(self, every: int, explore: int = 0):
        self.every, self.explore = every, explore
        self._seen = [[0] * len(BUCKET_EDGES), [0] * len(BUCKET_EDGES)] if explore else None

    def due(self, step: int, batch_size: int, speculated: bool) -> bool:
        seen = self._seen
        if seen is not None:
            b, m = bucket_of(batch_size), 1 if speculated else 0
            seen[m][b] += 1
            if seen[m][b] == self.explore and seen[1 - m][b] >= self.explore:
                return True
        return step % self.every == 0

