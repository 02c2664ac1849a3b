"""Does a small host-to-device copy wait for the GPU work queued before it on the same stream?

The patched plain stretch copies each prefill's token positions to the GPU right after the
target's prefill is queued.  If that copy waits for the prefill, the scheduler cannot prepare
the next step while the prefill runs (the overlap a plain server keeps).  This queues about
--busy-ms of matmuls, then times on the host one copy of --n int64 values, from pageable
memory and from pinned memory, with non_blocking=True (the patch's call), and a blocking one.
    python experiments/h200-real-sglang/h2d_stall.py [--busy-ms 50] [--n 4096] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def queue_busy(a: torch.Tensor, k: int) -> None:
    for _ in range(k):
        a @ a


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--busy-ms", type=float, default=50.0, help="GPU work queued before each copy")
    ap.add_argument("--n", type=int, default=4096, help="int64 values copied")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("h2d_stall: needs a CUDA GPU")
    dev = torch.device("cuda")
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    queue_busy(a, 3)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    queue_busy(a, 20)
    torch.cuda.synchronize()
    k = max(1, round(args.busy_ms / (1000 * (time.perf_counter() - t0) / 20)))

    def pageable():
        return torch.arange(args.n).to(dev, non_blocking=True)

    def pinned():
        return torch.arange(args.n).pin_memory().to(dev, non_blocking=True)

    def blocking():
        return torch.arange(args.n).to(dev)

    print(f"{k} matmuls of 8192^2 bf16 queued (about {args.busy_ms:.0f} ms), then one copy of "
          f"{args.n} int64; host time of the copy call, median of {args.repeats}:")
    for name, copy in (("pageable, non_blocking", pageable), ("pinned, non_blocking", pinned),
                       ("pageable, blocking", blocking)):
        copy()  # warm: the pinned allocator's first block
        times = []
        for _ in range(args.repeats):
            torch.cuda.synchronize()
            queue_busy(a, k)
            t0 = time.perf_counter()
            copy()
            times.append(1000 * (time.perf_counter() - t0))
            torch.cuda.synchronize()
        print(f"  {name:24s} {statistics.median(times):8.3f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
