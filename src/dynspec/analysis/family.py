"""A seeded family of made-up machines: step-cost profiles nobody tuned a policy to.

The shipped profiles are the ones goodput was developed against.  A user's machine is
not one of them, so `experiments/generated-machines/envelope.py --family N --seed S` runs the policies on N
profiles drawn here.  Member i of seed S is always the same profile (its own random
stream, `member(S, i)`), and every member goes through the same `Profile` model and
validation as a shipped one.

What is drawn, and why each range:

- the per-step speedup G(b) = accept_length * plain(b) / spec(b) over batch size b, in
  four shapes: falling through a crossover, flat then falling through it, never above 1
  (speculation never pays; flat ones sit just below 1), never below 1 (it always pays;
  flat ones sit just above 1).  Crossovers fall anywhere in 2..256, log-uniform, so
  most lie between goodput's bucket edges, not on them.  The drawn G is then capped at
  accept_length / (1 + MIN_SPEC_OVERHEAD), so a speculative step costs at least 5% more than a
  plain one: it verifies k+1 tokens per request and runs k draft forwards (uncapped, 21 of
  family 0's 200 members had cheaper speculative steps at some knot).  The cap is at least
  1.5 / 1.05 > 1.43, so it moves no crossover and leaves never-below-1 above 1 (its G at 256
  is at most 1.15); it draws nothing, so members drawn under it are as before, byte for byte;
- accept length 1.5 to 4 with chains of 2 to 5 drafts, and how much requests differ;
- the plain step: 4-40 ms at batch 1, growing 0.05% (memory-bound) to 5% (compute-bound)
  of that per extra request;
- the switching server's costs: catch-up 0.5-6% of a plain step, a resume 2-10% of one;
- the workload: decode-heavy (short prompts, long answers) or TTFT-heavy (long prompts,
  short answers), and a prefill cost in proportion to the plain step (the shipped profiles'
  shares: a prefill step's fixed cost 0.26-0.47 of a batch-1 plain step, 0.003-0.004 per token).
"""

from __future__ import annotations

import math
import random
from typing import Literal

from dynspec.models import Model
from dynspec.sim.profile import Profile, ProfileError, parse_profile

SHAPES = ("falling", "flat-then-falling", "never-above-1", "never-below-1")
# Knots of the step tables: about sqrt(2) apart, deliberately not goodput's bucket edges.
KNOTS = (1, 2, 3, 4, 6, 8, 11, 16, 23, 32, 45, 64, 91, 128, 181, 256)
MAX_BATCH = KNOTS[-1]
MIN_SPEC_OVERHEAD = 0.05  # a spec step is the target over k+1 tokens plus k draft forwards: >= 5% dearer than plain


class Member(Model):
    """One drawn machine and workload: everything its profile is built from."""

    seed: int
    index: int
    shape: Literal["falling", "flat-then-falling", "never-above-1", "never-below-1"]
    gain_1: float  # per-step speedup G at batch 1
    gain_end: float  # G at batch 256 (for the two shapes without a crossover)
    crossover: int | None  # where G passes 1 (the two falling shapes)
    knee: int  # G flat up to here (flat-then-falling), else 1
    accept_length: float
    num_steps: int
    concentration: float
    plain_ms: float  # plain step at batch 1
    slope: float  # plain step growth per extra request, as a share of plain_ms
    catch_up: float  # a switching server's plain step pays this share of a plain step more
    resume: float  # and a switch to speculating this share once
    workload: Literal["decode-heavy", "ttft-heavy"]
    input_len: int
    output_len: int
    prefill_fixed: float  # a prefill step's fixed cost, as a share of plain_ms
    prefill_per_token: float  # prefill ms per prompt token, as a share of plain_ms

    def gain(self, b: float) -> float:
        """The per-step speedup G(b) this member's profile is built to have: the drawn one, capped
        so that a speculative step costs at least (1 + MIN_SPEC_OVERHEAD) plain steps."""
        return min(self.uncapped_gain(b), self.accept_length / (1.0 + MIN_SPEC_OVERHEAD))

    def uncapped_gain(self, b: float) -> float:
        """G(b) as drawn, before the cap (above accept_length it would make spec_ms < plain_ms)."""
        lb = math.log(b)
        if self.shape in ("falling", "flat-then-falling"):
            if b <= self.knee:
                return self.gain_1
            assert self.crossover is not None  # member() draws one for the falling shapes
            # log G falls linearly in log b from gain_1 at the knee to 1 at the crossover, and on.
            g = math.exp(math.log(self.gain_1) * (1.0 - (lb - math.log(self.knee)) /
                                                   (math.log(self.crossover) - math.log(self.knee))))
            return max(g, 0.2)
        # gain_1 at batch 1 to gain_end at 256, linear in log b: flat when they are equal.
        return self.gain_1 + (self.gain_end - self.gain_1) * lb / math.log(MAX_BATCH)

    def plain(self, b: float) -> float:
        return self.plain_ms * (1.0 + self.slope * (b - 1))

    def profile(self) -> Profile:
        """The member as a profile, validated as any shipped one (ProfileError if it is not)."""
        knots = sorted(set(KNOTS) | ({self.crossover} if self.crossover else set()))
        plain = [self.plain(b) for b in knots]
        return parse_profile({
            "name": f"family-{self.seed}-{self.index}",
            "description": f"generated ({self.shape}); dynspec.analysis.family.member({self.seed}, {self.index})",
            "hardware": "made up",
            "speculative": {"num_steps": self.num_steps, "topk": 1, "num_draft_tokens": self.num_steps + 1},
            "acceptance": {"accept_length": self.accept_length, "concentration": self.concentration},
            "steps": {
                "batch_size": knots,
                "plain_ms": [round(p, 5) for p in plain],
                "spec_ms": [round(self.accept_length * p / self.gain(b), 5) for b, p in zip(knots, plain)],
                "catchup_ms": [round(self.catch_up * p, 5) for p in plain],
                "resume_ms": [round(self.resume * p, 5) for p in plain],
            },
            "prefill": {"fixed_ms": round(self.prefill_fixed * self.plain_ms, 5),
                        "per_token_ms": round(self.prefill_per_token * self.plain_ms, 6), "chunk_tokens": 8192},
            "provenance": {"kind": "derived", "source": "dynspec.analysis.family: a randomized profile, not a machine",
                           "command": f"experiments/generated-machines/envelope.py --family-member {self.seed}:{self.index}"},
        }, f"family member {self.seed}:{self.index}")


