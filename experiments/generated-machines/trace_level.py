"""One member-level of a generated family, stretch by stretch: what goodput did and what it believed.

The family's worst member-levels were traced in scratch scripts, one at a time; this is
that trace.  It simulates member I of family S at concurrency C (the requests `envelope.py
--family` serves there, with the same --range-ratio and --level-scale) for the plain server,
`never`, EAGLE-3 and a goodput spec, prints their output tok/s and the spec's share of the
switching server's best and of max(plain, EAGLE-3), then splits the spec's decode steps into
--segments equal stretches.  Per stretch: the share of speculative steps, switches, the mean
batch, the prefill forwards and prompts per forward the engine ran (a lockstep's prompts come
in few, full forwards; scattered finishes one or two at a time), and what the policy read at
the stretch's end (lockstep, lead, its own EMA of prompts per forward).  Last, its estimates in
the level's bucket.  Simulated, seed 0 unless --seed.

    PYTHONPATH=src .venv/bin/python experiments/generated-machines/trace_level.py 0:72 63 --level-scale 4
    PYTHONPATH=src .venv/bin/python experiments/generated-machines/trace_level.py 0:72 63 --spec goodput:lead=0.03
"""

from __future__ import annotations

import argparse
import sys

from dynspec.analysis.family import level_requests, member
from dynspec.policy import BUCKET_EDGES, PolicySpecError, bucket_of, build_policy
from dynspec.sim.profile import load_profile
from dynspec.sim.run import simulate_level


class Stretches:
    """on_step for simulate_level: one row per decode step, prefill forwards counted in between."""

    def __init__(self) -> None:
        self.steps: list[tuple] = []  # (speculated, batch, forwards since the last decode, their prompts, policy state)
        self._forwards = self._prompts = 0

    def __call__(self, engine, step) -> None:
        if step.kind == "prefill":
            self._forwards += 1
            self._prompts += len(step.emitted)
            return
        read = getattr(engine.policy, "prefill_estimates", None)
        self.steps.append((step.speculated, step.batch_size, self._forwards, self._prompts,
                           read() if read is not None else {}))
        self._forwards = self._prompts = 0

    def table(self, segments: int) -> list[dict]:
        n, rows, prev = len(self.steps), [], None
        for k in range(segments):
            part = self.steps[k * n // segments:(k + 1) * n // segments]
            if not part:
                continue
            spec = [s[0] for s in part]
            switches = sum(a != b for a, b in zip([prev, *spec], spec) if a is not None)
            prev = spec[-1]
            forwards, prompts = sum(s[2] for s in part), sum(s[3] for s in part)
            last = part[-1][4]
            rows.append({"stretch": k, "steps": len(part), "speculative": sum(spec) / len(part),
                         "switches": switches, "batch": sum(s[1] for s in part) / len(part),
                         "forwards": forwards, "prompts_per_forward": prompts / forwards if forwards else None,
                         "lockstep": last.get("lockstep"), "lead": last.get("lead"),
                         "policy_prompts_per_forward": last.get("requests_per_prefill")})
        return rows


def trace(point: str, c: int, spec: str = "goodput", range_ratio: float = 1.0, level_scale: int = 1,
          seed: int = 0, segments: int = 20) -> dict:
    s, i = (int(v) for v in point.split(":"))
    m = member(s, i)
    profile, work = m.profile(), level_requests(m, c, range_ratio, level_scale)
    tps = {a: simulate_level(profile, a, c, seed=seed, **work)[0]["output_throughput"]
           for a in ("baseline", "policy:never", "eagle3")}
    stretches, engines = Stretches(), []
    tps[spec] = simulate_level(profile, f"policy:{spec}", c, seed=seed, engine_out=engines, on_step=stretches,
                               **work)[0]["output_throughput"]
    policy = engines[0].policy
    estimates = policy.estimates() if hasattr(policy, "estimates") else {}
    return {"member": m, "tps": tps, "stretches": stretches.table(segments),
            "bucket": f"{BUCKET_EDGES[bucket_of(c)]}+", "estimates": estimates}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("member", metavar="S:I", help="member I of family S (as envelope.py --family-member)")
    ap.add_argument("concurrency", type=int)
    ap.add_argument("--spec", default="goodput", help="the goodput spec traced (default goodput)")
    ap.add_argument("--range-ratio", type=float, default=1.0, metavar="R")
    ap.add_argument("--level-scale", type=int, default=1, metavar="K")
    ap.add_argument("--seed", type=int, default=0, help="simulator seed")
    ap.add_argument("--segments", type=int, default=20)
    args = ap.parse_args(argv)
    try:
        s, i = (int(v) for v in args.member.split(":"))
        if s < 0 or i < 0:
            raise ValueError
    except ValueError:
        ap.error(f"member must be S:I with two integers >= 0, got {args.member!r}")
    if args.concurrency < 1 or args.level_scale < 1 or args.segments < 1:
        ap.error("concurrency, --level-scale and --segments must be at least 1")
    if not 0.0 < args.range_ratio <= 1.0:
        ap.error(f"--range-ratio must be in (0, 1], got {args.range_ratio}")
    try:
        build_policy(args.spec, load_profile=load_profile)
    except PolicySpecError as exc:
        ap.error(str(exc))
    t = trace(args.member, args.concurrency, args.spec, args.range_ratio, args.level_scale, args.seed, args.segments)
    tps = t["tps"]
    own, best = max(tps["policy:never"], tps["eagle3"]), max(tps["baseline"], tps["eagle3"])
    print(t["member"])
    print("output tok/s (simulated): " + "  ".join(f"{a.removeprefix('policy:')} {v:.1f}" for a, v in tps.items()))
    print(f"{args.spec} / max(never, EAGLE-3) {tps[args.spec] / own:.3f}   / max(plain, EAGLE-3) "
          f"{tps[args.spec] / best:.3f}   EAGLE-3 / never {tps['eagle3'] / tps['policy:never']:.3f}")
    print(f"{'stretch':>7s} {'steps':>5s} {'spec':>5s} {'switch':>6s} {'batch':>6s} {'fwds':>5s} "
          f"{'per fwd':>7s} | {'lockstep':>8s} {'lead':>6s} {'per fwd':>7s} (the policy's, at the stretch's end)")
    for r in t["stretches"]:
        ppf = "-" if r["prompts_per_forward"] is None else f"{r['prompts_per_forward']:.1f}"
        pol = r["policy_prompts_per_forward"]
        print(f"{r['stretch']:7d} {r['steps']:5d} {r['speculative']:5.2f} {r['switches']:6d} {r['batch']:6.1f} "
              f"{r['forwards']:5d} {ppf:>7s} | {str(r['lockstep']):>8s} {r['lead'] if r['lead'] is not None else '-':>6} "
              f"{'-' if pol is None else f'{pol:.2f}':>7s}")
    print(f"estimates in bucket {t['bucket']}: {t['estimates'].get(t['bucket'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
