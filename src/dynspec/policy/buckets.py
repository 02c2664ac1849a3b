"""Batch-size buckets: what a policy learns is kept per bucket, fine where batches are small and
geometric above."""

from __future__ import annotations

import bisect
import math

BUCKET_EDGES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)


def _bucket_slow(batch_size: int) -> int:
    return max(bisect.bisect_right(BUCKET_EDGES, batch_size) - 1, 0)


_BUCKETS = [_bucket_slow(i) for i in range(BUCKET_EDGES[-1] + 1)]
_LAST_BUCKET = len(BUCKET_EDGES) - 1
_N_BUCKETS = len(_BUCKETS)


def bucket_of(batch_size: int) -> int:
    """Index of the bucket holding batch_size (a table lookup on the hot path)."""
    return _BUCKETS[batch_size] if 0 <= batch_size < _N_BUCKETS else _LAST_BUCKET


def bucket_mid(b: int) -> float:
    """A representative batch size of bucket b (geometric middle)."""
    lo = BUCKET_EDGES[b]
    hi = BUCKET_EDGES[b + 1] - 1 if b + 1 < len(BUCKET_EDGES) else lo
    return math.sqrt(lo * hi)

