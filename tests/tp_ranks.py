"""TP ranks in threads: an all-reduce stand-in and a runner (for policy and hook tests)."""

from __future__ import annotations

import threading


class FakeAllReduce:
    """Reduces a list of floats across `n` threads, like an all-reduce on the CPU group.

    `op` is "mean" (the patch's sync hook) or "min" (its start-up agreement).  A rank that
    stops calling makes the others' barrier time out: `broken` then says so."""

    def __init__(self, n: int, op: str = "mean", timeout: float = 10.0):
        self.n, self.op = n, op
        self.barrier = threading.Barrier(n, timeout=timeout)
        self.values: dict[int, list[float]] = {}
        self.calls = 0
        self.broken = False

    def hook(self, rank: int):
        def sync(values: list[float]) -> list[float]:
            self.values[rank] = list(values)
            try:
                self.barrier.wait()
                cols = list(zip(*(self.values[r] for r in range(self.n))))
                out = [min(c) for c in cols] if self.op == "min" else [sum(c) / self.n for c in cols]
                self.calls += rank == 0
                self.barrier.wait()
            except threading.BrokenBarrierError:
                self.broken = True
                raise
            return out
        return sync


def run_ranks(target, n: int, timeout: float = 60.0) -> list:
    """Run target(rank) in n threads; return their results (re-raising a thread's exception)."""
    results: list = [None] * n
    errors: list = []

    def one(rank: int) -> None:
        try:
            results[rank] = target(rank)
        except BaseException as exc:  # noqa: BLE001 - reported to the test below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), "a rank hung"
    if errors:
        raise errors[0]
    return results