def _log_uniform(rng: random.Random, lo: float, hi: float) -> float:
    return math.exp(rng.uniform(math.log(lo), math.log(hi)))


def member(seed: int, index: int) -> Member:
    """Member `index` of family `seed`: the same profile on every run and machine."""
    rng = random.Random(f"dynspec-family-{seed}-{index}")
    shape = rng.choice(SHAPES)
    crossover, knee, gain_end = None, 1, 1.0
    if shape in ("falling", "flat-then-falling"):
        crossover = round(_log_uniform(rng, 2, MAX_BATCH))
        # Wins at batch 1 by 3% to 2.5x: a small win means a long, shallow stretch near 1.
        gain_1 = _log_uniform(rng, 1.03, 2.5)
        if shape == "flat-then-falling" and crossover >= 3:
            knee = max(1, round(_log_uniform(rng, 1, crossover / 1.5)))
    elif shape == "never-above-1":
        gain_1 = rng.uniform(0.6, 0.995)
        gain_end = gain_1 * rng.choice((1.0, rng.uniform(0.5, 1.0)))  # flat, or falling further
    else:
        gain_end = rng.uniform(1.005, 1.15)
        gain_1 = rng.choice((gain_end, _log_uniform(rng, gain_end, 2.5)))  # flat, or falling to it
    num_steps = rng.randint(2, 5)
    decode_heavy = rng.random() < 0.5
    kw = dict(
        seed=seed, index=index, shape=shape, gain_1=round(gain_1, 4), gain_end=round(gain_end, 4),
        crossover=crossover, knee=knee, num_steps=num_steps,
        accept_length=round(rng.uniform(1.5, min(4.0, 1.0 + 0.8 * num_steps)), 3),
        concentration=round(_log_uniform(rng, 4, 30), 2),
        plain_ms=round(_log_uniform(rng, 4, 40), 3),
        slope=round(_log_uniform(rng, 0.0005, 0.05), 6),
        catch_up=round(rng.uniform(0.005, 0.06), 4),
        resume=round(rng.uniform(0.02, 0.10), 4),
        workload="decode-heavy" if decode_heavy else "ttft-heavy",
        input_len=rng.randint(128, 1024) if decode_heavy else rng.randint(2048, 8192),
        output_len=rng.randint(192, 384) if decode_heavy else rng.randint(48, 128),
        prefill_fixed=round(rng.uniform(0.2, 0.5), 3),
        prefill_per_token=round(_log_uniform(rng, 0.001, 0.006), 6),
    )
    m = Member(**kw)
    for _ in range(20):  # requests this unlike may not reach the accept length: make them more alike
        try:
            m.profile()
            return m
        except ProfileError:
            m = m.model_copy(update={"concentration": round(m.concentration * 1.5, 2)})
    m.profile()  # still out of reach: let the validation error through
    return m


def family(n: int, seed: int = 0) -> list[Member]:
    return [member(seed, i) for i in range(n)]


# --- the policies on the family ----------------------------------------------------------

