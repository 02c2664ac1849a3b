"""A serving-like stream of decode steps, and the time a policy takes per step on it."""

from __future__ import annotations

import random
import time

from dynspec.policy.base import Policy, StepRecord
from dynspec.policy.spec import build_policy
from dynspec.policy.step_cost import ProfileLoader

BENCH_SPECS = ["always", "never", "threshold:on=24,off=32,dwell=50", "table:1-63=on,64-=off",
               "sglang-default-tiers", "goodput"]


def bench_stream(steps: int, seed: int = 0, max_batch: int = 128,
                 batch: int | None = None) -> list[tuple[int, float, tuple[int, ...], tuple]]:
    """A serving-like stream: the batch drifts between 1 and max_batch (or stays at `batch`),
    acceptance 0..3 per request, and the requests' ids (each request lives about 100 steps, as
    SGLang's rids: strings)."""
    rng = random.Random(seed)
    bs, out, next_id = batch or 1, [], 0
    rids: list[str] = []
    for _ in range(steps):
        if batch is None:
            bs = min(max(bs + rng.choice((-2, -1, 0, 0, 1, 2)), 1), max_batch)
        rids = [r for r in rids if rng.random() > 0.01][:bs]
        while len(rids) < bs:
            rids.append(f"{next_id:032x}")
            next_id += 1
        accepted = tuple(rng.choice((0, 1, 1, 2, 2, 3)) for _ in range(bs))
        out.append((bs, 0.005 + bs * 1e-4 + rng.random() * 1e-4, accepted, tuple(rids)))
    return out


def bench_policy(spec: str, steps: int = 20000, seed: int = 0, batch: int | None = None,
                 load_profile: ProfileLoader | None = None, candidate_steps: list[int] | None = None) -> list[float]:
    """Per-step times in microseconds of what a server calls: set_batch (for a policy that tracks
    requests), decide, wants_requests after a speculative decision, and observe.  With
    candidate_steps, decide_steps instead of decide (the accept lengths cut at its K, untimed)."""
    policy = build_policy(spec, load_profile=load_profile)
    if candidate_steps:
        return _bench_steps(policy, bench_stream(steps, seed, batch=batch), candidate_steps)
    stream = bench_stream(steps, seed, batch=batch)
    clock = time.perf_counter_ns
    samples = []
    up_to = policy.requests_up_to
    for i, (bs, t, accepted, rids) in enumerate(stream):
        kv = bs * (128 + i % 2048)  # the KV tokens a 0.5.9 server reports: contexts grow, then restart
        t0 = clock()
        ids = rids if bs <= up_to else None
        if up_to:
            policy.set_batch(ids)
        spec_now = policy.decide(bs)
        if spec_now and ids is None and policy.wants_requests(bs):  # the caller's list is prebuilt here
            ids = rids
        policy.observe(StepRecord(bs, spec_now, accepted if spec_now else (), t, ids if spec_now else None,
                                  True, None, kv))
        samples.append((clock() - t0) / 1000.0)
    return samples[steps // 10:]  # drop warm-up


def _bench_steps(policy: Policy, stream: list[tuple[int, float, tuple[int, ...], tuple]],
                 candidate_steps: list[int]) -> list[float]:
    """bench_policy's loop for a server with several draft lengths (SGLang 0.5.23)."""
    policy.set_candidate_steps(candidate_steps, 3)
    clock = time.perf_counter_ns
    samples = []
    up_to = policy.requests_up_to
    for bs, t, accepted, rids in stream:
        t0 = clock()
        ids = rids if bs <= up_to else None
        if up_to:
            policy.set_batch(ids)
        k = policy.decide_steps(bs)
        if k and ids is None and policy.wants_requests(bs):
            ids = rids
        t1 = clock()
        acc = (accepted if k >= 3 else tuple(a if a < k else k for a in accepted)) if k else ()
        t2 = clock()
        policy.observe(StepRecord(bs, k > 0, acc, t, ids if k else None, True, k))
        samples.append((clock() - t2 + t1 - t0) / 1000.0)
    return samples[len(samples) // 10:]
