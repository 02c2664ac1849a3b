"""Policies: before each decode step, speculate or decode plainly.

Every policy answers `decide(batch_size) -> bool` before a step and learns from
`observe(StepRecord)` after it.  The same objects run inside the patched SGLang
server (one copy per tensor-parallel rank), the simulator and the emulator.

Tensor-parallel safety: every rank must take the same decision at every step, or
the collectives hang.  So a decision may depend only on what every rank sees
identically (batch size, accepted-token counts, a profile read at start, the step
counter) or on values the ranks agreed on through the `sync` hook the caller
supplies.  Local wall-clock step times never reach a decision directly.  A policy
says what the ranks agree on (`sync_values`/`sync_apply`), when (`sync_schedule`,
a function of the step stream only) and what its decisions depend on (`state_key`,
checksummed across ranks); `Goodput(sync=hook)` runs the agreements itself, and
dynspec.sglang.hook.Controller runs them for any policy in a TP server (`defer_sync`).

Policies are built from one spec string, the same in the CLI, configs and the
server's environment (DYNSPEC_POLICY):

    always | never
    threshold:32 | threshold:on=24,off=32,dwell=50
    table:1-63=on,64-=off[,dwell=N]
    sglang-default-tiers
    goodput | goodput:profile=PATH,budget=0.005,probe=2000,dwell=8,margin=0.02,lead=0.05,sync_every=64
    cycle:spec=2,plain=3   (a switching stress test, not a policy to deploy)
"""

from __future__ import annotations

import bisect
import logging
import math
import operator
import zlib
from typing import TYPE_CHECKING, Any, Callable, Hashable, NamedTuple, Sequence

if TYPE_CHECKING:  # not at run time: the patched SGLang server imports this module, and it stays light
    from dynspec.sim.profile import Profile

log = logging.getLogger("dynspec.policy")

# Averages a flat list of floats across ranks (an all-reduce mean) and returns it.
SyncHook = Callable[[list[float]], list[float]]

# Steps between rank agreements for a policy that names no period of its own.
SYNC_EVERY = 64
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_INV_SQRT_2 = 1.0 / math.sqrt(2.0)


class PolicySpecError(ValueError):
    """A policy spec string that cannot be built; the message names the bad part."""


class StepRecord(NamedTuple):
    """What happened in one decode step (a tuple: cheap to build on the hot path)."""

    batch_size: int
    speculated: bool
    accepted: Sequence[int] = ()  # accepted draft tokens per request (bonus token not counted)
    step_time_s: float | None = None  # local wall time since the previous result; not rank-consistent
    requests: Sequence[Hashable] | None = None  # the requests' ids, in accepted's order (rank-identical)
    # No prefill was launched between the previous result and this one (a live server's overlap
    # pipeline: that interval then holds the prefill's host work too).  The simulator's always are.
    clean: bool = True


class Policy:
    """Base class: speculate (True) or decode plainly (False) before each step."""

    name = "policy"
    # Up to this batch size the policy uses the ids of a step's requests: a caller that knows
    # them calls set_batch before every decide (None above it) and fills StepRecord.requests.
    requests_up_to = 0

    def set_batch(self, requests: Sequence[Hashable] | None) -> None:
        """The ids of the requests the next decide()'s step runs (rank-identical, e.g. SGLang's
        rids), or None when the caller does not pass them (a batch above requests_up_to)."""

    def decide(self, batch_size: int) -> bool:
        raise NotImplementedError

    def wants_requests(self, batch_size: int) -> bool:
        """Whether the next speculative step's StepRecord should carry its requests' ids (a
        caller building them costs O(batch)): always up to requests_up_to, and above it when the
        policy asks (Goodput, now and then, to learn how requests differ)."""
        return batch_size <= self.requests_up_to

    def observe(self, rec: StepRecord) -> None:
        pass

    def note_prefill(self, requests: int, tokens: int, seconds: float | None = None) -> None:
        """A prefill (extend) forward ran between decode steps: `requests` whose prompts it
        finished and `tokens` prompt tokens (both rank-identical), taking `seconds` (local wall
        time, not rank-consistent; None when unmeasured)."""

    def reason(self, batch_size: int) -> str:
        """Why the current mode; called only when the mode switches."""
        return self.name

    def spec(self) -> str:
        """The spec string that rebuilds this policy."""
        return self.name

    # Tensor parallelism: what the ranks agree on (see sglang_hook.Controller) ---------
    def sync_schedule(self) -> "SyncSchedule":
        return SyncSchedule(SYNC_EVERY)

    def sync_values(self) -> list[float]:
        """Local values to all-reduce at an agreement (a fixed length per policy)."""
        return []

    def sync_apply(self, agreed: list[float]) -> None:
        """Take the rank-mean of sync_values()."""

    def defer_sync(self) -> None:
        """The caller runs the agreements (sync_values, sync_apply on sync_schedule())."""

    def state_key(self) -> tuple:
        """Everything decisions depend on, for the ranks' checksum: equal on every rank."""
        return ()


def state_checksum(key: tuple) -> int:
    """A process-independent 32-bit checksum of a state key (hash() of str is salted per process)."""
    return zlib.crc32(repr(key).encode())


class Always(Policy):
    name = "always"

    def decide(self, batch_size: int) -> bool:
        return True


class Never(Policy):
    name = "never"

    def decide(self, batch_size: int) -> bool:
        return False


class _Dwell:
    """Holds a mode for at least `dwell` steps after every switch."""

    __slots__ = ("dwell", "mode", "step", "switched_at")

    def __init__(self, dwell: int, mode: bool):
        self.dwell = dwell
        self.mode = mode
        self.step = 0
        self.switched_at = -(1 << 62)  # the first switch may come at any step

    def key(self) -> tuple:
        return (self.mode, self.step, self.switched_at)

    def want(self, mode: bool) -> bool:
        self.step += 1
        if mode != self.mode and self.step - self.switched_at >= self.dwell:
            self.mode = mode
            self.switched_at = self.step
        return self.mode


class Threshold(Policy):
    """Speculate while the batch is small: off above `off`, back on at or below `on`."""

    name = "threshold"

    def __init__(self, on: int, off: int, dwell: int = 16):
        if on < 0 or off < on:
            raise PolicySpecError(f"threshold: need 0 <= on <= off, got on={on}, off={off}")
        if dwell < 0:
            raise PolicySpecError(f"threshold: dwell must be >= 0, got {dwell}")
        self.on, self.off = on, off
        self._dwell = _Dwell(dwell, True)

    def decide(self, batch_size: int) -> bool:
        mode = self._dwell.mode
        if mode and batch_size > self.off:
            mode = False
        elif not mode and batch_size <= self.on:
            mode = True
        return self._dwell.want(mode)

    def reason(self, batch_size: int) -> str:
        return f"threshold on<={self.on} off>{self.off}: batch {batch_size}"

    def spec(self) -> str:
        return f"threshold:on={self.on},off={self.off},dwell={self._dwell.dwell}"

    def state_key(self) -> tuple:
        return self._dwell.key()


class Cycle(Policy):
    """`spec` speculative steps, then `plain` plain ones, over and over, whatever the load.

    Not a policy to deploy: a stress test of switching.  Every speculative stretch begins
    right after a plain one, so its draft acceptance shows whether the plain steps kept the
    draft current, and the cost of a switch is paid as often as possible."""

    name = "cycle"

    def __init__(self, spec: int, plain: int):
        if spec < 1 or plain < 1:
            raise PolicySpecError(f"cycle: spec and plain must be >= 1, got spec={spec}, plain={plain}")
        self.n_spec, self.n_plain = spec, plain
        self._step = 0

    def decide(self, batch_size: int) -> bool:
        phase = self._step % (self.n_spec + self.n_plain)
        self._step += 1
        return phase < self.n_spec

    def spec(self) -> str:
        return f"cycle:spec={self.n_spec},plain={self.n_plain}"


class Table(Policy):
    """A batch-size -> on/off table (the shape vLLM, TensorRT-LLM and SGLang share)."""

    name = "table"

    def __init__(self, ranges: Sequence[tuple[int, int | None, bool]], dwell: int = 0):
        # ranges: (low, high or None for open-ended, on), sorted and covering 1..inf.
        self.ranges = list(ranges)
        self._lows = [lo for lo, _, _ in self.ranges]
        self._on = [on for _, _, on in self.ranges]
        self._dwell = _Dwell(dwell, self._on[0])

    def lookup(self, batch_size: int) -> bool:
        i = bisect.bisect_right(self._lows, batch_size) - 1
        return self._on[max(i, 0)]

    def decide(self, batch_size: int) -> bool:
        return self._dwell.want(self.lookup(batch_size))

    def reason(self, batch_size: int) -> str:
        return f"table: batch {batch_size} -> {'on' if self.lookup(batch_size) else 'off'}"

    def spec(self) -> str:
        parts = [f"{lo}-{'' if hi is None else hi}={'on' if on else 'off'}" for lo, hi, on in self.ranges]
        return "table:" + ",".join(parts) + f",dwell={self._dwell.dwell}"

    def state_key(self) -> tuple:
        return self._dwell.key()


# --- SGLang 0.5.23's adaptive tiers, as a policy ------------------------------------
# Behaviour modelled on sglang/srt/speculative/adaptive_spec_params.py (0.5.23):
# per batch-size tier a set of candidate step counts, an EMA of accepted drafts, and
# a step count that moves one candidate down when the EMA falls below
# (next lower step - 0.5 + down_hysteresis) and up when it exceeds (current - 0.5 +
# up_hysteresis), re-evaluated every `update_interval` steps after a warm-up.
# Zero steps means no speculation; from zero it probes the smallest positive step.

SGLANG_DEFAULT_TIERS: dict[int, dict] = {
    1: {"candidate_steps": [1, 3, 5, 7], "down_hysteresis": -0.25},
    8: {"candidate_steps": [0, 1, 3]},
    32: {"candidate_steps": [0, 1]},
    64: {"candidate_steps": [0]},
}


