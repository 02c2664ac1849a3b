"""`dynspec policy check|bench`: validate a spec; time decide+observe on a realistic stream."""

from __future__ import annotations

import random
import statistics
import sys
import time

from dynspec.policy import POLICY_NAMES, PolicySpecError, StepRecord, build_policy

BENCH_SPECS = ["always", "never", "threshold:on=24,off=32,dwell=50", "table:1-63=on,64-=off",
               "sglang-default-tiers", "goodput"]


def bench_stream(steps: int, seed: int = 0, max_batch: int = 128,
                 batch: int | None = None) -> list[tuple[int, float, tuple[int, ...], tuple]]:
    """A serving-like stream: the batch drifts between 1 and max_batch (or stays at `batch`),
    acceptance 0..3 per request, and the requests' ids (each request lives about 100 steps, as
    SGLang's rids: strings)."""
    rng = random.Random(seed)
    bs, out, rids, next_id = batch or 1, [], [], 0
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


def bench_policy(spec: str, steps: int = 20000, seed: int = 0, batch: int | None = None) -> list[float]:
    """Per-step times in microseconds of what a server calls: set_batch (for a policy that tracks
    requests), decide, wants_requests after a speculative decision, and observe."""
    policy = build_policy(spec)
    stream = bench_stream(steps, seed, batch=batch)
    clock = time.perf_counter_ns
    samples = []
    up_to = policy.requests_up_to
    for bs, t, accepted, rids in stream:
        t0 = clock()
        ids = rids if bs <= up_to else None
        if up_to:
            policy.set_batch(ids)
        spec_now = policy.decide(bs)
        if spec_now and ids is None and policy.wants_requests(bs):  # the caller's list is prebuilt here
            ids = rids
        policy.observe(StepRecord(bs, spec_now, accepted if spec_now else (), t, ids if spec_now else None))
        samples.append((clock() - t0) / 1000.0)
    return samples[steps // 10:]  # drop warm-up


def _check(args) -> int:
    try:
        policy = build_policy(args.spec)
    except PolicySpecError as exc:
        print(f"dynspec policy check: {exc}", file=sys.stderr)
        return 2
    print(f"ok: {policy.spec()}")
    return 0


def _bench(args) -> int:
    specs = [args.spec] if args.spec else BENCH_SPECS
    if args.steps < 2:  # a median and a p99 need samples
        print(f"dynspec policy bench: --steps must be at least 2, got {args.steps}", file=sys.stderr)
        return 2
    if args.batch is not None and not 1 <= args.batch <= 4096:
        print(f"dynspec policy bench: --batch must be in 1..4096, got {args.batch}", file=sys.stderr)
        return 2
    last = 0.0
    for spec in specs:
        try:
            samples = bench_policy(spec, args.steps, args.seed, args.batch)
        except PolicySpecError as exc:
            print(f"dynspec policy bench: {exc}", file=sys.stderr)
            return 2
        med = statistics.median(samples)
        p99 = statistics.quantiles(samples, n=100)[98]
        print(f"{spec:40s} median {med:6.2f} us  p99 {p99:6.2f} us")
        last = max(last, med)
    print(f"decide+observe median: {last:.1f} us")
    return 0


def add_cli(sub) -> None:
    p = sub.add_parser("policy", help="check or benchmark a policy spec")
    psub = p.add_subparsers(dest="policy_command", required=True, metavar="ACTION")
    c = psub.add_parser("check", help="validate a spec: exit 0, or 2 with one line naming the bad part")
    c.add_argument("spec", help=f"a policy spec ({', '.join(POLICY_NAMES)})")
    c.set_defaults(func=_check)
    b = psub.add_parser("bench", help="time decide+observe; the last line is the worst median")
    b.add_argument("spec", nargs="?", help="one spec (default: every built-in policy)")
    b.add_argument("--steps", type=int, default=20000)
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--batch", type=int, help="a fixed batch size instead of one drifting between 1 and 128")
    b.set_defaults(func=_bench)
