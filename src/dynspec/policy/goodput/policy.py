"""Goodput: speculate when it is expected to give more output tokens per second."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from dynspec.policy.base import StepRecord
from dynspec.policy.buckets import _BUCKETS, _LAST_BUCKET, _N_BUCKETS, BUCKET_EDGES
from dynspec.policy.goodput.decision import Decision
from dynspec.policy.goodput.params import GoodputConstants, GoodputParams
from dynspec.policy.step_cost import StepCost
from dynspec.policy.sync import SyncHook


class Goodput(Decision):
    """Speculate when it is expected to give more output tokens per second.

    "Goodput" here is output tokens per second (SmartSpec's sense), not vLLM's or DistServe's
    requests meeting latency SLOs.  Per batch-size bucket it keeps an EMA of accepted draft
    tokens per request and, per mode, an estimate of the step time; expected goodput per
    request is (1 + accepted) / (1 + lead) / t_spec against 1 / t_plain, the lead in full from
    `lead_batch` requests and in proportion below, and `lead_apart` instead where finishes come
    at random (growing to `lead` where they come in lockstep; read from bursts of prompts).

    Acceptance (acceptance.py): up to PER_REQUEST_MAX requests, told their ids (set_batch,
    StepRecord.requests), a batch's own requests, each shrunk to the arrivals' (empirical
    Bayes); above that the population's as it settles while speculating.  Step times
    (times.py) start from a profile when given and are refined by measured times that the ranks
    agreed on (`sync`): steady steps only (`window`), a switch's aftermath as that switch's cost
    each way, and the prefills' overhead per request by mode (prefill.py).  Without a profile, a
    new bucket is decided from a neighbour that clearly knows, or by trying plain then
    speculative steps there (decision.py).

    Probes keep the estimates honest: now and then it takes the other mode for a few steps,
    at intervals set so that probes cost about `budget` of the output.  A switch needs a
    `margin` advantage and is held for `dwell` steps.  The knobs and their defaults:
    GoodputParams.
    """

    name = "goodput"
    requests_up_to = GoodputConstants.PER_REQUEST_MAX

    def __init__(self, profile: StepCost | None = None, *, sync: SyncHook | None = None,
                 spec_text: str = "goodput", params: GoodputParams | None = None, **knobs: Any):
        """`knobs`: GoodputParams' fields, over `params` (or the defaults)."""
        p = GoodputParams(**knobs) if params is None else replace(params, **knobs)
        self._spec_text = spec_text
        self._set_knobs(p, profile, sync)
        self._init_acceptance(profile)
        self._init_prefill()
        self._init_times(profile, p.dwell)
        self._init_decision(p.dwell)
        self._schedule = self.sync_schedule()
        for b in range(len(BUCKET_EDGES)):
            self._refresh(b)

    def observe(self, rec: StepRecord) -> None:
        bs, speculated, accepted, t, rids, clean, _, kv = rec
        b = _BUCKETS[bs] if 0 <= bs < _N_BUCKETS else _LAST_BUCKET  # bucket_of, inline
        m = 1 if speculated else 0
        self.n_seen[m][b] += 1
        changed = False
        self._emitted += bs
        self._last_b = b
        mid = self._mid
        mid[b] = bs if self.n_seen[0][b] + self.n_seen[1][b] == 1 else mid[b] + self.BATCH_W * (bs - mid[b])
        if not self.by_kv or self._buffer_times:
            kv = None  # (ranks agreeing on times keep them by batch size: times.py)
        self._kv_now, self._bs_now = kv, bs
        if self._refilled:  # until a request leaves, the batch holds requests as they arrived
            self._f += (m - self._f) * self._f_w
        d = self._decoded = self._decoded + 1
        span = d if d < self.BURST_STEPS else self.BURST_STEPS
        burst = self._read_burst(bs) if self._burst else 0
        if bs >= self._peak:
            self._peak, self._peak_age = bs, 0
        else:
            age = self._peak_age = self._peak_age + 1
            if age > self.PEAK_STEPS:
                self._peak, self._peak_age = bs, 0
        if self._refilled:
            cn = self._clump_n = self._clump_n + 1
            self._clump_p += ((1.0 if burst else 0.0) - self._clump_p) / (cn if cn < self.BURST_STEPS else self.BURST_STEPS)
        if burst:  # the prompts since the last decode step were one burst
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
            # Weighted by the requests it averages, up to 1 / ACC_STEPS: one request's accepted
            # drafts vary 0..num_steps from step to step, so at batch 1 a step says little.
            w = self._acc_weight[k] if k < self._acc_weight_n else self._acc_weight[-1]
            # A sample stands for the steps since the last one in this bucket: a probe from plain
            # weighs as much as the spec steps it replaced, so the estimate forgets at the same
            # pace in either mode (else a low run, sampled densely, switches speculation off and
            # sparse probes take thousands of steps to undo it).
            gap = self._in_bucket[b] - self._acc_at[b]
            self._acc_at[b] = self._in_bucket[b]
            if gap > 1 and w < self.alpha:
                w = min(self.alpha, 1.0 - (1.0 - w) ** gap)
            prev, g = self.acc_est[b], self.acc_global
            if gap > 1 and prev is not None and self._shifted(a - prev, k, b):
                # The requests accept differently now (new prompts): the samples behind the
                # estimate describe requests that are gone.  Start again from this one, bucket
                # and global, as uncertain as a first sample, so the next probes come soon.
                prev = g = None
                self.n_acc[b], self._acc_steps[b] = 0, 0.0
                self._restarts[b] += 1
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
                    self._pair_sample(rids, accepted, b)
            changed = True
        if t is not None and self.use_times:
            # Steady: the steps around this one took its mode and no prefill came between: the
            # interval is what a step of this mode costs.  Otherwise what it cost beyond that is
            # the switch's (while one is under way) or the prefill's.
            if clean and not self._after_pf and self._decided >= self.window and \
                    self._window == (self._window_all if speculated else 0):
                if not self._buffer_times:  # one process: its own times are the agreed ones
                    est, ts = self.t_est[m], self.t_est[1][b]
                    prev = est[b]
                    if prev is not None and not self._seeded[m][b]:
                        # At most DEV_K typical distances over the estimate (for a step beyond them,
                        # where the KV plane puts it at this step's tokens): a stalled step (47 ms
                        # where speculative steps at batch 24 took 14.4 on one H100) says how often a
                        # mode stalls, not what its steps take, and through the mean it held the
                        # estimate 13% up while the mode did not run.  A step under the estimate counts
                        # whole: it is no stall, and may be the estimate's own error.  The distance is
                        # an EMA of what steps count for, so it grows where they spread (a tenth a step
                        # while they land beyond it: a mode whose steps changed for good is followed).
                        devs = self._t_dev[m]
                        dev = devs[b]
                        if dev is None:
                            dev = self.DEV_INIT * prev
                        elif dev < self.DEV_MIN * prev:  # (steps that never vary would let no change through)
                            dev = self.DEV_MIN * prev
                        x, lim = t - prev, self.DEV_K * dev
                        if x > lim:
                            at = self._kv_shift(m, b, prev)
                            x = t - at
                            if x > lim:
                                x, t = lim, at + lim
                        devs[b] = dev + self.DEV_W * ((x if x >= 0.0 else -x if -x < lim else lim) - dev)
                    if prev is not None and not self._seeded[m][b] and t <= self.STALL_MAX * prev \
                            and (m or ts is None or prev <= ts):
                        seen = self._t_seen[m]  # _fold's EMA for one steady step, inline
                        n = seen[b] = seen[b] + 1
                        w, r = self._w_one, 1.0 / n
                        if r > w:
                            w = r
                        if kv is not None:
                            ref = self._kv_ref[m][b]
                            if ref is not None and d & 3:  # the point moves; the plane is fed every 4th step
                                self._kv_ref[m][b] = ref + w * (kv - ref)
                                z = self._bs_ref[m]
                                z[b] += w * (bs - z[b])
                            else:
                                self._kv_step(m, b, t, kv, prev, w)
                        est[b] = prev + w * (t - prev)
                    else:
                        self._fold(m, b, t, 1, kv)
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
                    if not clean or self._after_pf:
                        self._rec_blind = True  # (the prefill's cost beside it is not known)
                    elif self._buffer_times:  # ranks take it as agreed, with the steady ones
                        self._t_sum[m][b] += t
                        self._t_cnt[m][b] += 1
                    else:
                        self.t_est[m][b], self._seeded[m][b] = t, True
                        changed = True
                elif self._seeded[m][b]:
                    if not clean or self._after_pf:
                        self._rec_blind = True
                else:
                    # What it cost beyond a step, at most EXCESS_MAX steps: more is an outlier (a
                    # warm-up, as the first speculative step of a server's life), not what it costs.
                    x = t - ref if t < (self.EXCESS_MAX + 1.0) * ref else self.EXCESS_MAX * ref
                    if not clean or self._after_pf:  # beside a prefill: the prefill's overhead
                        self._rec_s += x
                    elif self._sw_dir >= 0 and self._window not in (0, self._window_all):
                        self._sw_sum += x  # in a switch's aftermath: the switch's cost
                        self._sw_n += 1
        elif not clean or self._after_pf:
            self._rec_blind = True
        if self._after_pf:
            self._after_pf = False
            self._close_forward(burst)
            changed = True
        if self._sw_dir >= 0 and self._window in (0, self._window_all) and self._sw_n:
            self._end_switch()  # steady again: the switch's aftermath is over
        if changed:
            self._refresh(b)
        if self._self_sync and self._schedule.due(self._step, bs, speculated):
            assert self.sync is not None  # _self_sync is set only with a hook
            self.sync_apply(self.sync(self.sync_values()))

    def _shifted(self, diff: float, k: int, b: int) -> bool:
        """A sample of k requests' mean accepted drafts `diff` from the estimate, after steps
        without samples (a probe): beyond SHIFT_Z standard errors of a k-request mean (the
        spread within and between requests), more than the estimate's drift explains."""
        within = self._var_within if self._var_within is not None else self._sd_within ** 2
        v = self._var_between
        between = v * self._acc_scale[b] ** 2 if v is not None and v > 0.0 else 0.0
        return diff * diff * k > self.SHIFT_Z * self.SHIFT_Z * (within + between)

    def state_key(self) -> tuple:
        # The state decisions follow (estimates enter through _choice and _interval, how finishes
        # come through _lock and the lead).
        return (self._step, self._dwell.key(), self.n_seen, self.n_acc, self._in_bucket,
                self._last_seen, self._choice, self._interval, self._known, self._seeded, self._probe_left,
                self._probe_b, self._probes, self._window, self._lock, self._lead_now)

    def spec(self) -> str:
        return self._spec_text