class _Tier:
    __slots__ = ("candidates", "steps", "ema", "count", "alpha", "interval", "warmup", "down", "up")

    def __init__(self, initial_steps: int, cfg: dict):
        self.candidates = sorted(set(cfg["candidate_steps"]))
        self.alpha = cfg.get("ema_alpha", 0.2)
        self.interval = cfg.get("update_interval", 5)
        self.warmup = cfg.get("warmup_batches", 10)
        self.down = cfg.get("down_hysteresis", 0.0)
        self.up = cfg.get("up_hysteresis", 0.0)
        mid = self.candidates[len(self.candidates) // 2]
        self.steps = initial_steps if initial_steps in self.candidates else mid
        self.ema = float(self.steps - 1)
        self.count = 0

    def update(self, mean_accepted: float) -> None:
        if self.steps > 0:
            self.ema += self.alpha * (mean_accepted - self.ema)
        self.count += 1
        if self.count > self.warmup and (self.count - self.warmup) % self.interval == 0:
            self._recompute()

    def _recompute(self) -> None:
        i = self.candidates.index(self.steps)
        if self.steps == 0:
            i = min(i + 1, len(self.candidates) - 1)
            if self.candidates[i] > 0 and self.ema < 0:
                self.ema = float(self.candidates[i] - 1)
            self.steps = self.candidates[i]
            return
        start = i
        while i > 0:
            lower = self.candidates[i - 1]
            drop = (0.5 if lower == 0 else lower - 0.5) + self.down
            if self.ema > drop:
                break
            i -= 1
        if i == start:
            while i < len(self.candidates) - 1 and self.ema > self.candidates[i] - 0.5 + self.up:
                i += 1
        self.steps = self.candidates[i]


class SglangTiers(Policy):
    """SGLang 0.5.23's DEFAULT_ADAPTIVE_CONFIG reduced to on/off (steps > 0)."""

    name = "sglang-default-tiers"

    def __init__(self, initial_steps: int = 3, tiers: dict[int, dict] | None = None):
        tiers = tiers or SGLANG_DEFAULT_TIERS
        self._keys = sorted(tiers)
        self._tiers = [_Tier(initial_steps, tiers[k]) for k in self._keys]
        self.initial_steps = initial_steps

    def _tier(self, batch_size: int) -> _Tier:
        return self._tiers[max(bisect.bisect_right(self._keys, batch_size) - 1, 0)]

    def steps_for(self, batch_size: int) -> int:
        return self._tier(batch_size).steps

    def decide(self, batch_size: int) -> bool:
        return self._tier(batch_size).steps > 0

    def observe(self, rec: StepRecord) -> None:
        acc = rec.accepted
        self._tier(rec.batch_size).update(sum(acc) / len(acc) if acc else 0.0)

    def reason(self, batch_size: int) -> str:
        t = self._tier(batch_size)
        return f"sglang tier {self._keys[self._tiers.index(t)]}: steps={t.steps} ema_accepted={t.ema:.2f}"

    def spec(self) -> str:
        return f"sglang-default-tiers:steps={self.initial_steps}"

    def state_key(self) -> tuple:
        return tuple((t.steps, t.count, t.ema) for t in self._tiers)


# --- goodput: dynspec's own ---------------------------------------------------------

# Batch-size buckets: fine where batches are small, geometric above.
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


class SyncSchedule:
    """When the TP ranks agree: every `every` decisions, and once as soon as a batch-size
    bucket has had both modes tried `explore` times (so that a bucket just explored is not
    decided blind until the next periodic agreement).

    A function of the step stream only (step counter, batch sizes, modes), never of a
    policy's state: a rank whose policy has failed still joins every agreement."""

    __slots__ = ("every", "explore", "_seen")

    def __init__(self, every: int, explore: int = 0):
        self.every, self.explore = every, explore
        self._seen = [[0] * len(BUCKET_EDGES), [0] * len(BUCKET_EDGES)] if explore else None

    def due(self, step: int, batch_size: int, speculated: bool) -> bool:
        seen = self._seen
        if seen is not None:
            b, m = bucket_of(batch_size), 1 if speculated else 0
            seen[m][b] += 1
            if seen[m][b] == self.explore and seen[1 - m][b] >= self.explore:
                return True
        return step % self.every == 0


class Goodput(Policy):
    """Speculate when it is expected to give more output tokens per second.

    "Goodput" here is output tokens per second (SmartSpec's sense), not vLLM's or DistServe's
    requests meeting latency SLOs.  Per batch-size bucket it keeps an EMA of accepted draft
    tokens per request and, per mode, an estimate of the step time; expected goodput per
    request is (1 + accepted) / (1 + lead) / t_spec against 1 / t_plain, the lead in full from
    `lead_batch` requests and in proportion below, and `lead_apart` instead where finishes come
    at random (growing to `lead` where they come in lockstep; read from bursts of prompts).  Up to PER_REQUEST_MAX requests, told their
    ids (set_batch, StepRecord.requests), it estimates a batch's acceptance from its own
    requests, each shrunk to the arrivals' (empirical Bayes); above that the population's
    acceptance is taken as it settles while speculating, since requests that accept little
    stay longer (_settled, with the spread between requests from pairs of steps).  Step times start
    from a profile when given and are refined by measured times that the ranks agreed on
    (`sync`): steady steps only (`window`), a switch's aftermath as that switch's cost each way,
    and the prefills' overhead per request by mode, of which each step pays its share (_costs).  Without a profile, a new bucket is decided from a neighbour that clearly knows
    (directly, or through the bound G(b) <= G(b') b'/b for b < b': a request's share of a spec
    step does not grow with the batch), or by trying plain then speculative steps there
    (`min_samples` each, or one when decisive).  An acceptance sample weighs as much as the
    steps since the bucket's last one, so the estimate forgets at one pace in either mode.

    Probes keep the estimates honest: now and then it takes the other mode for one
    step.  A probe's expected cost (output lost, in steps of the current mode) sets
    its interval, so probes cost about `budget` of the output: frequent where the
    two modes are close (where the answer may flip), rare where one clearly wins,
    never more often than every 8 steps nor less than every `probe` steps in a bucket;
    every 8 steps also where a spec step gains in the batch as it is now though steady
    speculation would lose (a share of spec steps that beats both modes).
    A switch needs a `margin` advantage and is held for `dwell` steps.
    """

    name = "goodput"
    PROBE_MIN = 8  # steps: a probe's own estimate needs a few steps between probes
    SHRINK = 4.0  # a bucket's acceptance leans on the global one until it has a few samples
    BORROW = 0.15  # a neighbour decides a new bucket when one mode wins there by this much
    # Batches up to this size are estimated request by request: a speculative step then costs
    # O(batch) Python; above it a batch's mean is the population's within a few percent.
    PER_REQUEST_MAX = 8
    requests_up_to = PER_REQUEST_MAX
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
    OV_DECAY = 0.98  # per prefill forward: the prefill overhead forgets over ~50 of them
    EXCESS_MAX = 4.0  # steps a result's interval may hold beyond its own (a switch's, a prefill's)
    STALL_MAX = 2.0  # a steady step counts for at most this many times the estimate it updates

    def __init__(
        self,
        profile: Profile | None = None,
        *,
        sync: SyncHook | None = None,
        sync_every: int = 64,
        use_times: bool = True,
        probe: int = 2000,
        budget: float = 0.005,
        dwell: int = 8,
        margin: float = 0.02,
        lead: float = 0.05,
        lead_apart: float = 0.02,
        lead_batch: int = 32,
        alpha: float = 0.1,
        acc_alpha: float = 0.005,
        min_samples: int = 2,
        spec_text: str = "goodput",
        merge: bool = True,
        window: int = 2,
    ):
        if (probe < self.PROBE_MIN or not 0 < budget < 1 or dwell < 0 or not 0 <= margin < 1
                or not 0 <= lead < 1 or not 0 <= lead_apart < 1 or lead_batch < 1 or not 0 < alpha <= 1 or not 0 < acc_alpha <= 1 or sync_every < 1
                or min_samples < 1 or not 2 <= window <= 8):
            raise PolicySpecError(
                f"goodput: need probe>={self.PROBE_MIN}, 0<budget<1, dwell>=0, 0<=margin<1, 0<=lead<1, 0<=lead_apart<1, lead_batch>=1, "
                f"0<alpha<=1, 0<acc_alpha<=1, sync_every>=1, 2<=window<=8 (got window={window}, probe={probe}, budget={budget}, dwell={dwell}, "
                f"margin={margin}, lead={lead}, lead_apart={lead_apart}, lead_batch={lead_batch}, alpha={alpha}, acc_alpha={acc_alpha}, sync_every={sync_every})"
            )
        n = len(BUCKET_EDGES)
        self._spec_text = spec_text
        self.merge = merge  # count the prefills a spec step merges where finishes come apart (_merge)
        self.profile = profile
        self.sync = sync  # None: one process, whose own step times are agreed by definition
        self.sync_every = sync_every
        self.use_times = use_times
        self.probe, self.budget, self.margin, self.alpha = probe, budget, margin, alpha
        self.lead, self.acc_alpha = lead, acc_alpha
        # Speculative output is valued at 1/(1 + lead) of its face: speculation has costs a decode
        # step's time does not show (completions scatter, so batches drain unevenly), so it must
        # promise `lead` more output than plain decoding to be chosen.  Those costs grow with the
        # batch (the lead applies in full from `lead_batch` requests) and with how far finishes
        # still come together: where they come at random there is little left to scatter, and
        # the lead falls to `lead_apart` (_read_bursts; the prefills that scattering splits are
        # charged on their own, _scatter).
        self.lead_batch, self.lead_apart = lead_batch, min(lead_apart, lead)
        self._lead_share = [min(1.0, bucket_mid(b) / lead_batch) for b in range(len(BUCKET_EDGES))]
        self._discount = [1.0 / (1.0 + lead * w) for w in self._lead_share]  # the lead in full
        self._lead_now = lead  # as finishes come now (_read_bursts)
        self.min_samples = min_samples
        # [mode][bucket], mode 0 = plain, 1 = spec
        self.t_est: list[list[float | None]] = [[None] * n, [None] * n]
        self.n_seen: list[list[int]] = [[0] * n, [0] * n]
        self.acc_est: list[float | None] = [None] * n
        self.n_acc = [0] * n  # speculative steps that fed acc_est[b]
        self.acc_global: float | None = None
        self._n_acc_global = 0  # speculative steps that fed acc_global (a profile's prior: SHRINK)
        # Explore only what no prior covers: without a profile, both modes everywhere.
        self._explore = profile is None and use_times
        # A switch to speculating pays one resume (Profile.resume_time); without a profile, measured
        # speculative step times include it.
        self._t_resume = [0.0] * n
        if profile is not None:
            self.acc_global = profile.acceptance.mean_accepted
            self._n_acc_global = int(self.SHRINK)  # a prior worth a few samples, not one
            for b in range(n):
                bs = bucket_mid(b)
                self.t_est[0][b] = profile.plain_time(bs) + profile.catch_up_time(bs)  # as the patched server's
                self._t_resume[b] = profile.resume_time(bs)
                # A switch holds for at least `dwell` steps: the resume is at most that share of each.
                self.t_est[1][b] = profile.spec_time(bs) + self._t_resume[b] / max(dwell, 1)
        # Speculative steps behind each bucket's acceptance (the gain's uncertainty, _gain_sd):
        # capped, as the estimate forgets (an EMA over about 1 / acc_alpha of them).
        self._acc_steps = [float(self.SHRINK) if profile is not None else 0.0] * n
        self._acc_steps_max = 1.0 / acc_alpha
        self._acc_weight = [min(alpha, 1.0 - (1.0 - acc_alpha) ** k) for k in range(257)]
        self._acc_weight_n = len(self._acc_weight)
        self._acc_at = [0] * n  # _in_bucket at the last acceptance sample
        # Each running request's accepted drafts [sum, sum of squares, steps], by request id, and the
        # batch the next step runs (set_batch); None: ids unknown, the bucket's estimate stands.
        self._req: dict[Hashable, list[float]] = {}
        self._batch: Sequence[Hashable] | None = None
        self._batch_bucket = -1
        self._batch_acc: float | None = None  # the batch's estimate, while no step changed it
        # The variance of one step's accepted drafts within a request, learned from requests that
        # left; and of requests' own means around the population's (empirical Bayes, _settled),
        # from those and from pairs of speculative steps at any batch size (_pair_sample).
        self._var_within: float | None = None
        self._var_between: float | None = None
        self._departed = 0  # requests folded into those (_depart)
        self._departed_mean: float | None = None  # their own means' mean: the arrivals'

        # Survivorship (_settled): the share of recent steps that speculated (an EMA over about
        # half a request's life: the regime the batch was formed in), per bucket the regime its
        # acceptance samples came from, and pairs of speculative steps (_pair_sample).
        self._pair: tuple | None = None  # (request ids, accepted drafts) at the first step of a pair
        # the speculative step (counted in _n_acc_global, from its prior) at which the next pair opens
        self._pair_at = self._n_acc_global
        self._pair_df = 0  # requests the pairs so far compared
        self._f = 0.0
        self._f_w = 1.0 / self.REGIME_STEPS_MIN
        self._f_acc = [0.0] * n
        self._f_global = 1.0 if profile is not None else 0.0  # a profile's accept length is SGLang's, measured speculating
        # Prefill forwards: requests whose prompts each finished (EMA over forwards), output tokens
        # per admitted request (decayed counts), and the agreed durations' sums for the fixed cost
        # of a forward (least squares of seconds on tokens): n, sum x, sum y, sum xx, sum xy.
        self._per_prefill: float | None = None
        self._admitted = self._emitted = 0.0
        self._prompt_tokens = 0.0  # prompt tokens prefilled, decayed as _admitted (_merge)
        self._pf_max_tokens = 0  # the most tokens one prefill forward held: at most a chunk
        self._pf = [0.0] * 5
        self._pf_buf = [0.0] * 5  # measured since the last agreement (TP)
        self._pf_fixed: float | None = None
        self._refilled = False  # a prefill came after decoding began (a request had finished)
        # Bursts of prompts: the share of decode steps that follow one (a running mean over the
        # first BURST_STEPS steps, then an EMA over as many), and requests per burst (EMA).
        self._burst = 0  # requests in the burst under way (prefills since the last decode step)
        self._burst_p = 0.0
        self._burst_n: float | None = None
        self._decoded = 0
        # The share of decode steps after a burst counted from the first refill (_merge): the
        # first wave, before any request can finish, would make arrivals look rarer than they are.
        self._clump_p, self._clump_n = 0.0, 0
        self._lock = False  # finishes in lockstep (_read_bursts), as of the last burst or LOCK_EVERY decode steps
        self._last_b = 0  # the bucket of the last step observed
        self._known = [not self._explore] * n  # a bucket explored, or decided from a neighbour
        self._seeded = [[False] * n, [False] * n]  # t_est borrowed from a neighbour, not measured
        self._t_seen = [[1.0 if profile is not None else 0.0] * n for _ in range(2)]  # steady steps folded in
        # Times measured since the last sync: [kind][bucket] sum and count; kind 0 plain, 1 spec
        # (steady steps), 2 and 3 what switches to speculation and to plain cost (one per switch).
        self._t_sum = [[0.0] * n, [0.0] * n, [0.0] * n, [0.0] * n]
        self._t_cnt = [[0] * n, [0] * n, [0] * n, [0] * n]
        self._in_bucket = [0] * n  # decisions taken in each bucket
        self._last_seen = [[0] * n, [0] * n]  # _in_bucket when a mode last ran there
        self._choice = [False] * n  # a near tie stays plain (see lead)
        self._interval = [[probe] * n, [probe] * n]  # probe interval while in [mode][bucket]
        self._dwell = _Dwell(dwell, True)
        self._step = 0
        self._probing = False
        # A probe under way: steps left, its bucket and mode; probes taken [from mode][bucket]
        self._probe_left, self._probe_b, self._probe_mode = 0, -1, False
        self._probes = [[0] * n, [0] * n]
        # The last `window` decisions as bits (1: speculate), and how many were taken.
        self._window, self._decided = 0, 0
        self.window = self.PROBE_STEPS = window
        self._window_all = (1 << window) - 1
        # The switch under way: its direction (1 to speculation), bucket and the time its aftermath
        # cost beyond each step's own (folded into _t_resume / _t_pause when the next one comes).
        self._sw_dir, self._sw_b, self._sw_sum, self._sw_n = -1, 0, 0.0, 0
        self._t_pause = [0.0] * n  # what a switch to plain costs the server (its aftermath's excess)
        self._sw_seen = [[1.0 if profile is not None else 0.0] * n, [0.0] * n]  # switches folded in
        self._after_pf = False  # a prefill result came since the last decode result
        # Prefill overhead by mode: wall seconds around prefill forwards beyond the decode steps'
        # own (decayed sums), and the requests those prefills admitted; buffered for an agreement (TP).
        self._ov = [[0.0, 0.0], [0.0, 0.0]]
        self._ov_buf = [0.0, 0.0, 0.0, 0.0]
        self._cp = self._cs = 0.0  # _per_request, kept current by _overhead
        self._mid = [bucket_mid(b) for b in range(n)]
        self._sd_within = 1.0  # sqrt of the within-request variance of accepted drafts (_gain_sd)
        self._self_sync = sync is not None  # False once a caller runs the agreements (defer_sync)
        self._buffer_times = sync is not None  # times wait for an agreement instead of counting at once
        self._schedule = self.sync_schedule()
        for b in range(n):
            self._refresh(b)

    # Decision ----------------------------------------------------------------------
    def _accepted(self, b: int) -> float | None:
        pop, batch = self._population(b), self._batch
        if batch is None or b != self._batch_bucket or pop is None:
            return pop
        # The batch's own requests: each one's mean so far, shrunk to the arrivals' by its
        # steps n as n / (n + S), S = within- over between-request variance.  Requests alike
        # (S large) lean on the population; unlike ones soon on their own, so a hard request
        # at C=1 switches speculation off within its life, and its successor starts afresh.
        # (Seen one by one, the batch is what it is: no lingering to correct for, _settled.)
        wi, bt = self._var_within, self._var_between
        if wi is None or bt is None or bt <= 0.0:
            return pop
        if self._batch_acc is None:
            arrivals = self._population(b, 0.0)
            mean = pop if arrivals is None else arrivals
            shrink, req, total = max(wi / bt, self.SHRINK_MIN), self._req, 0.0
            for rid in batch:
                s = req.get(rid)
                total += mean if s is None else (s[0] + shrink * mean) / (s[2] + shrink)
            self._batch_acc = total / len(batch)
        return self._batch_acc

    def _population(self, b: int, regime: float = 1.0) -> float | None:
        """Accepted drafts per request in bucket b over whichever requests ran there, in a batch
        formed while a share `regime` of steps speculate (_settled): by default as they settle
        while speculating steadily."""
        a, g = self.acc_est[b], self.acc_global
        if a is None or g is None:
            return g if a is None else self._settled(a, self._f_acc[b], regime)
        k, s = self.n_acc[b], self.SHRINK
        a = (k * a + s * g) / (k + s)
        v = self._var_between
        if v is None or v <= 0.0:  # _settled's first line, inline: this runs every step
            return a
        return self._settled(a, (k * self._f_acc[b] + s * self._f_global) / (k + s), regime)

    def _settled(self, a: float, f: float, regime: float = 1.0) -> float:
        """Accepted drafts per request per step in a batch formed while a share `regime` of steps
        speculate, from a mean a sampled while a share f did.  Requests differ (variance v of
        their own means m); each stays for its output over the tokens it gains per step, so the
        batch holds requests in proportion to 1 / (1 + f (m - 1)): under plain steps (f = 0) as
        they arrive, mean mu; steadily speculating (f = 1) the slow ones linger, and the batch's
        mean falls to the harmonic mean; to second order mu - f v / (1 + f (mu - 1)).  A probe
        from plain sees the arrivals' mean: without this, speculation looks better than it will
        be."""
        v = self._var_between
        if v is None or v <= 0.0 or f == regime:
            return a
        mu = 1.0 + a + f * v / (1.0 + f * a)
        return max(mu - regime * v / (1.0 + regime * (mu - 1.0)) - 1.0, 0.0)

    def set_batch(self, requests: Sequence[Hashable] | None) -> None:
        n = 0 if requests is None else len(requests)
        if requests is None or not 0 < n <= self.PER_REQUEST_MAX:
            self._batch, self._batch_bucket = None, -1
            return
        if requests == self._batch:
            return  # the same requests: what they told is already in the estimate
        self._batch, b = requests, bucket_of(n)
        self._batch_bucket, self._batch_acc = b, None
        if len(self._req) > n + 4:  # requests that left: learn the spread from them, then forget
            keep = set(requests)
            gone = [rid for rid in self._req if rid not in keep]
            for rid in gone:
                self._depart(self._req.pop(rid))
        if self._var_between is not None:
            self._refresh(b)

    def _depart(self, s: list) -> None:
        """Fold a departed request's own mean into the spread within and between requests.  Its
        spread is taken around the mean of the requests that departed before it (every request
        departs once, so they are the arrivals), not around an estimate that itself leans on the
        spread: centred on the population's settled estimate, one outlier among the first
        departures fed back through _settled and the spread grew without bound (member 0:60 at
        C=1 overflowed a float)."""
        total, squares, n = s
        if n < 2:
            return
        k = self._departed = self._departed + 1
        w, mean = max(self.REQ_WEIGHT, 1.0 / k), total / n  # the first ones averaged, then an EMA
        within = max(squares - total * mean, 0.0) / (n - 1)
        self._var_within = within if self._var_within is None else self._var_within + w * (within - self._var_within)
        v = self._var_within
        self._sd_within = math.sqrt(v) if v is not None and v > 0.0 else 1.0
        centre = self._departed_mean
        self._departed_mean = mean if centre is None else centre + w * (mean - centre)
        if centre is None:
            return
        # (mean - centre)^2 holds the request's own noise, var_within / n, beside the spread
        between = (mean - centre) ** 2 - self._var_within / n
        self._var_between = between if self._var_between is None else self._var_between + w * (between - self._var_between)

    def _times(self, b: int) -> tuple[float | None, float | None]:
        """Plain and spec step times in bucket b.  A plain step does a subset of a speculative
        step's work (one target token per request instead of k+1, a KV-only catch-up instead of
        a draft), so a plain estimate above the spec one is an outlier (a warm-up step, a stall)
        and counts as the spec time: one slow plain step must not keep a losing draft running."""
        tp, ts = self.t_est[0][b], self.t_est[1][b]
        return (min(tp, ts) if tp is not None and ts is not None else tp), ts

    def _gain(self, b: int, scatter: bool = True) -> float | None:
        """Expected spec/plain goodput ratio in bucket b (speculation's output discounted by the
        lead, and by the prefills it scatters unless scatter=False: what the machine alone
        says, for exploring and borrowing), None while unknown."""
        (tp, ts), acc = self._times(b), self._accepted(b)
        if tp is None or ts is None or acc is None:
            return None
        cp, cs = self._costs(b, acc, tp, ts)
        return self._valued(b, acc, tp, ts, scatter) * cp / cs

    def _valued(self, b: int, acc: float, tp: float, ts: float, scatter: bool = True) -> float:
        """Output per request of a spec step as valued: 1 + acc discounted by the lead as finishes
        come now and by the prefills that scattering them costs or merging them saves (_prefills); with scatter=False,
        by the full lead alone."""
        if not scatter:
            return (1.0 + acc) * self._discount[b]
        return (1.0 + acc) / (1.0 + self._lead_now * self._lead_share[b] + self._prefills(b, acc, tp, ts))

    def _prefills(self, b: int, acc: float, tp: float, ts: float) -> float:
        """Prefill time a spec step adds (or, below 0, saves) by how it changes the prefill
        forwards that admit the requests' successors, as a share of the step: where groups finish
        together (a lockstep, or what is left of one) it scatters them (_scatter); where finishes
        already come apart it gathers more of them into each forward (_merge).  (Crediting the
        merge while groups of a split lockstep still prefill together switched fixed-length levels
        to speculation that scattered them: member 0:143 at C=64 went 0.985 -> 0.933.)"""
        cost = self._scatter(b, acc, tp, ts)
        if cost > 0.0 or self._lock or not self.merge or self._clump_n <= 0:
            return cost
        return self._merge(b, acc, tp, ts)

    def _merge(self, b: int, acc: float, tp: float, ts: float) -> float:
        """Prefill time a spec step saves (a share <= 0 of the step) where finishes come apart.

        The forward after a decode step prefills every prompt that arrived during it, and a
        prompt arrives for each finish.  A spec step gives 1 + acc plain steps' output, so it
        gathers their arrivals into one forward where plain steps pay up to 1 + acc: with l
        arrivals per plain step's output, at random, 1 - exp(-l (1 + acc)) forwards' fixed cost
        against (1 + acc)(1 - exp(-l)).  l is the finishes per plain step (batch over output per
        request), or fewer where bursts come more rarely than that (p of the decode steps since
        the first refill follow one: l = -ln(1 - p) / (1 + f acc), f the share of steps
        speculating): bunched prompts merge less (a real server's bursts are bunched: 5.8 prompts
        on 17% of steps at C=64, data/measured/h200-llama8b-lockstep-range).  A forward holds c
        prompts (the most tokens one held over prompt tokens per request), and what merging
        saves is 1 - 1/c of that: prompts near a chunk's size take a forward each anyway.
        (Simulated, family 0 at five waves, varied lengths: member-levels below 0.97 of
        max(never, EAGLE-3) over the steady state 132 -> 68; docs/FAMILY_LOG.md.)"""
        fixed = self._pf_fixed
        per = self._prompt_tokens / self._admitted if self._admitted > 0.0 else 0.0
        if fixed is None or per <= 0.0 or self._pf_max_tokens <= per:
            return 0.0
        lam = bucket_mid(b) / max(self._emitted / self._admitted, 1.0)
        bunched = -math.log1p(-min(self._clump_p, 0.999)) / (1.0 + self._f * acc)
        if bunched < lam:
            lam = bunched
        saved = (1.0 + acc) * -math.expm1(-lam) + math.expm1(-lam * (1.0 + acc))
        share = (1.0 - per / self._pf_max_tokens) * saved * min(fixed, tp) / ts
        return -share if share < self.MERGE_MAX else -self.MERGE_MAX

    def _scatter(self, b: int, acc: float, tp: float, ts: float) -> float:
        """Prefill time a spec step adds by scattering finishes, as a share of the step.

        Requests that finish in the same step prefill their successors in one forward.  Apart
        from chance, that happens when they move in lockstep (a closed loop of fixed lengths
        decoding plainly); a spec step advances each request by its own accepted drafts, so
        finishes then come as if independent: lam = batch x (1 + acc) / output per request of
        them per step, E = lam / (1 - exp(-lam)) per forward.  Each pays its share of a forward's
        fixed cost, 1 / E, where now it pays 1 / per_prefill.  The fixed cost is at most a plain
        step's (a decode forward pays it too)."""
        fixed, g = self._pf_fixed, self._per_prefill
        if fixed is None or g is None or g <= 1.0 or self._admitted <= 0.0:
            return 0.0
        out = max(self._emitted / self._admitted, 1.0)
        lam = bucket_mid(b) * (1.0 + acc) / out
        if not self._refilled:
            # No request has finished yet: out is only a lower bound.  The cost lam (1/E - 1/g)
            # is largest at lam = ln g, so take at most that: unsure, err to plain.
            lam = min(lam, math.log(g))
        extra = (-math.expm1(-lam) / lam if lam > 1e-9 else 1.0) - 1.0 / g
        return lam * extra * min(fixed, tp) / ts if extra > 0.0 else 0.0

    def _read_bursts(self) -> None:
        """How far requests finish together beyond chance: _lock, and the lead that goes with it.

        Prompts arrive in bursts (the prefill forwards between two decode steps) of n requests
        on a share p of decode steps, so n p finish per step.  At random, what a client's round
        trip (ROUND_TRIP decode steps) gathers into one burst is lam = ROUND_TRIP n p of them,
        e = lam / (1 - exp(-lam)) a burst; lockstep is bursts of at least 2 and twice that.
        Before any request has finished, every one so far came in the first burst.  The lead
        runs from lead_apart at chance to the full lead at lockstep's twice chance.  (Measured on
        an H200, C=64, data/measured/h200-llama8b-lockstep*: fixed lengths 50 prompts a burst on
        0.7% of steps; output lengths 64..128, 5.8 on 17%.)"""
        p, n = self._burst_p, self._burst_n
        if n is None:  # no prefill told (SGLang 0.5.23's adaptive protocol): the lead in full
            self._lock, self._lead_now = False, self.lead
            return
        if n < 2.0:  # prompts one at a time
            self._lock, self._lead_now = False, self.lead_apart
            return
        if not self._refilled:
            self._lock, self._lead_now = True, self.lead
            return
        lam = self.ROUND_TRIP * n * p
        e = lam / -math.expm1(-lam) if lam > 1e-9 else 1.0
        self._lock = n >= 2.0 * e
        self._lead_now = self.lead_apart + (self.lead - self.lead_apart) * min(max(n / e - 1.0, 0.0), 1.0)

    def _refresh(self, b: int) -> None:
        # Runs after every step observed: written for speed (dynspec policy bench), builtins
        # min/max/int and method calls kept off the common path.
        tp, ts = self.t_est[0][b], self.t_est[1][b]
        if tp is None or ts is None:
            return
        if tp > ts:  # _times
            tp = ts
        acc = self._accepted(b)
        if acc is None:
            return
        # tokens per request as valued (_valued inline)
        cost = 1.0 + self._lead_now * self._lead_share[b]
        if self._pf_fixed is not None:
            cost += self._prefills(b, acc, tp, ts)
        out = (1.0 + acc) / cost  # output per request of a spec step, as valued
        tp, ts = self._costs(b, acc, tp, ts)  # each with its share of the prefills' overhead
        g = out * tp / ts
        # Hysteresis: leave the current choice only for a margin's worth of gain.
        choice = self._choice[b]
        choice = self._choice[b] = g > (1.0 - self.margin) if choice else g > (1.0 + self.margin)
        # Output lost by one probe, in steps of the mode probed from: from plain, a spec
        # step and its resume r cost (ts + r)/tp plain steps and return `out` tokens, and never
        # less than the resume; from spec, a plain step returns 1 token where spec would give g,
        # out of `out` per spec step, and the way back pays r.  The switch's own cost keeps
        # probes from coming every few steps where the two modes are tied.
        # A probe is PROBE_STEPS steps of the other mode and a switch there and back (r + pz).
        r, k = self._t_resume[b] + self._t_pause[b], self.PROBE_STEPS
        from_plain = k * (ts / tp - out) + r / tp
        if from_plain < r / tp:
            from_plain = r / tp
        if not choice and self._var_between and self._batch_bucket != b:
            # Between requests that differ, a probe in a batch formed mostly plain sees the
            # arrivals' mix and may gain where steady speculation would lose: then probing as
            # often as allowed speculates on a share of steps (at most 1 / PROBE_MIN) whose
            # batch keeps the arrivals' mix, which beats either mode alone.
            now = self._population(b, self._f)
            if now is not None:
                now = self._valued(b, now, tp, ts)
                if now * tp > ts + r:
                    from_plain = 0.0
        from_spec = k * (g - 1.0) / out + r / ts if g > 1.0 else r / ts
        # A probe from plain steps in lockstep (_scatter) splits each group of requests that
        # finish together into as many as its step's outcomes, for good: a forward's fixed cost
        # more per extra group, on this wave and on every one after it.  The first is the
        # probe's own cost.  Once a refill has shown the lockstep (a first wave's is presumed),
        # the later ones are a share of every step's output lost from then on (split over a
        # request's life in plain steps, its output), paid out of the budget before any probe's
        # own cost: where it alone exceeds the budget, probes from plain come as rarely as allowed.
        # A probe takes at most one step in PROBE_MIN: its PROBE_STEPS steps come at least that far apart.
        lo, hi, budget = self.PROBE_MIN * self.PROBE_STEPS, self.probe, self.budget
        spare = budget
        if self._lock:
            per, fixed = self._per_prefill, self._pf_fixed
            if fixed is not None and per is not None:
                split = (min(per, 1.0 + out) - 1.0) * min(fixed, tp) / tp  # plain steps a wave
                from_plain += split
                if self._refilled:
                    life = self._emitted / self._admitted  # > 0: a refill admitted requests
                    spare -= split / life if life > 1.0 else split
        x = from_plain / spare if spare > 0.0 else hi + 1.0
        y = from_spec / budget
        # The estimate is uncertain (acceptance from few request-steps): waiting I steps forgoes
        # I x E[(other mode's gain)+] in expectation; a probe should come before that exceeds
        # what the probe costs, so an unlucky first sample is checked again soon while many
        # samples let a clear loser rest.
        n = self._acc_steps[b]
        if n > 0.0 and not self._lock:  # (in a lockstep a probe's damage lasts: _lock's rationing above)
            sd, d = g * self._sd_within / (math.sqrt(n) * (1.0 + acc)), abs(g - 1.0)  # _gain_sd
            if d < 4.0 * sd:  # beyond four standard errors the other mode's chance is negligible
                z = d / sd
                regret = sd * math.exp(-0.5 * z * z) * _INV_SQRT_2PI - d * 0.5 * math.erfc(z * _INV_SQRT_2)
                # E[(G - 1)+] plain, E[(1 - G)+] speculating
                if regret > 0.0:
                    if not choice and x * regret > from_plain:
                        x = from_plain / regret
                    if choice and y * regret > from_spec:
                        y = from_spec / regret
        iv = self._interval
        iv[0][b] = hi if x > hi else int(x) if x >= lo else lo  # (a NaN gives lo)
        iv[1][b] = hi if y > hi else int(y) if y >= lo else lo

    def decide(self, batch_size: int) -> bool:
        b = bucket_of(batch_size)
        spec = self._choose(b, batch_size)
        w = self._window
        if self._decided and spec != (w & 1):  # a switch: what follows it until steady is its cost
            self._end_switch()
            self._sw_dir, self._sw_b, self._sw_sum, self._sw_n = int(spec), b, 0.0, 0
        self._window = ((w << 1) | spec) & self._window_all
        self._decided += 1
        return spec

    def _choose(self, b: int, batch_size: int) -> bool:
        self._step += 1
        if self._probe_left:  # a probe under way goes on while the batch stays in its bucket
            if self._probe_b == b:
                self._probe_left -= 1
                self._in_bucket[b] += 1
                return self._take(self._probe_mode, b, probe=True)
            self._probe_left = 0
        if self._explore and not self._known[b]:
            seen, least = self.n_seen, max(self.min_samples, self.PROBE_STEPS)
            # Plain first: a plain step costs at most the speedup speculation would have given, a
            # speculative one on a losing machine many plain steps; and one of those is enough
            # when it already loses (or wins) decisively.  Each mode runs long enough for steady
            # steps (`window`) to show what it costs.
            if self._borrow(b, batch_size) or self._decisive(b):
                self._known[b] = True
            elif seen[0][b] < least:
                return self._take(False, b)
            elif seen[1][b] < least:
                return self._take(True, b)
            else:
                self._known[b] = True
        mode = self._dwell.want(self._choice[b])
        # Probe clocks count steps spent in this bucket, so a bucket visited rarely is not
        # probed on every visit.
        self._in_bucket[b] += 1
        if self._in_bucket[b] - self._last_seen[not mode][b] >= self._interval[mode][b]:
            # A probe runs PROBE_STEPS steps: only steps inside a run of one mode show what that
            # mode costs (`window`), and the switch there and back is measured.
            self._probe_left, self._probe_b, self._probe_mode = self.PROBE_STEPS - 1, b, not mode
            self._probes[mode][b] += 1
            self._refresh(b)  # the interval's cap grows with the probes taken (_refresh)
            return self._take(not mode, b, probe=True)
        self._last_seen[mode][b] = self._in_bucket[b]
        self._probing = False
        return mode

    def _borrow(self, b: int, batch_size: int) -> bool:
        """Decide a new bucket from a neighbour's evidence instead of trying both modes there.

        Speculation's relative cost does not fall as the batch grows (verifying k+1 tokens per
        request turns compute-bound first), so a smaller bucket where it clearly loses says it
        loses here too, and a larger one where it clearly wins says it wins here.  Nor does a
        request's share of a spec step grow with the batch (t_spec(b)/b does not rise), while a
        plain step does not get cheaper as it grows, so the speedup G at most doubles when the
        batch halves: G(b) <= G(b') b'/b for b < b'.  A larger bucket
        where speculation loses by more than that says it loses here, a smaller one where it
        wins by more says it wins here (a level that drains through the buckets would otherwise
        try a speculative step in each, at many plain steps' cost where it loses by 5x).
        The bucket starts from that neighbour's step times (the spec one scaled by the bound);
        its own measurements replace them, and probes check the borrowed mode as anywhere else."""
        n, decisive = len(BUCKET_EDGES), self.BORROW
        for nb in range(b - 1, -1, -1):  # the nearest smaller bucket that knows
            if self._known[nb]:
                g = self._gain(nb, scatter=False)
                if g is not None and g < 1.0 - decisive:
                    return self._seed(b, nb)
                break
        for nb in range(b + 1, n):  # the nearest larger one
            if self._known[nb]:
                g = self._gain(nb, scatter=False)
                if g is not None and g > 1.0 + decisive:
                    return self._seed(b, nb)
                break
        # The bound, from the nearest buckets that measured a spec step (a bound applied to a
        # borrowed bound would double it; a resumed step's time is near enough).
        for nb in range(b - 1, -1, -1):
            if self.n_seen[1][nb]:
                g, low = self._gain(nb, scatter=False), BUCKET_EDGES[nb]  # its estimate holds at batches >= low
                if g is not None and g * low / batch_size > 1.0 + decisive:
                    return self._seed(b, nb, batch_size / low)
                break
        for nb in range(b + 1, n):
            if self.n_seen[1][nb]:
                g = self._gain(nb, scatter=False)
                high = BUCKET_EDGES[nb + 1] - 1 if nb + 1 < n else BUCKET_EDGES[nb]  # ... <= high
                if g is not None and g * high / batch_size < 1.0 - decisive:
                    return self._seed(b, nb, batch_size / high)
                break
        return False

    def _decisive(self, b: int) -> bool:
        """One mode wins by more than BORROW, beyond two standard errors of the estimate."""
        g = self._gain(b, scatter=False)
        if g is None:
            return False
        acc = self._accepted(b) or 0.0
        return abs(g - 1.0) > self.BORROW + 2.0 * self._gain_sd(b, acc, g)

    def _seed(self, b: int, nb: int, spec_scale: float = 1.0) -> bool:
        for m in (0, 1):
            t = self.t_est[m][nb]
            if t is not None and (self.n_seen[m][b] == 0 or self.t_est[m][b] is None):
                self.t_est[m][b] = t * spec_scale if m else t
                self._seeded[m][b] = True
        self._known[b] = True
        self._refresh(b)
        return True

    def _take(self, mode: bool, b: int, probe: bool = False) -> bool:
        self._last_seen[mode][b] = self._in_bucket[b]
        self._probing = probe
        return mode

    # Learning ----------------------------------------------------------------------
    def observe(self, rec: StepRecord) -> None:
        bs, speculated, accepted, t, rids, _ = rec
        b = _BUCKETS[bs] if 0 <= bs < _N_BUCKETS else _LAST_BUCKET  # bucket_of, inline
        m = 1 if speculated else 0
        self.n_seen[m][b] += 1
        changed = False
        self._emitted += bs
        self._last_b = b
        if self._refilled:  # until a request leaves, the batch holds requests as they arrived
            self._f += (m - self._f) * self._f_w
        d = self._decoded = self._decoded + 1
        span = d if d < self.BURST_STEPS else self.BURST_STEPS
        if self._refilled:
            cn = self._clump_n = self._clump_n + 1
            self._clump_p += ((1.0 if self._burst else 0.0) - self._clump_p) / (cn if cn < self.BURST_STEPS else self.BURST_STEPS)
        if self._burst:  # the prompts since the last decode step were one burst
            burst, self._burst = self._burst, 0
            n = self._burst_n
            self._burst_n = float(burst) if n is None else n + self.PF_WEIGHT * (burst - n)
            self._burst_p += (1.0 - self._burst_p) / span
            self._read_bursts()
        else:
            self._burst_p -= self._burst_p / span
            if d < self.LOCK_EVERY or d % self.LOCK_EVERY == 0:  # every step of a first wave
                self._read_bursts()
        if speculated and accepted:
            k = len(accepted)
            self._batch_acc = None  # the batch's estimate moves with every sample
            total = sum(accepted)
            self._emitted += total
            a = total / k
            # Weighted by the requests it averages, up to alpha: one request's accepted drafts vary
            # 0..num_steps from step to step, so at batch 1 a step says little.
            w = self._acc_weight[k] if k < self._acc_weight_n else self.alpha
            # A sample stands for the steps since the last one in this bucket: a probe from plain
            # weighs as much as the spec steps it replaced, so the estimate forgets at the same
            # pace in either mode (else a low run, sampled densely, switches speculation off and
            # sparse probes take thousands of steps to undo it).
            gap = self._in_bucket[b] - self._acc_at[b]
            self._acc_at[b] = self._in_bucket[b]
            if gap > 1 and w < self.alpha:
                w = min(self.alpha, 1.0 - (1.0 - w) ** gap)
            prev, g = self.acc_est[b], self.acc_global
            self.n_acc[b] += 1
            ns = self._acc_steps[b] + 1.0
            self._acc_steps[b] = ns if ns < self._acc_steps_max else self._acc_steps_max
            self._n_acc_global += 1
            # Until the EMA has seen about 1/w samples it is their plain mean (a bias-corrected
            # EMA): otherwise the first sample, often a single request's 0 accepted drafts, would
            # hold the estimate for dozens of probes.
            wb, wg = 1.0 / self.n_acc[b], 1.0 / self._n_acc_global
            if wb < w:
                wb = w
            if wg < w:
                wg = w
            self.acc_est[b] = a if prev is None else prev + wb * (a - prev)
            self.acc_global = a if g is None else g + wg * (a - g)
            f = self._f
            self._f_acc[b] = f if prev is None else self._f_acc[b] + wb * (f - self._f_acc[b])
            self._f_global = f if g is None else self._f_global + wg * (f - self._f_global)
            if rids is not None and len(rids) == k:
                if k <= self.PER_REQUEST_MAX:
                    self._track(rids, accepted)
                if self._n_acc_global > self._pair_at:
                    self._pair_sample(rids, accepted)
            changed = True
        if t is not None and self.use_times:
            # Steady: the steps around this one took its mode and no prefill came between: the
            # interval is what a step of this mode costs.  Otherwise what it cost beyond that is
            # the switch's (while one is under way) or the prefill's.
            if rec.clean and not self._after_pf and self._decided >= self.window and \
                    self._window == (self._window_all if speculated else 0):
                if not self._buffer_times:  # one process: its own times are the agreed ones
                    self._fold(m, b, t, 1)
                    changed = True
                else:
                    self._t_sum[m][b] += t
                    self._t_cnt[m][b] += 1
            else:
                ref = self.t_est[m][b]
                if ref is None:
                    # Nothing better yet: a switch's step (it holds the switch's cost, an upper bound)
                    # stands in until the first steady one replaces it.  One beside a prefill can be
                    # shorter than a step (two results read close together on a live server): not that.
                    if not rec.clean or self._after_pf:
                        pass
                    elif self._buffer_times:  # ranks take it as agreed, with the steady ones
                        self._t_sum[m][b] += t
                        self._t_cnt[m][b] += 1
                    else:
                        self.t_est[m][b], self._seeded[m][b] = t, True
                        changed = True
                elif not self._seeded[m][b]:
                    # What it cost beyond a step, at most EXCESS_MAX steps: more is an outlier (a
                    # warm-up, as the first speculative step of a server's life), not what it costs.
                    x = t - ref if t < (self.EXCESS_MAX + 1.0) * ref else self.EXCESS_MAX * ref
                    if not rec.clean or self._after_pf:  # beside a prefill: the prefill's overhead
                        self._overhead(m, x, 0)
                    elif self._sw_dir >= 0 and self._window not in (0, self._window_all):
                        self._sw_sum += x  # in a switch's aftermath: the switch's cost
                        self._sw_n += 1
        self._after_pf = False
        if self._sw_dir >= 0 and self._window in (0, self._window_all) and self._sw_n:
            self._end_switch()  # steady again: the switch's aftermath is over
        if changed:
            self._refresh(b)
        if self._self_sync and self._schedule.due(self._step, bs, speculated):
            assert self.sync is not None  # _self_sync is set only with a hook
            self.sync_apply(self.sync(self.sync_values()))

    def wants_requests(self, batch_size: int) -> bool:
        return batch_size <= self.PER_REQUEST_MAX or self._n_acc_global >= self._pair_at

    def _pair_sample(self, rids: Sequence[Hashable], accepted: Sequence[int]) -> None:
        """How much requests differ, from two speculative steps: across the requests in both,
        the covariance of their accepted drafts is the variance of their own means (a request's
        luck in one step says nothing of the next).  Every PAIR_EVERY speculative steps, at
        O(batch) cost then."""
        prev = self._pair
        if prev is None:
            self._pair = (rids, accepted)
            return
        self._pair, self._pair_at = None, max(self._pair_at + self.PAIR_EVERY, self._n_acc_global)
        prev_rids, prev_acc = prev
        if prev_rids == rids:  # the same requests in the same order (most pairs): sums at C speed
            n, sx, sy, sxy = len(rids), sum(prev_acc), sum(accepted), sum(map(operator.mul, prev_acc, accepted))
        else:
            before = dict(zip(prev_rids, prev_acc))
            n = sx = sy = sxy = 0
            for rid, y in zip(rids, accepted):
                x = before.get(rid)
                if x is not None:
                    n += 1
                    sx += x
                    sy += y
                    sxy += x * y
        if n < 2:
            return
        cov = (sxy - sx * sy / n) / (n - 1)
        # One step's draws are noisy (a product of two of them per request), so a pair weighs
        # PAIR_WEIGHT per request, and the first ones their mean with PAIR_PRIOR requests'
        # worth of no spread at all: a few small batches must not make up a spread that would
        # cut the value of speculating (_settled) by half.
        self._pair_df += n - 1
        w = max(1.0 - (1.0 - self.PAIR_WEIGHT) ** (n - 1), (n - 1) / (self._pair_df + self.PAIR_PRIOR))
        v = self._var_between or 0.0
        self._var_between = v + w * (cov - v)

    def note_prefill(self, requests: int, tokens: int, seconds: float | None = None) -> None:
        self._after_pf = True
        if seconds is not None and self.use_times and seconds > 0.0:
            # The forward's whole interval is beyond the decode steps: the mode in force pays it.
            self._overhead(self._window & 1, seconds, requests)
        g, w = self._per_prefill, self.PF_WEIGHT
        self._refilled = self._refilled or self._emitted > 0.0  # a prompt after decoding began
        self._burst += requests
        self._per_prefill = float(requests) if g is None else g + w * (requests - g)
        d = self.OUT_DECAY
        self._admitted = self._admitted * d + requests
        self._prompt_tokens = self._prompt_tokens * d + tokens
        if tokens > self._pf_max_tokens:
            self._pf_max_tokens = tokens
        self._emitted *= d
        # The regime's span: half a request's life in decode steps (its output over the tokens a
        # step gives it), so the share f describes the requests in the batch now.
        g = self.acc_global or 0.0
        life = self._emitted / self._admitted / (1.0 + self._f * g)
        self._f_w = 1.0 / max(self.REGIME_STEPS_MIN, 0.5 * life)
        if seconds is not None and self.use_times and 0.0 < seconds and tokens > 0:
            x = float(tokens)
            sums = self._pf_buf if self._buffer_times else self._pf
            for i, v in enumerate((1.0, x, seconds, x * x, x * seconds)):
                sums[i] += v
            if not self._buffer_times:
                self._fit_prefill()
        self._refresh(self._last_b)  # the bucket the next steps most likely run in

    def _fit_prefill(self) -> None:
        """A prefill forward's fixed cost: the intercept of seconds on tokens, or, while the
        forwards seen all hold about as many tokens, their mean duration (an upper bound)."""
        n, sx, sy, sxx, sxy = self._pf
        if n <= 0:
            return
        mx, my = sx / n, sy / n
        var = sxx / n - mx * mx
        if n >= 2 and var > (0.05 * mx) ** 2:
            slope = (sxy / n - mx * my) / var
            self._pf_fixed = min(max(my - slope * mx, 0.0), my)
        else:
            self._pf_fixed = my

    def _track(self, rids: Sequence[Hashable], accepted: Sequence[int]) -> None:
        """Add a step's accepted drafts to each request's own (the batch's estimate follows lazily)."""
        req = self._req
        for rid, x in zip(rids, accepted):
            s = req.get(rid)
            if s is None:
                req[rid] = [float(x), float(x * x), 1.0]
            else:
                s[0] += x
                s[1] += x * x
                s[2] += 1

    def _gain_sd(self, b: int, acc: float, g: float) -> float:
        """The gain's standard error from the acceptance it rests on: speculative steps sampled
        in the bucket (a profile's prior counts as SHRINK of them), each as one request's draw
        (the within-request variance of accepted drafts, 1 until measured): a batch's requests
        are not independent draws (a wave of hard prompts accepts little together)."""
        n = self._acc_steps[b]
        if n <= 0.0:
            return 0.0
        return g * self._sd_within / (math.sqrt(n) * (1.0 + acc))

    def _end_switch(self) -> None:
        """The switch under way is over: what its aftermath cost beyond its steps' own."""
        d, n = self._sw_dir, self._sw_n
        self._sw_dir = -1
        if d < 0 or not n:
            return
        b, kind = self._sw_b, 2 if d else 3
        if not self._buffer_times:
            self._fold(kind, b, self._sw_sum, 1)
            self._refresh(b)
        else:
            self._t_sum[kind][b] += self._sw_sum
            self._t_cnt[kind][b] += 1

    def _overhead(self, mode: int, seconds: float, requests: float) -> None:
        """Wall time around prefills beyond the decode steps' own, in `mode`, and the requests
        those prefills admitted (decayed sums; buffered for an agreement under TP)."""
        if self._buffer_times:
            buf = self._ov_buf
            buf[2 * mode] += seconds
            buf[2 * mode + 1] += requests
            return
        ov, d = self._ov[mode], self.OV_DECAY if requests else 1.0
        ov[0] = ov[0] * d + seconds
        ov[1] = ov[1] * d + requests
        self._cp, self._cs = self._per_request()

    def _per_request(self) -> tuple[float, float]:
        """Prefill overhead per admitted request, plain and spec (a mode not seen takes the other's),
        plain's never above spec's: a plain-mode prefill does a subset of a speculative one's work
        (the draft's K and V, not its forward), so more is a stale outlier (a warm-up's compile,
        kept while the server speculates and no plain prefill comes to replace it)."""
        (sp, np_), (ss, ns) = self._ov
        cp = max(sp, 0.0) / np_ if np_ > 0.0 else None
        cs = max(ss, 0.0) / ns if ns > 0.0 else None
        if cs is None:
            return (cp or 0.0), (cp or 0.0)
        return (cs if cp is None or cp > cs else cp), cs

    def _costs(self, b: int, acc: float, tp: float, ts: float) -> tuple[float, float]:
        """What a plain and a spec step cost the server's throughput in bucket b: the step, and
        its share of the prefill overhead (per request admitted, times the requests a step
        finishes: batch x tokens a request gets / output per request)."""
        if not self._refilled or self._emitted <= 0.0:  # output per request is known once one finished
            return tp, ts
        per = self._mid[b] * self._admitted / self._emitted
        return tp + self._cp * per, ts + self._cs * per * (1.0 + acc)

    def _fold(self, kind: int, b: int, t: float, count: float) -> None:
        """Fold a mean over `count` into the estimates (times the ranks agreed on): kinds 0 and 1 a
        steady plain / spec step, 2 and 3 what one switch to speculation / to plain cost."""
        if kind >= 2:
            costs, seen = (self._t_resume, self._sw_seen[0]) if kind == 2 else (self._t_pause, self._sw_seen[1])
            seen[b] += count
            # the first switches' plain mean (a profile's prior weighs as one), then an EMA
            w = max(1.0 - (1.0 - self.alpha) ** count, count / seen[b])
            costs[b] += w * (max(t, 0.0) - costs[b])
            return
        prev, ts = self.t_est[kind][b], self.t_est[1][b]
        if prev is not None and t > self.STALL_MAX * prev:  # one stalled step (a kernel compiled on
            t = self.STALL_MAX * prev  # first use) is no measure of a mode: it counts as a doubling
        # A borrowed time gives way to a measured one, and so does a plain time above the spec
        # one: a state no machine is in (see _times), left by an outlier such as a warm-up step.
        seen = self._t_seen[kind]
        if prev is None or self._seeded[kind][b] or (kind == 0 and ts is not None and prev > ts):
            self.t_est[kind][b], self._seeded[kind][b], seen[b] = t, False, count
        else:
            seen[b] += count
            # the first steady steps' plain mean (a profile's prior weighs as one), then an EMA
            w = max(1.0 - (1.0 - self.alpha) ** count, count / seen[b])
            self.t_est[kind][b] = prev + w * (t - prev)

    # Agreement across TP ranks --------------------------------------------------------
    def sync_schedule(self) -> SyncSchedule:
        return SyncSchedule(self.sync_every, max(self.min_samples, self.PROBE_STEPS) if self._explore else 0)

    def defer_sync(self) -> None:
        self._self_sync, self._buffer_times = False, True

    def sync_values(self) -> list[float]:
        """Step-time and switch-cost sums and counts measured since the last agreement,
        [kind][bucket], then the timed prefill forwards' sums (count, tokens, seconds, tokens^2,
        tokens x seconds), then the prefill overhead (seconds, requests) of plain and spec."""
        cnt = self._t_cnt
        return [*(v for row in self._t_sum for v in row), *(float(c) for row in cnt for c in row),
                *self._pf_buf, *self._ov_buf]

    def sync_apply(self, agreed: list[float]) -> None:
        """Fold the agreed step times into the estimates.  Counts are agreed like the sums
        (each rank drops intervals it cannot trust on its own), and the agreed sums are
        divided by the agreed counts: every rank folds the same means with the same weights."""
        n, k, kinds = len(BUCKET_EDGES), len(self._pf_buf), len(self._t_sum)
        if len(agreed) != 2 * kinds * n + k + 4:
            raise RuntimeError(f"sync hook returned {len(agreed)} values, expected {2 * kinds * n + k + 4}")
        at = 2 * kinds * n
        if agreed[at] > 0:  # timed prefill forwards: fold the rank-mean sums into the fit
            for i in range(k):
                self._pf[i] += agreed[at + i]
            self._fit_prefill()
            self._refresh(self._last_b)
        self._pf_buf = [0.0] * k
        ov = agreed[at + k:]
        self._buffer_times = False  # fold the agreed overheads as one process would
        for mode in (0, 1):
            if ov[2 * mode] or ov[2 * mode + 1]:
                self._overhead(mode, ov[2 * mode], ov[2 * mode + 1])
        self._buffer_times = True
        self._ov_buf = [0.0, 0.0, 0.0, 0.0]
        for kind in range(kinds):
            for b in range(n):
                c = agreed[(kinds + kind) * n + b]  # rank-mean count: the rank-mean sum over it is the mean time
                if c > 0:
                    self._fold(kind, b, agreed[kind * n + b] / c, c)
                    self._refresh(b)
                self._t_cnt[kind][b] = 0
                self._t_sum[kind][b] = 0.0

    def state_key(self) -> tuple:
        # The state decisions follow (estimates enter through _choice and _interval, how finishes
        # come through _lock and the lead).
        return (self._step, self._dwell.key(), self.n_seen, self.n_acc, self._in_bucket,
                self._last_seen, self._choice, self._interval, self._known, self._seeded, self._probe_left,
                self._probe_b, self._probes, self._window, self._lock, self._lead_now)

    def estimates(self) -> dict:
        """Per bucket with a measurement or a prior: steady step times (ms, plain as used),
        accepted drafts per request, what a switch each way costs (ms), the spec/plain cost ratio
        it acts on (each step with its share of the prefills' overhead: what the two modes'
        tokens per second imply) and the choice."""
        out = {}
        for b, edge in enumerate(BUCKET_EDGES):
            (tp, ts), acc = self._times(b), self._accepted(b)
            if tp is None and ts is None:
                continue
            ratio = None
            if tp is not None and ts is not None and acc is not None:
                cp, cs = self._costs(b, acc, tp, ts)
                ratio = round(cs / cp, 4)
            out[f"{edge}+"] = {"plain_ms": None if tp is None else round(1000 * tp, 3),
                               "spec_ms": None if ts is None else round(1000 * ts, 3),
                               "accepted": None if acc is None else round(acc, 3),
                               "resume_ms": round(1000 * self._t_resume[b], 3),
                               "pause_ms": round(1000 * self._t_pause[b], 3),
                               "cost_ratio": ratio, "speculate": self._choice[b]}
        return out

    def prefill_estimates(self) -> dict:
        """What it reads from prefill forwards (note_prefill): their fixed cost, requests per
        forward and per burst, the share of decode steps after a burst, output per request,
        whether finishes come in lockstep (then speculation pays for scattering them) and the lead
        that goes with how far they come together (_read_bursts)."""
        def r(x: float | None, k: int = 3) -> float | None:
            return None if x is None else round(x, k)

        cp, cs = self._per_request()
        return {"fixed_ms": r(None if self._pf_fixed is None else 1000 * self._pf_fixed),
                "overhead_ms_per_request": {"plain": round(1000 * cp, 3), "spec": round(1000 * cs, 3)},
                "requests_per_prefill": r(self._per_prefill), "requests_per_burst": r(self._burst_n),
                "steps_after_a_burst": r(self._burst_p, 4),
                "output_per_request": r(self._emitted / self._admitted if self._admitted else None, 1),
                "lockstep": self._lock, "lead": round(self._lead_now, 4)}

    def acceptance_estimates(self) -> dict:
        """How requests differ and the regime the batch formed in (_settled): the variance of
        requests' own mean accepted drafts, the requests compared in pairs of speculative steps
        (_pair_sample), and the share of recent steps that speculated."""
        v = self._var_between
        return {"between_requests_variance": None if v is None else round(v, 4),
                "requests_compared": self._pair_df, "speculating_share": round(self._f, 3)}

    def reason(self, batch_size: int) -> str:
        b = bucket_of(batch_size)
        g = self._gain(b)
        what = "probe" if self._probing else "goodput"
        if g is None:
            return f"{what}: exploring bucket {BUCKET_EDGES[b]}+"
        return f"{what}: spec/plain = {g:.2f} in bucket {BUCKET_EDGES[b]}+"

    def spec(self) -> str:
        return self._spec_text


class FailSafePolicy(Policy):
    """Wraps a policy: if it raises, speculate as configured for the rest of the run."""

    def __init__(self, inner: Policy, logger: logging.Logger | None = None):
        self.inner = inner
        self.name = inner.name
        self.requests_up_to = inner.requests_up_to
        self.failed = False
        self._log = logger or log

    def fail(self, where: str, exc: BaseException) -> None:
        """Give up on the inner policy (also called by a caller whose use of it raised)."""
        self.failed = True
        self._log.warning(
            "dynspec policy %s failed in %s (%s: %s); speculating as configured for the rest of the run",
            self.inner.name, where, type(exc).__name__, exc,
        )

    def _guarded(self, where: str, call: Callable[[Any], None], arg: Any) -> None:
        if self.failed:
            return
        try:
            call(arg)
        except Exception as exc:  # noqa: BLE001
            self.fail(where, exc)

    def set_batch(self, requests: Sequence[Hashable] | None) -> None:
        self._guarded("set_batch", self.inner.set_batch, requests)

    def decide(self, batch_size: int) -> bool:
        if self.failed:
            return True
        try:
            return bool(self.inner.decide(batch_size))
        except Exception as exc:  # noqa: BLE001 - any failure must not stop the server
            self.fail("decide", exc)
            return True

    def wants_requests(self, batch_size: int) -> bool:
        if self.failed:
            return False
        try:
            return bool(self.inner.wants_requests(batch_size))
        except Exception as exc:  # noqa: BLE001
            self.fail("wants_requests", exc)
            return False

    def observe(self, rec: StepRecord) -> None:
        self._guarded("observe", self.inner.observe, rec)

    def note_prefill(self, requests: int, tokens: int, seconds: float | None = None) -> None:
        self._guarded("note_prefill", lambda a: self.inner.note_prefill(*a), (requests, tokens, seconds))

    def reason(self, batch_size: int) -> str:
        if self.failed:
            return "fail-safe: policy raised, speculating as configured"
        try:
            return self.inner.reason(batch_size)
        except Exception:  # noqa: BLE001
            return self.inner.name

    def spec(self) -> str:
        return self.inner.spec()


# --- spec strings ---------------------------------------------------------------------

POLICY_NAMES = ("always", "never", "threshold", "table", "sglang-default-tiers", "goodput", "cycle")


def _int(spec: str, key: str, value: str, lo: int = 0) -> int:
    try:
        v = int(value)
    except ValueError:
        raise PolicySpecError(f"{spec!r}: {key}={value!r} is not an integer") from None
    if v < lo:
        raise PolicySpecError(f"{spec!r}: {key}={v} must be >= {lo}")
    return v


def _float(spec: str, key: str, value: str) -> float:
    try:
        v = float(value)
    except ValueError:
        raise PolicySpecError(f"{spec!r}: {key}={value!r} is not a number") from None
    if not math.isfinite(v):
        raise PolicySpecError(f"{spec!r}: {key}={value!r} is not a finite number")
    return v


def _options(spec: str, body: str, allowed: dict[str, str]) -> dict[str, str]:
    """Parse 'k=v,k=v' checking every key against `allowed` (key -> description)."""
    out: dict[str, str] = {}
    for part in body.split(","):
        if "=" not in part:
            raise PolicySpecError(f"{spec!r}: expected key=value, got {part!r}")
        key, value = (s.strip() for s in part.split("=", 1))
        if key not in allowed:
            raise PolicySpecError(f"{spec!r}: unknown option {key!r} (known: {', '.join(allowed)})")
        if key in out:
            raise PolicySpecError(f"{spec!r}: option {key!r} given twice")
        if not value:
            raise PolicySpecError(f"{spec!r}: option {key!r} has no value")
        out[key] = value
    return out


def _threshold(spec: str, body: str) -> Threshold:
    if not body:
        raise PolicySpecError(f"{spec!r}: threshold needs a batch size, e.g. threshold:32")
    if "=" not in body:
        n = _int(spec, "threshold", body, lo=0)
        return Threshold(n, n)
    o = _options(spec, body, {"on": "", "off": "", "dwell": ""})
    if "on" not in o and "off" not in o:
        raise PolicySpecError(f"{spec!r}: threshold needs on= and/or off=")
    on = _int(spec, "on", o.get("on", o.get("off", "0")))
    off = _int(spec, "off", o.get("off", o.get("on", "0")))
    if off < on:
        raise PolicySpecError(f"{spec!r}: off={off} is below on={on}; hysteresis needs on <= off")
    dwell = _int(spec, "dwell", o["dwell"]) if "dwell" in o else 16
    return Threshold(on, off, dwell)


def _table(spec: str, body: str) -> Table:
    if not body:
        raise PolicySpecError(f"{spec!r}: table needs ranges, e.g. table:1-63=on,64-=off")
    ranges: list[tuple[int, int | None, bool]] = []
    dwell = 0
    for part in body.split(","):
        if "=" not in part:
            raise PolicySpecError(f"{spec!r}: expected RANGE=on|off, got {part!r}")
        key, value = (s.strip() for s in part.split("=", 1))
        if key == "dwell":
            dwell = _int(spec, "dwell", value)
            continue
        if value not in ("on", "off"):
            raise PolicySpecError(f"{spec!r}: range {key!r} must be =on or =off, got {value!r}")
        lo_s, dash, hi_s = key.partition("-")
        lo = _int(spec, "range start", lo_s, lo=1)
        hi = (_int(spec, "range end", hi_s, lo=1) if hi_s else None) if dash else lo
        if hi is not None and hi < lo:
            raise PolicySpecError(f"{spec!r}: range {key!r} ends before it starts")
        ranges.append((lo, hi, value == "on"))
    if not ranges:
        raise PolicySpecError(f"{spec!r}: table has no ranges")
    ranges.sort(key=lambda r: r[0])
    expect: int | None = 1  # the next batch size to cover; None after an open-ended range
    for lo, hi, _ in ranges:
        if expect is None:
            raise PolicySpecError(f"{spec!r}: range starting at {lo} follows an open-ended range")
        if lo != expect:
            what = "overlap" if lo < expect else f"a gap at batch sizes {expect}-{lo - 1}"
            raise PolicySpecError(f"{spec!r}: ranges have {what}")
        expect = None if hi is None else hi + 1
    if expect is not None:
        raise PolicySpecError(f"{spec!r}: table does not cover batch sizes {expect}- (end with an open range like {expect}-=off)")
    return Table(ranges, dwell)


_GOODPUT_OPTS = {
    "profile": "step-cost profile (name or path)",
    "probe": "most steps between probes of the other mode",
    "budget": "share of output that probes may cost",
    "min_samples": "steps each mode is tried per bucket without a profile",
    "dwell": "minimum steps between switches",
    "margin": "relative advantage needed to switch",
    "lead": "share more output speculation must promise to be chosen",
    "lead_apart": "the lead where finishes come at random (at most lead)",
    "lead_batch": "batch size from which the lead applies in full (in proportion below)",
    "alpha": "EMA weight of step times",
    "acc_alpha": "EMA weight of one request's accepted drafts",
    "sync_every": "steps between rank agreements on step times",
    "times": "use measured step times (1/0)",
    "merge": "count the prefills a spec step merges where finishes come apart (1/0)",
    "window": "decisions a result's interval can hold (2; a live overlap scheduler: 3)",
}


def _goodput(spec: str, body: str, profile: Profile | None, sync: SyncHook | None,
             window: int | None = None) -> Goodput:
    o = _options(spec, body, _GOODPUT_OPTS) if body else {}
    if "profile" in o:
        from dynspec.sim.profile import ProfileError, load_profile

        try:
            profile = load_profile(o["profile"])
        except ProfileError as exc:
            raise PolicySpecError(f"{spec!r}: {exc}") from None
    kw: dict = {}
    for key in ("probe", "dwell", "sync_every", "min_samples", "lead_batch", "window"):
        if key in o:
            kw[key] = _int(spec, key, o[key])
    if "window" not in kw and window is not None:
        kw["window"] = window
    for key in ("margin", "lead", "lead_apart", "alpha", "acc_alpha", "budget"):
        if key in o:
            kw[key] = _float(spec, key, o[key])
    if "times" in o:
        if o["times"] not in ("0", "1"):
            raise PolicySpecError(f"{spec!r}: times must be 0 or 1, got {o['times']!r}")
        kw["use_times"] = o["times"] == "1"
    if "merge" in o:
        if o["merge"] not in ("0", "1"):
            raise PolicySpecError(f"{spec!r}: merge must be 0 or 1, got {o['merge']!r}")
        kw["merge"] = o["merge"] == "1"
    if profile is None and not kw.get("use_times", True):
        raise PolicySpecError(f"{spec!r}: goodput with times=0 needs a profile")
    return Goodput(profile, sync=sync, spec_text=spec, **kw)


def build_policy(spec: str, *, profile: Profile | None = None, sync: SyncHook | None = None,
                 initial_steps: int = 3, window: int | None = None) -> Policy:
    """Build a policy from its spec string; raise PolicySpecError naming the bad part.  `window`:
    the decisions a result's interval can hold where the caller knows it (a live server's
    overlap scheduler: 3), unless the spec names one."""
    if not isinstance(spec, str) or not spec.strip():
        raise PolicySpecError("empty policy spec (try: goodput, threshold:32, table:1-63=on,64-=off)")
    spec = spec.strip()
    name, _, body = spec.partition(":")
    name, body = name.strip(), body.strip()
    if name in ("always", "never"):
        if body:
            raise PolicySpecError(f"{spec!r}: {name} takes no options")
        return Always() if name == "always" else Never()
    if name == "threshold":
        return _threshold(spec, body)
    if name == "table":
        return _table(spec, body)
    if name == "sglang-default-tiers":
        o = _options(spec, body, {"steps": "initial speculative_num_steps"}) if body else {}
        return SglangTiers(_int(spec, "steps", o.get("steps", str(initial_steps)), lo=1))
    if name == "goodput":
        return _goodput(spec, body, profile, sync, window)
    if name == "cycle":
        o = _options(spec, body, {"spec": "speculative steps per cycle", "plain": "plain steps per cycle"}) \
            if body else {}
        return Cycle(_int(spec, "spec", o.get("spec", "1"), lo=1), _int(spec, "plain", o.get("plain", "1"), lo=1))
    raise PolicySpecError(f"{spec!r}: unknown policy {name!r} (known: {', '.join(POLICY_NAMES)})")


def check_spec(spec: str) -> str:
    """Validate a spec; return the normalized spec string or raise PolicySpecError."""
    return build_policy(spec).spec()