# Levels: bucket edges of goodput and the batch just below each (where a bucket's two ends
# differ most), plus per member the batches around its crossover (added in `levels_for`).
# Every level 1..256 would cost ~20x more simulation for little: between these a ratio
# changes smoothly except near a crossover, which each member covers itself.
LEVELS = (1, 2, 3, 4, 5, 6, 7, 8, 11, 12, 15, 16, 23, 24, 31, 32, 47, 48, 63, 64, 95, 96, 127, 128,
          191, 192, 255, 256)
# What a user would otherwise deploy, beside the dynamic arm (see docs/POLICIES.md):
STATIC_ARMS = ("hindsight-cutoff", "threshold:32", "sglang-default-tiers", "vllm-k0")
ARMS = ("dynamic", *STATIC_ARMS)


def levels_for(m: Member, levels=LEVELS) -> list[int]:
    near = {m.crossover + d for d in (-1, 0, 1)} if m.crossover else set()
    return sorted({c for c in set(levels) | near if 1 <= c <= MAX_BATCH})


def hindsight_cutoff(baseline: dict[int, float], eagle3: dict[int, float]) -> int:
    """The static cutoff `dynspec tune` picks from these two arms (its default objective, the
    mean ratio to the envelope): the best one could set knowing the results beforehand."""
    from dynspec.analysis.tune import Level, choose_cutoff

    return choose_cutoff([Level(c, baseline[c], eagle3[c]) for c in sorted(baseline)], "mean-ratio")


def vllm_k0_profile(p: Profile) -> Profile:
    """The profile as vLLM's K=0 steps cost: no speculation, but the draft still runs its full
    1-token forward to stay current (resume_ms on every plain step), and so nothing to resume."""
    data = p.model_dump(mode="json", exclude_none=True)
    steps = data["steps"][0]
    steps["catchup_ms"], steps["resume_ms"] = steps["resume_ms"], [0.0] * len(steps["resume_ms"])
    return parse_profile(data, f"{p.name} (vLLM K=0)")


def level_requests(m: Member, c: int, range_ratio: float = 1.0, level_scale: int = 1) -> dict:
    """simulate_level's request arguments for member m at concurrency c: level_scale x max(5C, 50)
    requests of the member's lengths, or with range_ratio < 1 output lengths drawn in
    [range_ratio x, 1 x] the member's, seeded by member and level (the same draws on every call)."""
    from dynspec.sim.lengths import draw_lengths
    from dynspec.sim.run import default_num_prompts

    n = level_scale * default_num_prompts(c)
    if range_ratio >= 1.0:
        return dict(input_len=m.input_len, output_len=m.output_len, num_prompts=n)
    rng = random.Random(f"dynspec-family-lengths-{m.seed}-{m.index}-{c}")
    return dict(lengths=[(m.input_len, o) for o in draw_lengths(rng, n, m.output_len, range_ratio)])


def level_throughputs(profile: Profile, arm: str, c: int, seed: int = 0, **work) -> tuple[float, float]:
    """Simulated output tok/s of one closed-loop level over the whole run and over its steady
    state (steady_throughput).  A closed loop starts with all C prompts at once (one wave,
    prefilled before anything decodes) and ends in a drain (after the last request is sent the
    batch empties); a server under constant load has neither.  Speculation's scattered finishes
    pay more of the drain than a plain lockstep, whose last wave ends together, and where prefill
    is most of the work the two ends nearly cancel."""
    from dynspec.sim.run import simulate_level

    metrics, records = simulate_level(profile, arm, c, seed=seed, **work)
    return metrics["output_throughput"], steady_throughput(records, c)


def steady_throughput(records, c: int) -> float:
    """Output tok/s of C clients' back-to-back requests as Little's law has it: C x tokens /
    latency summed over a cohort chosen by send time alone, each request's whole life (prefill
    included) spent among C in flight.  The cohort is the requests sent after the first wave and
    before the first send of any request still running at the last send: every one of them has
    finished by then, so none is left out for being slow.  Choosing instead the requests that
    finished by the last send keeps a late request only if it was quick, and the more requests'
    latencies spread (a long draft chain's scatter) the higher that reads: on a five-wave level of
    a TTFT-heavy member, K=7 by 10% over a level 12x as long.  A time window would not do either:
    cut where a lockstep has split into groups it holds the prefills of groups sent before the
    cut without their tokens."""
    first, last = min(r.start for r in records), max(r.start for r in records)
    cut = min((r.start for r in records if r.end > last), default=math.inf)
    cohort = [r for r in records if first < r.start < cut]
    busy = sum(r.end - r.start for r in cohort)
    return c * sum(r.output_tokens for r in cohort) / busy if busy > 0 else math.nan


