"""Goodput with a draft length: speculate or not as Goodput decides, and when speculating run
the candidate step count K with the most expected output per second.

Per K: expected tokens per request 1 + E[accepted | K], E[accepted | K] = sum over positions
i = 1..K of P(drafts 1..i accepted), the product of per-position acceptance estimates; cost
t(K) per bucket of batch sizes.  K* = argmax (1 + E[accepted | K]) / t(K) over the positive
candidates.

- Acceptance by position, from accept lengths: a request accepting j of K drafts tells that
  positions 1..j were accepted and, when j < K, that position j + 1 was rejected; positions
  beyond K are not seen (censored).  Decayed counts per position, so a shift in the prompts'
  acceptance is followed; a position never reached repeats the last one seen (the chain
  model's geometric decay).
- The batch each K settles into (above batch OWN_K_UP_TO): requests that accept much leave sooner
  under a long chain, so the counts, read from the batch settled at the running K, say too little
  of a shorter K and too much of a longer one where requests differ; each K's expected tokens are
  scaled to its own settled batch (settle.py).
- Cost by K: steady steps of each K timed as Goodput times its modes (the step before ran the
  same K), per bucket; a K not yet measured is linear in K through the measured speculative
  steps (a draft forward per step, a verify of K + 1 tokens), between the nearest two or
  extended from the last two, never below the plain step.  A speculative step has costs a plain
  one lacks at any K (the draft extend, the verify's set-up), so with one K measured the line
  from the plain step to it is too steep: it may send a probe, not move the choice (_rates).
- Probes: now and then PROBE_STEPS steps of another candidate K, so its cost and (from above)
  deeper positions' acceptance are measured.  The first comes after PROBE_FIRST speculative
  steps of a bucket, the next as soon again while it went to a K not run before; then the
  interval doubles while probes confirm the choice, from PROBE_MIN up to PROBE_MAX spec steps
  of the bucket, but only while the runner-up trails by PROBE_Z of its standard errors: within
  the position counts' noise the probes stay at PROBE_MIN (while a shorter K runs, a deep
  position's counts come from probes alone; thinning them would freeze a wrong reading).  A
  probe goes to the largest K above the chosen one not yet run in the bucket
  whose estimate beats the chosen one's (or that has none yet), since one run there measures
  every position up to it and the cost line's far end; else to a K below not yet run whose
  estimate beats it; else to the runner-up, the K whose estimate is nearest to overtaking.
  Goodput's own probes of speculation run the chosen K (they are its evidence).
- While Goodput decodes plainly in a bucket, a K not yet run there whose estimate beats the
  plain step is probed from plain (each at most once per bucket): otherwise a K that would
  pay is never measured where speculating at the chosen K loses.
- Up to batch OWN_K_UP_TO K is chosen for the requests running, not the population: each
  one's chain is the geometric one at its own rate, weighed against the population's as
  Goodput weighs its own accepted drafts against the arrivals' (n / (n + S), S by how much
  requests differ), and K is priced on the mean of their chains.  A request that accepts more
  gains most at the deep positions (the chain is a product), so its K is longer; a new request
  starts from the population's.  When K moves, each request's draws so far move by its own
  chain, the rest by the population's.
- K is chosen only once position 1 has MIN_TRIED request-samples: before that the estimates
  are the prior's, not the requests'.  Until position 1 has YOUNG samples every speculative step
  is read into the counts, then about SAMPLES / UPDATE_EVERY requests a step (every step below
  batch 8, every UPDATE_EVERY-th from batch 32), each count weighing as the steps it stands for;
  K is chosen again after each.
- The on/off decision stays Goodput's (lead, prefills, probes, hysteresis): it is shown the
  chosen K's steps as before, a probe's steps without its time and with accepted drafts cut to
  the chosen K (exact for a probe above it; none for one below), and when K* changes its
  estimates for the bucket are rescaled to the new K (where the server runs now, with them
  the running requests' draws: Goodput.rescale_requests; how requests differ is read at each
  bucket's K: Goodput._acc_scale).  A Goodput bucket with few samples of
  its own leans on E[accepted | its K] from the position counts (Goodput.acc_prior), which
  every K's steps feed, not on its global mean of the chosen K's few samples.  Until Goodput
  has measured how one request's accepted drafts vary, the spread its probe timing assumes is the
  chain's at the bucket's K (_sd_at).

Step times are local, not agreed across tensor-parallel ranks: with a sync hook (TP) the K
choice is off and every speculative step runs the server's own count (on_steps).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from dynspec.policy.base import Policy, StepRecord
from dynspec.policy.buckets import _BUCKETS, _LAST_BUCKET, _N_BUCKETS, BUCKET_EDGES
from dynspec.policy.goodput.policy import Goodput
from dynspec.policy.goodput.settle import factors
from dynspec.policy.sync import SyncSchedule

PROBE_STEPS = 3  # a probe's steps: the first after a change of K is not a steady one
PROBE_MIN, PROBE_MAX = 48, 768  # spec steps in a bucket between probes of another K
PROBE_Z = 2.0  # standard errors the runner-up must trail by before probes of it thin out
PROBE_FIRST = 4  # spec steps of a bucket before its first probe: a few of the chosen K, timed, first
MIN_TRIED = 8.0  # request-samples at position 1 before acceptance by position chooses K
YOUNG = 64.0  # below this many samples at position 1, every speculative step is counted
MARGIN = 0.01  # a new K must promise this much more output per second
SAMPLES = 32  # requests of a step read into the position counts (a strided sample)
# Spec steps between updates of the position counts and, with them, of the choice of K, from a
# batch of SAMPLES on: an eighth of steps pays for both, so the common step does neither.  Below,
# about SAMPLES / UPDATE_EVERY requests a step are read (every step up to batch 7).
UPDATE_EVERY = 8
# Request-steps the position counts remember.  Every step weighs alike: a count stands for the
# speculative steps since the one before it (one while young), a probe's for a strided count.
# (Counted at one weight, a level's first requests, read step by step while young, outweighed
# eight times as many later steps for the whole level.)
MEMORY = 600 * UPDATE_EVERY
_STRIDE = [max(1, min(UPDATE_EVERY, b * UPDATE_EVERY // SAMPLES)) for b in range(SAMPLES + 1)]
PRIOR_Q, PRIOR_N = 0.6, 2.0  # pseudo-counts for a position with few samples
ALPHA = 0.1  # EMA weight of a steady step's time
LEAD_BY_K = True  # the lead in proportion to the drafts a step at the bucket's K accepts
# Batch sizes up to this choose K for their own requests' acceptance (_request_cum), not the
# population's: at a few requests, those running decide what a deeper chain earns.
OWN_K_UP_TO = 4
# Above that, each K's estimate is for the batch it would settle into, where requests that accept
# much leave sooner under a long chain (settle.py), not for the batch as it is at the running K.
SETTLE = True
SETTLE_MOVE = 0.002  # survival at positions 1 and 2 moved this much: the factors again
_OWN_K_BUCKETS = _BUCKETS[OWN_K_UP_TO] + 1


def _chain(p: float, n: int) -> list[float]:
    """E[accepted | K] for K = 0..n of a request accepting each draft with probability p."""
    out, e, x = [0.0], 0.0, 1.0
    for _ in range(n):
        x *= p
        e += x
        out.append(e)
    return out


def _line(pts: list[tuple[int, float]], t0: float | None, k: int) -> float | None:
    """t(K) for a K not measured (GoodputK.cost), from the measured points and the plain step."""
    if len(pts) < 2:
        if t0 is None or not pts:
            return None
        pts = [(0, t0), *pts]
    lo = [p for p in pts if p[0] < k]
    hi = [p for p in pts if p[0] > k]
    (x0, y0), (x1, y1) = (lo[-1], hi[0]) if lo and hi else (pts[-2], pts[-1]) if lo else (pts[0], pts[1])
    t = y0 + (y1 - y0) * (k - x0) / (x1 - x0)
    floor = t0 if t0 is not None else 1e-9
    return t if t > floor else floor


class GoodputK(Policy):
    """Goodput's on/off decision, with the step count K of highest expected output per second."""

    name = "goodput-k"

    def __init__(self, inner: Goodput, spec_text: str = "goodput-k"):
        self.inner = inner
        self._spec_text = spec_text
        self.requests_up_to = inner.requests_up_to
        self._local = inner.sync is None  # K from local times only without tensor parallelism
        n = len(BUCKET_EDGES)
        self.t_k: list[list[float | None]] = [[None] for _ in range(n)]  # [bucket][K] steady EMA
        self.k_cur = [0] * n
        self.tried: list[float] = []  # decayed counts by position (0: the first draft)
        self.kept: list[float] = []
        self.seen: list[float] = []  # the same counts, each request-sample once (not as the steps it stands for)
        self._spec_n = [0] * n  # speculative decisions per bucket
        self._next_probe = [PROBE_FIRST] * n
        self._probe_iv = [PROBE_MIN] * n
        self._probe_left, self._probe_b, self._probe_k = 0, -1, 0
        self._probe_plain = False  # the probe under way was sent from plain decoding
        self._plain_n = [0] * n  # plain decisions per bucket
        self._next_plain_probe = [PROBE_FIRST] * n
        self._prev_k = -1  # the K of the previous step (steady timing)
        self._updates = 0  # speculative steps of the chosen K since the last count
        self._by_k = False  # candidates set and K chosen locally
        self._own_key: tuple | None = None  # _request_cum's last inputs and answer
        self._own_cum: list[float] = []
        self._own_geo: dict = {}  # the running requests' own chains by id (_request_cum)
        self._rate_cache: dict[tuple[float, int], float] = {}  # _own_rate's answers
        self._own_batch: object = None  # the requests K was last chosen for (Goodput._batch)
        self._settle: dict[int, tuple] = {}  # _settled's inputs and answer, by the K settled at
        # What the server calls on every step goes straight to Goodput (no frame of ours: policy bench).
        self.set_batch = inner.set_batch  # type: ignore[method-assign]
        self.wants_requests = inner.wants_requests  # type: ignore[method-assign]
        self.note_prefill = inner.note_prefill  # type: ignore[method-assign]
        self.note_budgets = inner.note_budgets  # type: ignore[method-assign]
        self._inner_decide, self._inner_observe = inner.decide, inner.observe

    # Candidates ---------------------------------------------------------------------------
    def set_candidate_steps(self, steps: Sequence[int], on_steps: int) -> None:
        super().set_candidate_steps(steps, on_steps)
        self._pos = [k for k in self.candidate_steps if k > 0]
        kmax = self._pos[-1]
        self.tried, self.kept, self.seen = [0.0] * kmax, [0.0] * kmax, [0.0] * kmax
        self._surv = self._survival()
        self._cum = [0.0, *(sum(self._surv[:i]) for i in range(1, kmax + 1))]
        self.t_k = [[None] * (kmax + 1) for _ in range(len(BUCKET_EDGES))]
        self.k_cur = [self.on_steps] * len(BUCKET_EDGES)
        self._by_k = self._local
        self._share0 = list(self.inner._lead_share)  # the lead's share by bucket at the server's own K

    # Deciding -----------------------------------------------------------------------------
    def decide(self, batch_size: int) -> bool:
        return self.inner.decide(batch_size)

    def decide_steps(self, batch_size: int) -> int:
        if not self._by_k:  # no candidates, or tensor parallel: the server's own count
            return self.on_steps if self._inner_decide(batch_size) else 0
        b = _BUCKETS[batch_size] if 0 <= batch_size < _N_BUCKETS else _LAST_BUCKET
        if b < _OWN_K_BUCKETS and self.inner._batch is not self._own_batch:
            # new requests: their K from what is known of them (at first, the population's),
            # before the on/off decision weighs it, not the K their predecessor left
            self._own_batch = self.inner._batch
            self._choose(b)
        spec = self._inner_decide(batch_size)
        if self._probe_left:
            if self._probe_b == b and (spec or self._probe_plain) and not (spec and self.inner._probing):
                self._probe_left -= 1
                return self._probe_k
            self._probe_left = 0
        if not spec:
            n = self._plain_n[b] = self._plain_n[b] + 1
            if n >= self._next_plain_probe[b]:
                k = self._plain_probe_target(b)
                self._next_plain_probe[b] = n + (PROBE_MIN if k is None else PROBE_FIRST)
                if k is not None:
                    self._probe_left, self._probe_b, self._probe_k, self._probe_plain = PROBE_STEPS - 1, b, k, True
                    return k
            return 0
        self._probe_plain = False
        n = self._spec_n[b] = self._spec_n[b] + 1
        # Goodput's own probe of speculation (from plain) runs the chosen K: it is that K's
        # acceptance and time that the on/off decision needs, and a probe of another K would
        # show it nothing (below) or only part (above).
        if n >= self._next_probe[b] and not self.inner._probing:
            k = self._probe_target(b)
            if k is not None:
                self._probe_left, self._probe_b, self._probe_k = PROBE_STEPS - 1, b, k
                # a K not yet run: the next one may be too, after a few steps of the chosen K
                self._next_probe[b] = n + (PROBE_FIRST if self.t_k[b][k] is None else self._probe_iv[b])
                return k
            self._next_probe[b] = n + self._probe_iv[b]
        return self.k_cur[b]

    def _plain_probe_target(self, b: int) -> int | None:
        """While Goodput decodes plainly in bucket b (its speculation, at the chosen K, loses): a
        K not yet run there whose estimate beats the plain step's output per second, the best
        such, so that a K that would pay is measured (each at most once per bucket).  With one
        K run there, the best K not yet run whatever its estimate: a K's estimate moves the
        choice only once two K are measured (_rates), and Goodput's own probes of speculation
        run the chosen K, which at a large batch may cost several plain steps where a short
        chain costs little more than one."""
        tk = self.t_k[b]
        t0 = tk[0] if tk[0] is not None else self.inner.t_est[0][b]
        if t0 is None or self.tried[0] < MIN_TRIED:
            return None
        rates, two = self._rates(b)
        best, rp = None, (1.0 / t0) if two else 0.0
        for k, r in rates.items():
            if tk[k] is None and r is not None and r > rp:
                best, rp = k, r
        return best

    def _probe_target(self, b: int) -> int | None:
        """The candidate to probe: the largest one above the chosen K not yet run in the bucket
        whose estimate could beat the chosen one's, else the runner-up (highest estimate)."""
        cur, tk = self.k_cur[b], self.t_k[b]
        rates = self.rates(b)
        rc = rates.get(cur)
        for k in reversed(self._pos):
            if k <= cur:
                break
            r = rates[k]
            if tk[k] is None and (r is None or rc is None or r >= rc):
                return k
        for k in self._pos:  # below: its estimate is the line from plain, too cheap; only if it beats
            if k >= cur:
                break
            r = rates[k]
            if tk[k] is None and r is not None and rc is not None and r > rc:
                return k
        others = [(r, k) for k, r in rates.items() if k != cur and r is not None]
        if others:
            return max(others)[1]
        near = [k for k in self._pos if k != cur]
        return near[0] if near else None

    # Estimates ------------------------------------------------------------------------------
    def survival(self) -> list[float]:
        """P(drafts 1..i accepted), i = 1..max candidate, from the position estimates (as of the
        last count)."""
        return self._surv

    def _survival(self) -> list[float]:
        out, p, q = [], 1.0, PRIOR_Q
        for t, k in zip(self.tried, self.kept):
            if t > 0.05:  # seen: its own rate, shrunk to the position before; else that one's
                q = (k + PRIOR_N * q) / (t + PRIOR_N)
            p *= q
            out.append(p)
        return out

    def cost(self, b: int, k: int) -> float | None:
        """t(K) in bucket b: measured; else linear in K through the measured speculative steps
        (between the nearest two, or extended from the last two), never below the plain step;
        with one K measured, the line from the plain step to it (see _rates)."""
        t = self.t_k[b][k]
        return t if t is not None else _line(*self._points(b), k)

    def _points(self, b: int) -> tuple[list[tuple[int, float]], float | None]:
        """The bucket's measured speculative steps (K, t), and the plain step's time."""
        tk = self.t_k[b]
        t0 = tk[0] if tk[0] is not None else self.inner.t_est[0][b]
        return [(j, t) for j, t in enumerate(tk) if j and t is not None], t0

    def rates(self, b: int) -> dict[int, float | None]:
        """Expected output tokens per request per second for each positive candidate K."""
        return self._rates(b)[0]

    def _rates(self, b: int) -> tuple[dict[int, float | None], bool]:
        """rates, and whether two K are measured.  An estimate moves the choice only where it rests
        on speculative steps alone: measured, or two K measured.  A speculative step has costs a
        plain one lacks at any K (the draft extend, the verify's set-up), so the line from the
        plain step through one K is too steep: too cheap below it, too dear above.  Such an
        estimate may send a probe, not the choice."""
        cum, tk, out = self._cum, self.t_k[b], {}
        if b < _OWN_K_BUCKETS and self.inner._batch_bucket == b:
            cum, f = self._request_cum(b), None
        else:  # a batch of many: what each K would settle into (settle.py)
            f = self._settled(self.k_cur[b])
        pts, t0 = self._points(b)
        for k in self._pos:
            t = tk[k]
            if t is None:
                t = _line(pts, t0, k)
            out[k] = None if t is None else (1.0 + cum[k]) * (1.0 if f is None else f[k]) / t
        return out, len(pts) >= 2

    def _settled(self, c: int) -> dict[int, float] | None:
        """Per K, the tokens per request-step a batch settled at K gives over what the position
        counts, read from a batch settled at c, say of K (settle.factors); None while requests
        look alike or SETTLE is off."""
        if not SETTLE or len(self._surv) < 2:
            return None
        s1, s2 = self._surv[0], self._surv[1]
        hit = self._settle.get(c)
        # (again once the counts moved by SETTLE_MOVE: at small batches they move a little every step)
        if hit is None or abs(hit[0] - s1) > SETTLE_MOVE or abs(hit[1] - s2) > SETTLE_MOVE:
            hit = self._settle[c] = (s1, s2, factors(s1, s2, c, self._pos))
        return hit[2]

    def _request_cum(self, b: int) -> list[float]:
        """E[accepted | K] per request of the batch running now in bucket b (their ids told, up
        to OWN_K_UP_TO): what Goodput reads of each, its own accepted drafts so far weighed
        against the population's by n / (n + S) (Goodput._own_draws), taken at every K.  A
        request accepts each draft at a rate of its own, so its own part is the geometric chain
        at the rate that gives its mean at the K it ran; the rest is the population's chain,
        whose shape, a mix of rates, rises with depth as the slow requests drop out.  At the
        bucket's K the two give about Goodput's estimate of the request (it shrinks to the
        arrivals' mean, this to the position counts'); a request not yet read is the
        population's.  (Scaling the population's position rates by one factor, capped at 1, a
        request at twice the population's rate at K = 1 read as sure at every depth.)"""
        g, cum = self.inner, self._cum
        cur = self.k_cur[b]
        own = g._own_draws(b) if cur > 0 else None
        if own is None or not any(own):
            return cum
        key = (tuple(own), cum[cur])
        if key == self._own_key:
            return self._own_cum
        n, m = len(cum), len(own)
        total, geos = [0.0] * n, {}
        for rid, x in zip(g._batch or range(len(own)), own):
            if x is None:
                total = [t + c for t, c in zip(total, cum)]
                continue
            mean, w = x
            geo = geos[rid] = _chain(self._own_rate(mean, cur), n - 1)
            total = [t + w * e + (1.0 - w) * c for t, e, c in zip(total, geo, cum)]
        self._own_key, self._own_geo = key, geos
        self._own_cum = [t / m for t in total]
        return self._own_cum

    def _own_rate(self, mean: float, k: int) -> float:
        """The rate p with p + p^2 + ... + p^k = mean, cached.  Newton's method from the infinite
        chain's rate mean / (1 + mean), which lies at or below it: the sum is convex in p, so
        the first step lands above the root and the rest fall to it from above."""
        key = (mean, k)
        p = self._rate_cache.get(key)
        if p is not None:
            return p
        if mean >= k or mean <= 0.0:
            p = 1.0 if mean >= k else 0.0
        else:
            p = mean / (1.0 + mean)
            for _ in range(40):
                f = d = 0.0
                x = 1.0
                for i in range(1, k + 1):
                    d += i * x
                    x *= p
                    f += x
                step = (f - mean) / d
                p -= step
                if -1e-12 < step < 1e-12:
                    break
        if len(self._rate_cache) > 256:
            self._rate_cache.clear()
        self._rate_cache[key] = p
        return p

    def _choose(self, b: int, after_probe: bool = False) -> None:
        if self.tried[0] < MIN_TRIED:  # position 1 barely seen: the estimates are the prior's
            return
        rates, two = self._rates(b)
        cur, tk = self.k_cur[b], self.t_k[b]
        rc = rates.get(cur)
        known = {k: r for k, r in rates.items() if r is not None and (two or tk[k] is not None)}
        if rc is None or not known or not (two or tk[cur] is not None):  # both ends measured, or no move
            return
        best = max(known, key=known.__getitem__)
        if best != cur and known[best] > rc * (1.0 + MARGIN):
            self._switch(b, cur, best)
            if b >= _OWN_K_BUCKETS:  # (below, each request moves K: no news about the K not run)
                self._probe_iv[b] = PROBE_MIN
        elif after_probe:
            others = [(r, k) for k, r in rates.items() if k != cur and r is not None]
            trails = not others or self._z(rates, cur, max(others)[1]) >= PROBE_Z
            self._probe_iv[b] = min(2 * self._probe_iv[b], PROBE_MAX) if trails else PROBE_MIN

    def _z(self, rates: dict[int, float | None], a: int, b: int) -> float:
        """By how many standard errors K = a's estimate leads K = b's (negative: trails), the
        uncertainty being the position rates' (binomial over the request-samples each rests on,
        the prior's pseudo-counts included); the step times count as known.  d ln(r_a / r_b) /
        d q_j = (sum of S_i over positions j..a) / (q_j (1 + E[acc | a])) less the same for b,
        so positions both chains share mostly cancel."""
        ra, rb = rates.get(a), rates.get(b)
        if ra is None or rb is None:
            return 0.0
        surv, seen, cum = self._surv, self.seen, self._cum
        ea, eb = 1.0 + cum[a], 1.0 + cum[b]
        var = tail_a = tail_b = 0.0
        for j in range(min(max(a, b), len(surv)) - 1, -1, -1):
            s = surv[j]
            if j < a:
                tail_a += s
            if j < b:
                tail_b += s
            q = s / surv[j - 1] if j else s
            if 0.0 < q < 1.0:
                d = (tail_a / ea - tail_b / eb) / q
                var += d * d * q * (1.0 - q) / (seen[j] + PRIOR_N)
        lead = math.log(ra / rb)
        return lead / math.sqrt(var) if var > 0.0 else math.copysign(math.inf, lead)

    def _switch(self, b: int, old: int, new: int) -> None:
        """K* moved: Goodput's estimates for the bucket become the new K's."""
        g, cum = self.inner, self._cum
        # at small batches each running request's draws move by its own chain (read before K moves)
        own = None
        if b < _OWN_K_BUCKETS and g._batch_bucket == b and self._request_cum(b) is not cum:
            own = {rid: geo[new] / geo[old] for rid, geo in self._own_geo.items() if geo[old] > 0.0}
        self.k_cur[b] = new
        e_old, e_new = cum[old], cum[new]
        a = g.acc_est[b]
        if a is not None and e_old > 0.0:
            g.acc_est[b] = a * e_new / e_old
        if g.acc_prior is not None:
            g.acc_prior[b] = e_new
        # How requests differ is measured in accepted drafts at the K that ran: at K = 1 a
        # spread measured at K = 5 would have the slow requests linger far more than they can
        # (_settled), and speculation there look like a loss.  The spread between requests is
        # kept in the server's own K's unit and each bucket reads it at its K (_scales); the
        # departed requests' mean and the spread within one follow the K where the server runs
        # now, as the means do (to first order, in proportion), and at small batches each running
        # request's own draws follow its own chain (with the population's, a request moved from
        # K = 5 to K = 1 kept the accepted drafts of a richer one, and the reverse).
        if e_old > 0.0 and b == g._last_b:
            g.rescale_requests(e_new / e_old, own)
        self._scales()
        t = self.cost(b, new)
        if t is not None and g.t_est[1][b] is not None:
            g.t_est[1][b] = t
        if LEAD_BY_K:
            self._lead_at(b)
        self._sd_at(b)
        g._refresh(b)

    def _scales(self) -> None:
        """Goodput's _acc_scale: each bucket reads the spread between requests at its own K."""
        cum = self._cum
        on = cum[self.on_steps]
        if on > 0.0:
            self.inner._acc_scale = [cum[k] / on for k in self.k_cur]

    def _lead_at(self, b: int) -> None:
        """Goodput's lead in bucket b for the K chosen there.  The lead prices what requests finishing
        apart costs beyond a step's time, and how far apart they drift grows with the drafts a step
        may accept: a step at K = 1 moves a request 1 or 2 tokens, at K = 5 anywhere from 1 to 6.
        So the lead set for the server's own K scales with E[accepted | K] over E[accepted | N]."""
        cum, g = self._cum, self.inner
        e_on = cum[self.on_steps]
        f = cum[self.k_cur[b]] / e_on if e_on > 0.0 else 1.0
        share = g._lead_share[b] = self._share0[b] * f
        g._discount[b] = 1.0 / (1.0 + g.lead * share)

    def _sd_at(self, b: int) -> None:
        """Until Goodput has measured how one request's accepted drafts vary from step to step
        (it does so only for small batches), the spread its probe timing assumes is the chain's at
        bucket b's K: accepted A has E[A] = sum S_i and E[A^2] = sum (2i - 1) S_i over positions
        i = 1..K.  Goodput's fixed 1 suits a chain of several drafts; at K = 1, where A is 0 or 1,
        it doubles the uncertainty and with it how often plain decoding probes a step that loses."""
        g = self.inner
        if g._var_within is not None:
            return
        k, surv = self.k_cur[b], self._surv
        e = e2 = 0.0
        for i in range(min(k, len(surv))):
            e += surv[i]
            e2 += (2 * i + 1) * surv[i]
        v = e2 - e * e
        g._sd_within = math.sqrt(v) if v > 0.0 else 1.0

    # Observing ------------------------------------------------------------------------------
    def observe(self, rec: StepRecord) -> None:
        # Runs after every step (dynspec policy bench): the common step times its K and hands the
        # record on; the position counts and the choice of K come every UPDATE_EVERY-th
        # speculative step together (the choice moves only when the counts did), and on probes.
        if not self._by_k:
            self._inner_observe(rec)
            return
        bs, speculated, accepted, t, _, clean, k, _ = rec
        if k is None:
            k = self.on_steps if speculated else 0
        b = _BUCKETS[bs] if 0 <= bs < _N_BUCKETS else _LAST_BUCKET
        first = False
        if t is not None and clean and k == self._prev_k:
            tk = self.t_k[b]
            old = tk[k]
            if old is None:
                tk[k], first = t, True
            else:
                tk[k] = old + ALPHA * (t - old)
        self._prev_k = k
        if not (speculated and accepted):
            self._inner_observe(rec)
            if first:  # a bucket's first steady plain step: the line's K = 0 point
                self._choose(b)
            return
        cur = self.k_cur[b]
        if k != cur:  # a probe: every step counted (its positions are why it runs)
            self._count(accepted, k, b, _STRIDE[bs] if bs < SAMPLES else UPDATE_EVERY)
            # Goodput first, so that a change of K below rescales estimates that include this step;
            # it sees the chosen K's acceptance where that is exact (a probe above), else none.
            self._inner_observe(rec._replace(accepted=[a if a < cur else cur for a in accepted] if k > cur else (),
                                             step_time_s=None))
            if not self._probe_left:  # its last step: weigh the K's again
                self._choose(b, after_probe=True)
            return
        self._inner_observe(rec)
        u = self._updates = self._updates + 1
        young = self.tried[0] < YOUNG
        if young or u >= (_STRIDE[bs] if bs < SAMPLES else UPDATE_EVERY):
            self._updates = 0
            self._count(accepted, k, b, 1 if young else u)
            self._choose(b)
        elif first:
            self._choose(b)

    def _count(self, accepted: Sequence[int], k: int, b: int, steps: int) -> None:
        """Fold a step's accept lengths (at most SAMPLES of its requests), standing for `steps`
        speculative steps, into the position counts, and the survival and its running sums that
        the choice reads from them."""
        n = len(accepted)
        sample = accepted[:: (n + SAMPLES - 1) // SAMPLES] if n > SAMPLES else accepted  # at most SAMPLES
        hist = [sample.count(i) for i in range(k)]  # requests that accepted exactly i drafts
        tried, kept, seen, reach = self.tried, self.kept, self.seen, len(sample)
        d = (1.0 - 1.0 / MEMORY) ** (steps * reach)
        for i in range(k if k <= len(tried) else len(tried)):
            nxt = reach - hist[i]  # samples that went past position i+1
            tried[i] = tried[i] * d + steps * reach
            kept[i] = kept[i] * d + steps * nxt
            seen[i] = seen[i] * d + reach
            reach = nxt
        self._surv = self._survival()
        e, cum = 0.0, [0.0]
        for x in self._surv:
            e += x
            cum.append(e)
        self._cum = cum  # E[accepted | K] = cum[K]
        if self.tried[0] >= MIN_TRIED:
            # Goodput's buckets with few samples of their own lean on every K's steps, read by
            # position, rather than on its global mean of the chosen K's few: at batch 1 a probe
            # or two of one request's draws would otherwise hold speculation off for a level.
            self.inner.acc_prior = [cum[k] for k in self.k_cur]
            self._scales()
            if LEAD_BY_K:  # the bucket stepping now; another follows its K when it steps again
                self._lead_at(b)
            self._sd_at(b)

    # Delegated (set_batch, wants_requests, note_prefill and note_budgets: bound to Goodput's in __init__)
    @property
    def wants_budgets(self) -> bool:  # type: ignore[override]
        return self.inner.wants_budgets

    def reason(self, batch_size: int) -> str:
        b = _BUCKETS[batch_size] if 0 <= batch_size < _N_BUCKETS else _LAST_BUCKET
        return f"{self.inner.reason(batch_size)}; K={self.k_cur[b] if self.candidate_steps else self.on_steps}"

    def spec(self) -> str:
        return self._spec_text

    def sync_schedule(self) -> SyncSchedule:
        return self.inner.sync_schedule()

    def sync_values(self) -> list[float]:
        return self.inner.sync_values()

    def sync_apply(self, agreed: list[float]) -> None:
        self.inner.sync_apply(agreed)

    def defer_sync(self) -> None:
        self.inner.defer_sync()

    def state_key(self) -> tuple:
        return (self.inner.state_key(), tuple(self.k_cur), self._probe_left, self._probe_k)

    def estimates(self, b: int | None = None) -> dict[str, Any]:
        """What the K choice in bucket b rests on (for reading, not the hot path); without b,
        Goodput's estimates per bucket, each with its K and per-K step times (ms) where timed."""
        if b is not None:
            return {"k": self.k_cur[b], "survival": self.survival(),
                    "cost": {k: self.cost(b, k) for k in self._pos}, "rates": self.rates(b)}
        out = self.inner.estimates()
        if self._by_k:
            for i, edge in enumerate(BUCKET_EDGES):
                row = out.get(f"{edge}+")
                if row is not None:
                    row["k"] = self.k_cur[i]
                    row["k_ms"] = {k: round(1000 * t, 3) for k, t in enumerate(self.t_k[i]) if t is not None}
        return out

    def prefill_estimates(self) -> dict:
        return self.inner.prefill_estimates()

    def acceptance_estimates(self) -> dict:
        return self.inner.acceptance_estimates()
