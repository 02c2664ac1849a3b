"""Goodput's step times: per mode and bucket, from a profile and from measured steps the ranks
agreed on; what a switch costs each way; and the agreements themselves."""

from __future__ import annotations

from dynspec.policy.buckets import BUCKET_EDGES, bucket_mid
from dynspec.policy.goodput.prefill import PrefillAccount
from dynspec.policy.step_cost import StepCost
from dynspec.policy.sync import SyncSchedule


class StepTimes(PrefillAccount):
    def _init_times(self, profile: StepCost | None, dwell: int) -> None:
        n = len(BUCKET_EDGES)
        # [mode][bucket], mode 0 = plain, 1 = spec
        self.t_est: list[list[float | None]] = [[None] * n, [None] * n]
        self.n_seen: list[list[int]] = [[0] * n, [0] * n]
        # A switch to speculating pays one resume (Profile.resume_time); without a profile, measured
        # speculative step times include it.
        self._t_resume = [0.0] * n
        if profile is not None:
            for b in range(n):
                bs = bucket_mid(b)
                self.t_est[0][b] = profile.plain_time(bs) + profile.catch_up_time(bs)  # as the patched server's
                self._t_resume[b] = profile.resume_time(bs)
                # A switch holds for at least `dwell` steps: the resume is at most that share of each.
                self.t_est[1][b] = profile.spec_time(bs) + self._t_resume[b] / max(dwell, 1)
        self._seeded = [[False] * n, [False] * n]  # t_est borrowed from neighbours, not measured
        self._w_one = 1.0 - (1.0 - self.alpha) ** 1  # _fold's EMA weight for one step
        # A steady step's typical distance over the estimate, per mode and bucket (policy.observe).
        self._t_dev: list[list[float | None]] = [[None] * n for _ in range(2)]
        self._mids = [bucket_mid(b) for b in range(n)]
        self._t_seen = [[1.0 if profile is not None else 0.0] * n for _ in range(2)]  # steady steps folded in
        # Times measured since the last sync: [kind][bucket] sum and count; kind 0 plain, 1 spec
        # (steady steps), 2 and 3 what switches to speculation and to plain cost (one per switch).
        self._t_sum = [[0.0] * n, [0.0] * n, [0.0] * n, [0.0] * n]
        self._t_cnt = [[0] * n, [0] * n, [0] * n, [0] * n]
        # The switch under way: its direction (1 to speculation), bucket and the time its aftermath
        # cost beyond each step's own (folded into _t_resume / _t_pause when the next one comes).
        self._sw_dir, self._sw_b, self._sw_sum, self._sw_n = -1, 0, 0.0, 0
        self._t_pause = [0.0] * n  # what a switch to plain costs the server (its aftermath's excess)
        self._sw_seen = [[1.0 if profile is not None else 0.0] * n, [0.0] * n]  # switches folded in
        self._self_sync = self.sync is not None  # False once a caller runs the agreements (defer_sync)
        self._buffer_times = self.sync is not None  # times wait for an agreement instead of counting at once
        # Step times by the batch's size and the tokens in its KV cache, where steps report them:
        # attention reads every KV token, so at one batch size a step late in its requests' lives
        # costs more than early (on a speculative step, whose verify and drafts attend them several
        # times, much more); and a bucket spans batch sizes (16+ is 16..23) whose steps differ by
        # as much.  A bucket's time is the EMA of its steps' and _kv_ref / _bs_ref the EMAs, with
        # the same weights, of their KV tokens and batch sizes: the point the estimate stands at.
        # A plane through it (per request, per KV token) moves it to the batch now (_kv_shift),
        # each bucket's own: what a KV token costs falls as the batch grows (a small batch leaves
        # attention's kernels short of work).  One process only: ranks agreeing on times keep them
        # by bucket alone.
        self._kv_ref: list[list[float | None]] = [[None] * n, [None] * n]
        self._bs_ref: list[list[float]] = [[0.0] * n, [0.0] * n]
        self._kv_now: float | None = None  # the last step's KV tokens (None: not reported)
        self._bs_now = 0  # and its batch size
        # [mode][bucket] seconds per KV token and per request (_kv_step)
        self._kv_slope = [[0.0] * n, [0.0] * n]
        self._bs_slope = [[0.0] * n, [0.0] * n]
        # The regressions' sums of dz dz, dz dx, dx dx, dz dy, dx dy (z batch size, x KV tokens, y
        # time, each about the bucket's point) and steps fed: per mode pooled over buckets (each
        # bucket's prior), and per mode and bucket.
        self._kv_sums = [[0.0] * 6 for _ in range(2)]
        self._kv_bsums = [[[0.0] * 6 for _ in range(n)] for _ in range(2)]

    def _times(self, b: int) -> tuple[float | None, float | None]:
        """Plain and spec step times in bucket b (the stepping bucket's at its batch's KV tokens).
        A plain step does a subset of a speculative step's work (one target token per request
        instead of k+1, a KV-only catch-up instead of a draft), so a plain estimate above the spec
        one is an outlier (a warm-up step, a stall) and counts as the spec time: one slow plain
        step must not keep a losing draft running."""
        tp, ts = self.t_est[0][b], self.t_est[1][b]
        if b == self._last_b and self._kv_now is not None:
            tp = None if tp is None else self._kv_shift(0, b, tp)
            ts = None if ts is None else self._kv_shift(1, b, ts)
        return (min(tp, ts) if tp is not None and ts is not None else tp), ts

    def _kv_shift(self, m: int, b: int, t: float) -> float:
        """Mode m's time t in bucket b moved from the KV tokens it was measured at to the last
        step's, by at most KV_SHIFT_MAX of it (a slope is a line through what was seen)."""
        ref, kv = self._kv_ref[m][b], self._kv_now
        if ref is None or kv is None or self._seeded[m][b]:
            return t
        d = self._kv_slope[m][b] * (kv - ref) + self._bs_slope[m][b] * (self._bs_now - self._bs_ref[m][b])
        lim = self.KV_SHIFT_MAX * t
        return t + (lim if d > lim else -lim if d < -lim else d)

    def _kv_step(self, m: int, b: int, t: float, kv: float, prev: float, w: float) -> None:
        """A steady step of mode m in bucket b took t at kv KV tokens (and the last batch size),
        its estimate prev about to move by weight w: feed the plane's regressions (the step about
        the bucket's point, so each bucket's own level drops out), the bucket's own and the one
        pooled over buckets, and move the point with the estimate.  The bucket's plane is its own
        regression shrunk to the pooled one (ridge): the pooled weighs as KV_MIN steps at the
        pooled spreads, so a bucket whose batches or KV tokens barely moved keeps the pooled
        slope of that one."""
        refs = self._kv_ref[m]
        ref = refs[b]
        bs = self._bs_now
        s, sb = self._kv_sums[m], self._kv_bsums[m][b]
        if ref is None:  # (as _fold's first step)
            refs[b], self._bs_ref[m][b] = kv, bs
            self._kv_plane(m, b, s, sb)
            return
        bref = self._bs_ref[m][b]
        dx, dz, dy, span = kv - ref, bs - bref, t - prev, self.KV_SPAN
        refs[b], self._bs_ref[m][b] = ref + w * dx, bref + w * dz
        zz, zx, xx, zy, xy = dz * dz, dz * dx, dx * dx, dz * dy, dx * dy
        # Sums, halved once they hold 2 KV_SPAN steps: a memory of KV_SPAN..2 KV_SPAN of them
        for v in (s, sb):
            v[0] += zz
            v[1] += zx
            v[2] += xx
            v[3] += zy
            v[4] += xy
            v[5] += 1
            if v[5] >= 2 * span:
                v[:] = [0.5 * x for x in v]
        self._kv_plane(m, b, s, sb)

    def _kv_plane(self, m: int, b: int, s: list[float], sb: list[float]) -> None:
        """Bucket b's plane for mode m: its own sums sb shrunk to the pooled s (_kv_step)."""
        if s[5] < self.KV_MIN or s[2] <= 0.0:
            return
        r = self.KV_MIN / s[5]  # the pooled as KV_MIN steps
        ridge = self.KV_MIN * self.KV_RIDGE * self.KV_RIDGE
        c, h = _plane(sb[0] + r * s[0], sb[1] + r * s[1], sb[2] + r * s[2] + ridge, sb[3] + r * s[3],
                      sb[4] + r * s[4])
        self._bs_slope[m][b], self._kv_slope[m][b] = c, h

    def _fill(self, b: int) -> None:
        """A mode's time in bucket b that no step measured, or only borrowed from a neighbour, from the
        nearest buckets on either side that measured it: a step's time grows with the batch, so
        it lies between theirs (linear in the batch).  A bucket the batch only passes through
        (one request gone, the next one's prefill about to refill it) has no clean step of its
        own to time, and would otherwise keep whatever mode it started in."""
        mids, n = self._mids, len(BUCKET_EDGES)
        for m in (0, 1):
            if self.t_est[m][b] is not None and not self._seeded[m][b]:
                continue
            t, seeded = self.t_est[m], self._seeded[m]
            lo = next((i for i in range(b - 1, -1, -1) if t[i] is not None and not seeded[i]), -1)
            hi = next((i for i in range(b + 1, n) if t[i] is not None and not seeded[i]), -1)
            if lo < 0 or hi < 0:
                continue
            tl, th = t[lo], t[hi]
            assert tl is not None and th is not None
            t[b] = tl + (th - tl) * (mids[b] - mids[lo]) / (mids[hi] - mids[lo])
            seeded[b] = True

    def _ceiling(self, b: int) -> float | None:
        """The most a steady plain step in bucket b can cost: no more than a plain step at a
        larger batch (the nearest bucket above that measured one), nor than a speculative step of
        its bucket (a subset of its work).  A first sample above that is a stall (a kernel
        compiled for a new shape, a cold server's first drain), not the step's cost; taken whole
        it would price the bucket, and through borrowing every bucket below it, for as long as
        plain steps are not run there again.  (Speculative steps of different buckets may run
        different draft lengths: no such bound between them.)"""
        t, seeded = self.t_est[0], self._seeded[0]
        cap = next((t[i] for i in range(b + 1, len(t)) if t[i] is not None and not seeded[i]), None)
        ts = self.t_est[1][b]
        if ts is not None and not self._seeded[1][b] and (cap is None or ts < cap):
            cap = ts
        return cap

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

    def _fold(self, kind: int, b: int, t: float, count: float, kv: float | None = None) -> None:
        """Fold a mean over `count` into the estimates (times the ranks agreed on): kinds 0 and 1 a
        steady plain / spec step (at `kv` KV tokens when known), 2 and 3 what one switch to
        speculation / to plain cost."""
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
        cap = self._ceiling(b) if kind == 0 and self.profile is None else None  # (a profile's priors bound it)
        if cap is not None and t > cap:
            t = cap
        # A borrowed time gives way to a measured one, and so does a plain time above the spec
        # one: a state no machine is in (see _times), left by an outlier such as a warm-up step.
        seen = self._t_seen[kind]
        if prev is None or self._seeded[kind][b] or (kind == 0 and ts is not None and prev > ts):
            self.t_est[kind][b], self._seeded[kind][b], seen[b] = t, False, count
            self._kv_ref[kind][b], self._bs_ref[kind][b] = kv, self._bs_now
            if kv is not None:  # until the bucket's own steps spread about this point, the pooled plane
                self._kv_plane(kind, b, self._kv_sums[kind], self._kv_bsums[kind][b])
        else:
            seen[b] += count
            # the first steady steps' plain mean (a profile's prior weighs as one), then an EMA
            # (one step, as every step of one process: the EMA weight computed once, no max())
            w = self._w_one if count == 1 else 1.0 - (1.0 - self.alpha) ** count
            r = count / seen[b]
            w = r if r > w else w
            if kv is not None:
                self._kv_step(kind, b, t, kv, prev, w)
            else:
                self._kv_ref[kind][b] = None  # a time of unknown KV tokens: the point is lost
            self.t_est[kind][b] = prev + w * (t - prev)

    # Agreement across TP ranks --------------------------------------------------------
    def sync_schedule(self) -> SyncSchedule:
        return SyncSchedule(self.sync_every, max(self.min_samples, self.PROBE_STEPS) if self._explore else 0)

    def defer_sync(self) -> None:
        self._self_sync, self._buffer_times = False, True

    def sync_values(self) -> list[float]:
        """Step-time and switch-cost sums and counts measured since the last agreement,
        [kind][bucket], then the timed prefill forwards' sums (count, tokens, seconds, tokens^2,
        tokens x seconds), then the prefill overhead (seconds, requests)."""
        cnt = self._t_cnt
        return [*(v for row in self._t_sum for v in row), *(float(c) for row in cnt for c in row),
                *self._pf_buf, *self._ov_buf]

    def sync_apply(self, agreed: list[float]) -> None:
        """Fold the agreed step times into the estimates.  Counts are agreed like the sums
        (each rank drops intervals it cannot trust on its own), and the agreed sums are
        divided by the agreed counts: every rank folds the same means with the same weights."""
        n, k, kinds = len(BUCKET_EDGES), len(self._pf_buf), len(self._t_sum)
        if len(agreed) != 2 * kinds * n + k + 2:
            raise RuntimeError(f"sync hook returned {len(agreed)} values, expected {2 * kinds * n + k + 2}")
        at = 2 * kinds * n
        if agreed[at] > 0:  # timed prefill forwards: fold the rank-mean sums into the fit
            for i in range(k):
                self._pf[i] += agreed[at + i]
            self._fit_prefill()
            self._refresh(self._last_b)
        self._pf_buf = [0.0] * k
        ov = agreed[at + k:]
        self._buffer_times = False  # fold the agreed overheads as one process would
        if ov[1]:
            self._overhead(ov[0], ov[1])
        self._buffer_times = True
        self._ov_buf = [0.0, 0.0]
        for kind in range(kinds):
            for b in range(n):
                c = agreed[(kinds + kind) * n + b]  # rank-mean count: the rank-mean sum over it is the mean time
                if c > 0:
                    self._fold(kind, b, agreed[kind * n + b] / c, c)
                    self._refresh(b)
                self._t_cnt[kind][b] = 0
                self._t_sum[kind][b] = 0.0

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
            ratio = prefill = None
            if tp is not None and ts is not None and acc is not None:
                cp, cs = self._costs(b, acc, tp, ts)
                ratio, prefill = round(cs / cp, 4), round(1000 * (cp - tp), 4)
            kv = [self._kv_ref[m][b] for m in (0, 1)]
            out[f"{edge}+"] = {"plain_ms": None if tp is None else round(1000 * tp, 3),
                               "spec_ms": None if ts is None else round(1000 * ts, 3),
                               "accepted": None if acc is None else round(acc, 3),
                               "resume_ms": round(1000 * self._t_resume[b], 3),
                               "pause_ms": round(1000 * self._t_pause[b], 3),
                               "cost_ratio": ratio, "speculate": self._choice[b],
                               # a plain step's share of the prefills' overhead (a spec step's: x (1 + accepted))
                               "prefill_ms": prefill,
                               # [plain, spec]: the point each time stands at, and its plane there
                               "kv_tokens": [None if x is None else round(x) for x in kv],
                               "batch": [None if x is None else round(self._bs_ref[m][b], 1)
                                         for m, x in enumerate(kv)],
                               "us_per_kv_token": [round(1e6 * self._kv_slope[m][b], 5) for m in (0, 1)],
                               "ms_per_request": [round(1e3 * self._bs_slope[m][b], 4) for m in (0, 1)]}
        return out


def _plane(zz: float, zx: float, xx: float, zy: float, xy: float) -> tuple[float, float]:
    """Least squares of y on z and x from their second moments: (per z, per x), neither below
    zero (a step never gets cheaper with more requests or tokens).  Where z and x move together
    (one batch size: z fixed; a drain: both fall) they cannot be told apart: x alone."""
    det = zz * xx - zx * zx
    if det > 1e-6 * zz * xx:
        c, h = (xx * zy - zx * xy) / det, (zz * xy - zx * zy) / det
        if c >= 0.0 and h >= 0.0:
            return c, h
        if h < 0.0:  # the other alone
            return (zy / zz if zy > 0.0 else 0.0), 0.0
    h = xy / xx if xx > 0.0 else 0.0
    return 0.0, (h if h > 0.0 else 0.0)
