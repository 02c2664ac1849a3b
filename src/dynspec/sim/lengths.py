"""How a level's requests are drawn: their lengths and the seed of each closed-loop level, one
definition for the sweep's random prompts and for a fit that simulates the same workload."""

from __future__ import annotations

import random


def closed_level_seed(seed: int, concurrency: int, repeat: int) -> int:
    """The seed of a closed-loop level's prompts: they differ per level and repeat (no prefix-cache
    reuse) and are the same for every arm."""
    return seed * 1_000_003 + concurrency * 1009 + repeat


def draw_lengths(rng: random.Random, n: int, length: int, ratio: float) -> list[int]:
    """n lengths uniform in [max(1, int(length * ratio)), length] (bench_serving's range ratio)."""
    lo = max(1, int(length * ratio))
    return [length if lo >= length else rng.randint(lo, length) for _ in range(n)]


def level_lengths(seed: int, n: int, input_len: int, output_len: int, ratio: float) -> list[tuple[int, int]]:
    """(input, output) tokens of a level's n random prompts drawn with `seed`, as the sweep draws them."""
    rng = random.Random(f"lengths-{seed}")
    ins = draw_lengths(rng, n, input_len, ratio)
    return list(zip(ins, draw_lengths(rng, n, output_len, ratio)))
