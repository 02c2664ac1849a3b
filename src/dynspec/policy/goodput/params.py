"""Goodput's parameters: the knobs a spec string sets (GoodputParams, the one definition the
parser, the constructor and the defaults read) and the constants it is built on."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from dynspec.policy.base import PolicySpecError


class GoodputConstants:
    """Fixed by design, not by the spec."""

    PROBE_MIN = 8  # steps: a probe's own estimate needs a few steps between probes
    BATCH_W = 1.0 / 32  # EMA weight of one step's batch size in its bucket's (PrefillAccount._mid)
    SHRINK = 4.0  # a bucket's acceptance leans on the global one until it has a few samples
    BORROW = 0.15  # a neighbour decides a new bucket when one mode wins there by this much
    # Batches up to this size are estimated request by request: a speculative step then costs
    # O(batch) Python; above it a batch's mean is the population's within a few percent.
    PER_REQUEST_MAX = 8
    # One speculative step's samples weigh at most 1 / ACC_STEPS in the acceptance estimate (a
    # probe's, standing for the steps since the last one, up to `alpha`): a batch's acceptance
    # moves only as its requests come and go, over hundreds of steps, while one step's mean at
    # batch 16 is off by a quarter of a draft.  Capped at `alpha` (0.1) instead, eight
    # speculative steps moved the gain by 5%, past the margin: a fresh policy at C=16 on one
    # H200 switched modes 30 times a level where speculating paid 5%.
    ACC_STEPS = 64
    REQ_WEIGHT = 0.05  # EMA weight of one departed request in the spread of acceptance across requests
    # A request's own steps weigh at most as n / (n + 8): the spread is learned from requests that
    # left, and those that looked bad early stopped being sampled (plain), so it runs high; a
    # request that starts unlucky must not be held plain for its whole life by a few draws.
    SHRINK_MIN = 8.0
    # Prefill forwards (note_prefill): requests that finish together prefill together, in one
    # forward's fixed cost; speculation scatters finishes, so each then pays its own.
    PF_WEIGHT = 0.2  # EMA weight of one prefill forward in the requests per forward
    OUT_DECAY = 1.0 - 1.0 / 1024  # per prefill forward: output per request forgets over ~1000 of them
    BURST_STEPS = 512  # decode steps the share of steps after a burst of prompts averages over
    LOCK_EVERY = 32  # decode steps between lockstep checks without a burst
    ROUND_TRIP = 4.0  # decode steps from a finish to its successor's arrival on a real server (_read_bursts)
    PEAK_STEPS = 8  # decode steps a finish waits for its successor (twice ROUND_TRIP), _read_burst
    PAIR_EVERY = 16  # speculative steps between two samples of how requests differ (_pair_sample)
    PAIR_WEIGHT = 0.002  # EMA weight of one request compared in a pair (at batch 32: 0.06, a memory of ~16 pairs)
    PAIR_PRIOR = 64.0  # requests' worth of no spread the first pairs are averaged with
    REGIME_STEPS_MIN = 8  # the regime's EMA spans at least this many decode steps
    MERGE_MAX = 0.5  # _merge saves at most half a spec step: its first-order form holds for small shares
    # A result's interval is a step time of its mode only when the steps it can hold all took
    # that mode: the step before it (a switch's cost, such as the resume, lands on the step after
    # it) and itself in the simulator, `window` = 2; on a live server also the step launched after
    # it, as the overlap scheduler launches step N+1 before it reads step N's result (the time
    # between two results holds one step's GPU work and the next one's host work): 3.  A probe
    # runs `window` steps of the other mode, so that its last one is steady.
    PROBE_STEPS = 2  # (set per instance from `window`)
    OV_DECAY = 0.98  # per refill forward: the prefill overhead forgets over ~50 of them
    EXCESS_MAX = 4.0  # steps a result's interval may hold beyond its own (a switch's, a prefill's)
    STALL_MAX = 2.0  # a steady step counts for at most this many times the estimate it updates
    # ... and for at most DEV_K typical distances over it (policy.observe): the distance an EMA of
    # weight DEV_W over what steps count for, from DEV_INIT of the estimate and at least DEV_MIN of
    # it.  Three mean absolute deviations are 2.4 standard deviations of normal noise: 1.6% of such
    # steps are clipped, by a fraction of a deviation each.
    DEV_K = 3.0
    DEV_W = 0.05
    DEV_INIT = 0.05
    DEV_MIN = 0.02
    # A probe's acceptance this many standard errors from the estimate: the requests changed
    # (Goodput._shifted); about 3 in 1,000 probes of unchanged requests cross it, each costing a
    # few probes more.
    SHIFT_Z = 3.0
    # The probe interval is cut by the chance that the other mode wins (the regret), out to this
    # many standard errors of the gain; beyond them that chance is negligible.
    REGRET_Z = 4.0
    # Step times by the batch's size and KV tokens (times.py, _kv_ref): a plane per mode and bucket,
    # a regression of steady steps on both about the bucket's running means, over the last
    # KV_SPAN..2 KV_SPAN samples (a steady step in four on one process), shrunk to the one pooled
    # over buckets as if that were KV_MIN samples; used once KV_MIN samples fed the pooled one, and
    # a step's time moved by it at most KV_SHIFT_MAX of the bucket's.  The fit rests besides on
    # KV_MIN samples of no slope spread KV_RIDGE tokens about the point (a ridge): steps a few hundred
    # tokens apart cannot tell a slope of a microsecond a token from a step's noise (a millisecond;
    # four of them, one slow, put 28 us a token on a speculative step at batch 16 whose slope was
    # 0.5, and its time at the +50% cap), while a level's thousands of tokens over hundreds of steps
    # outweigh the ridge a hundredfold.
    KV_SPAN = 256
    KV_MIN = 16
    KV_SHIFT_MAX = 0.5
    KV_RIDGE = 512


def knob(default: Any, help: str, option: str | None = None) -> Any:
    """A spec option: its default, what it means, and its name in a spec when not the field's."""
    return field(default=default, metadata={"help": help, "option": option})


