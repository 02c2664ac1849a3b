"""`dynspec policy check|bench`: validate a spec; time decide+observe on a realistic stream."""

from __future__ import annotations

import statistics
import sys

from dynspec.policy import POLICY_NAMES, PolicySpecError, StepCost, build_policy
from dynspec.policy.bench import BENCH_SPECS, bench_policy


def load_profile(name: str) -> StepCost:
    """A shipped profile by name or a YAML file by path (pydantic and yaml load only when one is named)."""
    from dynspec.sim.profile import load_profile as load

    return load(name)


def _check(args) -> int:
    try:
        policy = build_policy(args.spec, load_profile=load_profile)
    except PolicySpecError as exc:
        print(f"dynspec policy check: {exc}", file=sys.stderr)
        return 2
    print(f"ok: {policy.spec()}")
    return 0


def _bench(args) -> int:
    specs = args.spec or BENCH_SPECS
    if args.rounds < 1:
        print(f"dynspec policy bench: --rounds must be at least 1, got {args.rounds}", file=sys.stderr)
        return 2
    if args.steps < 2:  # a median and a p99 need samples
        print(f"dynspec policy bench: --steps must be at least 2, got {args.steps}", file=sys.stderr)
        return 2
    if args.batch is not None and not 1 <= args.batch <= 4096:
        print(f"dynspec policy bench: --batch must be in 1..4096, got {args.batch}", file=sys.stderr)
        return 2
    cands = None
    if args.candidate_steps:
        try:
            cands = [int(k) for k in args.candidate_steps.split(",")]
            if min(cands) < 0 or max(cands) < 1:
                raise ValueError
        except ValueError:
            print(f"dynspec policy bench: --candidate-steps must be integers >= 0 with one above 0, "
                  f"got {args.candidate_steps!r}", file=sys.stderr)
            return 2
    last = 0.0
    got: dict[str, list[float]] = {spec: [] for spec in specs}
    for _ in range(args.rounds):  # in turns: a busy machine's drift falls on every spec alike
        for spec in specs:
            try:
                got[spec] += bench_policy(spec, args.steps, args.seed, args.batch, load_profile, cands)
            except PolicySpecError as exc:
                print(f"dynspec policy bench: {exc}", file=sys.stderr)
                return 2
    for spec, samples in got.items():
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
    b.add_argument("spec", nargs="*", help="specs to time side by side (default: every built-in policy)")
    b.add_argument("--rounds", type=int, default=1, help="time the specs in turns this many times (medians over all)")
    b.add_argument("--steps", type=int, default=20000)
    b.add_argument("--candidate-steps", metavar="K,K,...",
                   help="time decide_steps on a server with these draft lengths (SGLang 0.5.23's, e.g. 0,1,3,5,7)")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--batch", type=int, help="a fixed batch size instead of one drifting between 1 and 128")
    b.set_defaults(func=_bench)