def run_member(m: Member, arms=ARMS, levels=LEVELS, sim_seed: int = 0, range_ratio: float = 1.0,
               level_scale: int = 1) -> list[dict]:
    """Simulated output tok/s of baseline, eagle3 and `arms` at each level: one row per (arm, level),
    with the ratio to the envelope max(baseline, eagle3) (`of_envelope`) and to the switching
    server's max(never, eagle3) (`of_switching`: a plain step there pays the catch-up, so where plain
    wins no switching arm can beat 1 / (1 + catch-up) of the envelope).

    range_ratio < 1: each request's output length is drawn in [range_ratio x output_len, output_len]
    (bench_serving's --random-range-ratio), the same draws for every arm at a level.  With one
    fixed length a plain server's requests finish together, so their next prompts prefill in one
    batch, while speculation scatters the finishes and with them the prefills: a cost of the
    benchmark's lockstep that varied lengths do not have (docs/FAMILY_LOG.md).

    level_scale: each level serves that many times max(5C, 50) requests, so what a level costs
    once (the policy learning from nothing, the last requests draining) weighs less."""

    p = m.profile()
    cs = levels_for(m, levels)
    work = {c: level_requests(m, c, range_ratio, level_scale) for c in cs}  # drawn once: every arm the same

    steady: dict[str, dict[int, float]] = {}

    def tps(profile, arm, c, name):
        whole, steady.setdefault(name, {})[c] = level_throughputs(profile, arm, c, sim_seed, **work[c])
        return whole

    # "never": plain steps on the switching server, catch-up paid: with eagle3, the best a server
    # that can switch does at a level by choosing one mode for it (the policy's own error is against this).
    got = {a: {c: tps(p, a if a != "never" else "policy:never", c, a) for c in cs} for a in ("baseline", "eagle3", "never")}
    cutoff = hindsight_cutoff(got["baseline"], got["eagle3"])
    spec_of = {"dynamic": ("dynamic", None), "threshold:32": ("policy:threshold:32", 32),
               "sglang-default-tiers": ("policy:sglang-default-tiers", None),
               "hindsight-cutoff": (f"policy:threshold:{cutoff}" if cutoff else "policy:never", cutoff),
               "vllm-k0": (f"policy:table:1-{cutoff}=on,{cutoff + 1}-=off" if cutoff else "policy:never", cutoff)}
    k0 = vllm_k0_profile(p) if "vllm-k0" in arms else None
    for a in arms:
        arm, always_on_to = spec_of[a]
        # At or below its cutoff a static arm never leaves speculation: it is the eagle3 arm exactly.
        for c in cs:
            if always_on_to and c <= always_on_to:
                got.setdefault(a, {})[c], steady.setdefault(a, {})[c] = got["eagle3"][c], steady["eagle3"][c]
            else:
                got.setdefault(a, {})[c] = tps(k0 if a == "vllm-k0" else p, arm, c, a)
    rows = []
    for a, by_c in got.items():
        for c, v in by_c.items():
            env, own = max(got["baseline"][c], got["eagle3"][c]), max(got["never"][c], got["eagle3"][c])
            st = steady[a][c]
            st_env = max(steady["baseline"][c], steady["eagle3"][c])
            st_own = max(steady["never"][c], steady["eagle3"][c])
            rows.append({"member": m.index, "arm": a, "concurrency": c, "output_throughput": v,
                         "envelope": env, "of_envelope": v / env, "of_switching": v / own, "cutoff": cutoff,
                         "steady_throughput": st, "steady_of_envelope": st / st_env,
                         "steady_of_switching": st / st_own})
    return rows


CONFIRM_ARMS = {"baseline": "baseline", "eagle3": "eagle3", "never": "policy:never", "dynamic": "dynamic"}


def confirm_levels(task: tuple[Member, tuple[int, ...], tuple[int, ...], float, int]) -> list[dict]:
    """Rerun member-levels with other simulator seeds: one row per (level, sim seed) with each of
    CONFIRM_ARMS' output tok/s over the whole run and, as `steady_<arm>`, over its steady state
    (level_throughputs).  A seed changes the requests' acceptance draws; in a closed loop a
    different decision early changes which requests share later steps, so one seed's ratio of two
    arms moves by a few percent at small batches (docs/FAMILY_LOG.md), and a level that misses the
    target once is judged again on the mean over seeds.  One tuple argument: a Pool maps it."""
    m, cs, seeds, range_ratio, level_scale = task
    p = m.profile()
    rows = []
    for c in cs:
        work = level_requests(m, c, range_ratio, level_scale)
        for s in seeds:
            row: dict[str, float] = {"member": m.index, "concurrency": c, "sim_seed": s}
            for name, arm in CONFIRM_ARMS.items():
                row[name], row[f"steady_{name}"] = level_throughputs(p, arm, c, s, **work)
            rows.append(row)
    return rows