@dataclass(frozen=True)
class GoodputParams:
    """What `goodput:KEY=VALUE,...` sets; a spec names options in this order in its errors."""

    probe: int = knob(2000, "most steps between probes of the other mode")
    budget: float = knob(0.005, "share of output that probes may cost")
    min_samples: int = knob(2, "steps each mode is tried per bucket without a profile")
    dwell: int = knob(8, "minimum steps between switches")
    margin: float = knob(0.02, "relative advantage needed to switch")
    lead: float = knob(0.05, "share more output speculation must promise to be chosen")
    lead_apart: float = knob(0.02, "the lead where finishes come at random (at most lead)")
    lead_batch: int = knob(32, "batch size from which the lead applies in full (in proportion below)")
    alpha: float = knob(0.1, "EMA weight of step times")
    acc_alpha: float = knob(0.005, "EMA weight of one request's accepted drafts")
    sync_every: int = knob(64, "steps between rank agreements on step times")
    use_times: bool = knob(True, "use measured step times (1/0)", option="times")
    merge: bool = knob(True, "count the prefills a spec step merges where finishes come apart (1/0)")
    window: int = knob(2, "decisions a result's interval can hold (2; a live overlap scheduler: 3)")
    by_kv: bool = knob(True, "step times follow the tokens in the batch's KV cache where steps report them (1/0)", option="kv")
    # Above 1: fewer probes where large batches are measured alike, in the simulator; not on a
    # live H100 (docs/POLICIES.md, "Uncertainty"), so one draw stays the default.
    draws: int = knob(1, "independent draws a speculative step's requests count as at most in the gain's "
                         "uncertainty, once they are measured alike (1: one request's draw)")

    def __post_init__(self) -> None:
        probe, budget, dwell, margin, lead, lead_apart = (self.probe, self.budget, self.dwell, self.margin,
                                                          self.lead, self.lead_apart)
        lead_batch, alpha, acc_alpha, sync_every, min_samples, window = (self.lead_batch, self.alpha, self.acc_alpha,
                                                                         self.sync_every, self.min_samples, self.window)
        probe_min = GoodputConstants.PROBE_MIN
        if (probe < probe_min or not 0 < budget < 1 or dwell < 0 or not 0 <= margin < 1 or self.draws < 1
                or not 0 <= lead < 1 or not 0 <= lead_apart < 1 or lead_batch < 1 or not 0 < alpha <= 1 or not 0 < acc_alpha <= 1 or sync_every < 1
                or min_samples < 1 or not 2 <= window <= 8):
            raise PolicySpecError(
                f"goodput: need probe>={probe_min}, 0<budget<1, dwell>=0, 0<=margin<1, draws>=1, 0<=lead<1, 0<=lead_apart<1, lead_batch>=1, "
                f"0<alpha<=1, 0<acc_alpha<=1, sync_every>=1, 2<=window<=8 (got window={window}, draws={self.draws}, probe={probe}, budget={budget}, dwell={dwell}, "
                f"margin={margin}, lead={lead}, lead_apart={lead_apart}, lead_batch={lead_batch}, alpha={alpha}, acc_alpha={acc_alpha}, sync_every={sync_every})"
            )


def spec_options() -> dict[str, tuple[str, str]]:
    """Each knob by its name in a spec: (field name, what it means)."""
    return {f.metadata["option"] or f.name: (f.name, f.metadata["help"]) for f in fields(GoodputParams)}
