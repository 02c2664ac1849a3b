"""Goodput's decision: speculate where the expected output per second is higher, probe the
other mode now and then to keep the estimates honest, and decide a new bucket from its
neighbours where they clearly know."""

from __future__ import annotations

import math

from dynspec.policy.buckets import _BUCKETS, _LAST_BUCKET, _N_BUCKETS, BUCKET_EDGES, bucket_mid, bucket_of
from dynspec.policy.goodput.times import StepTimes
from dynspec.policy.static import _Dwell

_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_INV_SQRT_2 = 1.0 / math.sqrt(2.0)
_sqrt = math.sqrt
# What sets a probe interval (Decision._why): the budget over one probe's cost, the chance the
# other mode wins (regret), the arrivals' mix in a batch formed mostly plain, a lockstep whose
# splitting alone spends the budget, or the interval's cap (`probe`) where none of them binds.
PROBE_WHY = ("budget", "regret", "mix", "lockstep", "cap")
_BUDGET, _REGRET, _MIX, _LOCKSTEP, _CAP = range(len(PROBE_WHY))


class Decision(StepTimes):
    def _init_decision(self, dwell: int) -> None:
        n = len(BUCKET_EDGES)
        # Speculative output is valued at 1/(1 + lead) of its face: speculation has costs a decode
        # step's time does not show (completions scatter, so batches drain unevenly), so it must
        # promise `lead` more output than plain decoding to be chosen.  Those costs grow with the
        # batch (the lead applies in full from `lead_batch` requests) and with how far finishes
        # still come together: where they come at random there is little left to scatter, and
        # the lead falls to `lead_apart` (_read_bursts; the prefills that scattering splits are
        # charged on their own, _scatter).
        self._lead_share = [min(1.0, bucket_mid(b) / self.lead_batch) for b in range(n)]
        self._discount = [1.0 / (1.0 + self.lead * w) for w in self._lead_share]  # the lead in full
        self._known = [not self._explore] * n  # a bucket explored, or decided from a neighbour
        self._in_bucket = [0] * n  # decisions taken in each bucket
        self._last_seen = [[0] * n, [0] * n]  # _in_bucket when a mode last ran there
        self._choice = [False] * n  # a near tie stays plain (see lead)
        self._interval = [[self.probe] * n, [self.probe] * n]  # probe interval while in [mode][bucket]
        self._dwell = _Dwell(dwell, True)
        self._step = 0
        self._probing = False
        # A probe under way: steps left, its bucket and mode; probes taken [from mode][bucket]
        self._probe_left, self._probe_b, self._probe_mode = 0, -1, False
        self._probes = [[0] * n, [0] * n]
        # What set each probe interval at its last refresh [mode][bucket] (a PROBE_WHY index), and
        # the probes taken by it [bucket][index]: for reading why probes come as often as they do.
        self._why = [[0] * n, [0] * n]
        self._probes_by = [[0] * len(PROBE_WHY) for _ in range(n)]
        # The last `window` decisions as bits (1: speculate), and how many were taken.
        self._window, self._decided = 0, 0
        self._window_all = (1 << self.window) - 1
        self._probe_lo = self.PROBE_MIN * self.PROBE_STEPS  # a probe's steps at most one in PROBE_MIN

    def _gain(self, b: int, scatter: bool = True) -> float | None:
        """Expected spec/plain goodput ratio in bucket b (speculation's output discounted by the
        lead, and by the prefills it scatters unless scatter=False: what the machine alone
        says, for exploring and borrowing), None while unknown."""
        (tp, ts), acc = self._times(b), self._accepted(b)
        if tp is None or ts is None or acc is None:
            return None
        cp, cs = self._costs(b, acc, tp, ts)
        return self._valued(b, acc, tp, ts, cs, scatter) * cp / cs

    def _valued(self, b: int, acc: float, tp: float, ts: float, cs: float, scatter: bool = True) -> float:
        """Output per request of a spec step as valued: 1 + acc discounted by the lead as finishes
        come now and by the prefills that scattering them costs or merging them saves (_prefills); with scatter=False,
        by the full lead alone.  Both are shares of the step's own time ts (what it costs beyond
        what its time shows, in the decode steps); the output is set against cs, the step with
        its share of the prefills' overhead (_costs), so they count ts / cs of it: where
        prefills are most of the work, what the decode steps do is a small part of the cost."""
        if not scatter:
            return (1.0 + acc) * self._discount[b]
        return (1.0 + acc) / (1.0 + (self._lead_now * self._lead_share[b] + self._prefills(b, acc, tp, ts)) * ts / cs)

    def _refresh(self, b: int) -> None:
        # Runs after every step observed: written for speed (dynspec policy bench), builtins
        # min/max/int and method calls kept off the common path.
        tp, ts = self.t_est[0][b], self.t_est[1][b]
        if tp is None or ts is None or self._seeded[0][b] or self._seeded[1][b]:
            self._fill(b)
            tp, ts = self.t_est[0][b], self.t_est[1][b]
            if tp is None or ts is None:
                return
        kv = self._kv_now
        if kv is not None and b == self._last_b:  # _times: at the batch's KV tokens (_kv_shift inline)
            h, c, bs, at = self._kv_slope, self._bs_slope, self._bs_now, self._bs_ref
            rp, rs = self._kv_ref[0][b], self._kv_ref[1][b]
            if rp is not None and not self._seeded[0][b]:
                d, lim = h[0][b] * (kv - rp) + c[0][b] * (bs - at[0][b]), self.KV_SHIFT_MAX * tp
                tp += lim if d > lim else -lim if d < -lim else d
            if rs is not None and not self._seeded[1][b]:
                d, lim = h[1][b] * (kv - rs) + c[1][b] * (bs - at[1][b]), self.KV_SHIFT_MAX * ts
                ts += lim if d > lim else -lim if d < -lim else d
        if tp > ts:  # _times
            tp = ts
        # _accepted, inline where the batch's own requests are not read (above PER_REQUEST_MAX)
        if self._batch is None or b != self._batch_bucket:
            a, acc = self.acc_est[b], self.acc_global if self.acc_prior is None else self.acc_prior[b]
            if a is not None and acc is not None:  # _population's common path
                na, sh = self.n_acc[b], self.SHRINK
                acc = (na * a + sh * acc) / (na + sh)
                v = self._var_between
                if v is not None and v > 0.0:
                    acc = self._settled(acc, (na * self._f_acc[b] + sh * self._f_global) / (na + sh), 1.0,
                                        self._acc_scale[b])
            elif a is not None:
                acc = self._settled(a, self._f_acc[b], 1.0, self._acc_scale[b])
        else:
            acc = self._accepted(b)
        if acc is None:
            return
        rtp, rts = tp, ts  # the steps alone
        if self._refilled and self._emitted > 0.0:  # _costs inline: each with its share of the prefills' overhead
            share = self._mid[b] * self._admitted / self._emitted
            pf = self._c_req * share
            tp, ts = tp + pf, ts + pf * (1.0 + acc)
        # tokens per request as valued (_valued inline)
        cost = self._lead_now * self._lead_share[b]
        if self._pf_fixed is not None:
            cost += self._prefills(b, acc, rtp, rts)
        decode = rts / ts  # the step's share of its cost (the rest: its share of the prefills)
        out = (1.0 + acc) / (1.0 + cost * decode)  # output per request of a spec step, as valued
        g = out * tp / ts
        # Hysteresis: leave the current choice only for a margin's worth of gain.  The margin
        # guards the decode steps' estimates (their times and acceptance), so it counts their
        # share of the cost too: where prefills are most of the work, those estimates move g
        # little and a real gain of 1.6% (member 6151:25 at C=128) stayed within a full margin.
        choice, m = self._choice[b], self.margin * decode
        choice = self._choice[b] = g > (1.0 - m) if choice else g > (1.0 + m)
        # Output lost by one probe, in steps of the mode probed from: from plain, a spec
        # step and its resume r cost (ts + r)/tp plain steps and return `out` tokens, and never
        # less than the resume; from spec, a plain step returns 1 token where spec would give g,
        # out of `out` per spec step, and the way back pays r.  The switch's own cost keeps
        # probes from coming every few steps where the two modes are tied.
        # A probe is PROBE_STEPS steps of the other mode and a switch there and back (r + pz).
        r, k = self._t_resume[b] + self._t_pause[b], self.PROBE_STEPS
        rp = r / tp
        from_plain = k * (ts / tp - out) + rp
        if from_plain < rp:
            from_plain = rp
        wx = _BUDGET
        if not choice and self._var_between and self._batch_bucket != b:
            # Between requests that differ, a probe in a batch formed mostly plain sees the
            # arrivals' mix and may gain where steady speculation would lose: then probing as
            # often as allowed speculates on a share of steps (at most 1 / PROBE_MIN) whose
            # batch keeps the arrivals' mix, which beats either mode alone.
            now = self._population(b, self._f)
            if now is not None:
                now = self._valued(b, now, rtp, rts, ts)
                if now * tp > ts + r:
                    from_plain, wx = 0.0, _MIX
        from_spec = k * (g - 1.0) / out + r / ts if g > 1.0 else r / ts
        # A probe from plain steps in lockstep (_scatter) splits each group of requests that
        # finish together into as many as its step's outcomes, for good: a forward's fixed cost
        # more per extra group, on this wave and on every one after it.  The first is the
        # probe's own cost.  Once a refill has shown the lockstep (a first wave's is presumed),
        # the later ones are a share of every step's output lost from then on (split over a
        # request's life in plain steps, its output), paid out of the budget before any probe's
        # own cost: where it alone exceeds the budget, probes from plain come as rarely as allowed.
        # A probe takes at most one step in PROBE_MIN: its PROBE_STEPS steps come at least that far apart.
        lo, hi, budget, lock = self._probe_lo, self.probe, self.budget, self._lock
        spare = budget
        if lock:
            per, fixed = self._per_prefill, self._pf_fixed
            if fixed is not None and per is not None:
                split = (min(per, 1.0 + out) - 1.0) * min(fixed, tp) / tp  # plain steps a wave
                from_plain += split
                if self._refilled:
                    life = self._emitted / self._admitted  # > 0: a refill admitted requests
                    spare -= split / life if life > 1.0 else split
        x = from_plain / spare if spare > 0.0 else hi + 1.0
        y, wy = from_spec / budget, _BUDGET
        if spare <= 0.0:
            wx = _LOCKSTEP
        # The estimate is uncertain (acceptance from few request-steps): waiting I steps forgoes
        # I x E[(other mode's gain)+] in expectation; a probe should come before that exceeds
        # what the probe costs, so an unlucky first sample is checked again soon while many
        # samples let a clear loser rest.
        n = self._acc_steps[b]
        if n > 0.0 and not lock:  # (in a lockstep a probe's damage lasts: _lock's rationing above)
            sd, d = g * self._step_sd(b) / (_sqrt(n) * (1.0 + acc)), g - 1.0 if g > 1.0 else 1.0 - g  # _gain_sd
            if d < self.REGRET_Z * sd:
                z = d / sd
                regret = sd * math.exp(-0.5 * z * z) * _INV_SQRT_2PI - d * 0.5 * math.erfc(z * _INV_SQRT_2)
                # E[(G - 1)+] plain, E[(1 - G)+] speculating
                if regret > 0.0:
                    if not choice and x * regret > from_plain:
                        x, wx = from_plain / regret, _REGRET
                    if choice and y * regret > from_spec:
                        y, wy = from_spec / regret, _REGRET
        iv, why = self._interval, self._why
        iv[0][b] = hi if x > hi else int(x) if x >= lo else lo  # (a NaN gives lo)
        iv[1][b] = hi if y > hi else int(y) if y >= lo else lo
        why[0][b] = _CAP if x > hi else wx  # (below the floor too: the term that brought it there)
        why[1][b] = _CAP if y > hi else wy

    def decide(self, batch_size: int) -> bool:
        b = _BUCKETS[batch_size] if 0 <= batch_size < _N_BUCKETS else _LAST_BUCKET  # bucket_of, inline
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
        dw, want = self._dwell, self._choice[b]  # _Dwell.want, inline (every step)
        dw.step += 1
        if want != dw.mode and dw.step - dw.switched_at >= dw.dwell:
            dw.mode, dw.switched_at = want, dw.step
        mode = dw.mode
        # Probe clocks count steps spent in this bucket, so a bucket visited rarely is not
        # probed on every visit.
        self._in_bucket[b] += 1
        if self._in_bucket[b] - self._last_seen[not mode][b] >= self._interval[mode][b]:
            # A probe runs PROBE_STEPS steps: only steps inside a run of one mode show what that
            # mode costs (`window`), and the switch there and back is measured.
            self._probe_left, self._probe_b, self._probe_mode = self.PROBE_STEPS - 1, b, not mode
            self._probes[mode][b] += 1
            self._probes_by[b][self._why[mode][b]] += 1
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

    def estimates(self) -> dict:
        """StepTimes.estimates, and per bucket why probes come as often as they do: each mode's
        probe interval (steps, [from plain, from spec]) and the term that set it at its last
        refresh, the probes taken from each mode, the probes by the term that set their
        interval, and the acceptance estimate's restarts (a probe showed the requests changed)."""
        out = super().estimates()
        for b, edge in enumerate(BUCKET_EDGES):
            row = out.get(f"{edge}+")
            if row is not None:
                row["probe_every"] = [self._interval[0][b], self._interval[1][b]]
                row["probe_why"] = [PROBE_WHY[self._why[0][b]], PROBE_WHY[self._why[1][b]]]
                row["probes"] = [self._probes[0][b], self._probes[1][b]]
                row["probes_by"] = {w: n for w, n in zip(PROBE_WHY, self._probes_by[b]) if n}
                row["restarts"] = self._restarts[b]
        return out

    def reason(self, batch_size: int) -> str:
        b = bucket_of(batch_size)
        g = self._gain(b)
        what = "probe" if self._probing else "goodput"
        if g is None:
            return f"{what}: exploring bucket {BUCKET_EDGES[b]}+"
        return f"{what}: spec/plain = {g:.2f} in bucket {BUCKET_EDGES[b]}+"
