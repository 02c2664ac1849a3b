"""Goodput's prefill accounting: what prefill forwards between decode steps cost each mode.

Requests that finish together prefill their successors together, in one forward's fixed cost;
speculation scatters finishes where they come in lockstep (_scatter) and gathers more arrivals
into each forward where they come apart (_merge)."""

from __future__ import annotations

import math
from typing import Sequence

from dynspec.policy.buckets import BUCKET_EDGES, bucket_mid
from dynspec.policy.goodput.acceptance import AcceptanceEstimates


class PrefillAccount(AcceptanceEstimates):
    def _init_prefill(self) -> None:
        n = len(BUCKET_EDGES)
        self._lead_now = self.lead  # as finishes come now (_read_bursts)
        # Prefill forwards: requests whose prompts each finished (EMA over forwards), output tokens
        # per admitted request (decayed counts), and the agreed durations' sums for the fixed cost
        # of a forward (least squares of seconds on tokens): n, sum x, sum y, sum xx, sum xy.
        self._per_prefill: float | None = None
        self._burst_fwd = 0  # forwards in the burst under way
        self._presumed = False  # the burst under way is the first forward's (_per_prefill presumed)
        # The first wave's output budgets (note_budgets): asked for once a first forward is presumed
        # in lockstep; where they differ by more than its finishes can share forwards over, they
        # come apart whatever runs, and nothing is presumed.
        self.wants_budgets = False
        self._wave_apart = False
        # The largest batch of the last decode steps (a sliding max over about PEAK_STEPS): the
        # size a burst refills to.  A finish whose successor has not come by then is over.
        self._peak, self._peak_age = 0, 0
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
        self._after_pf = False  # a prefill result came since the last decode result
        # Prefill overhead: wall seconds around prefill forwards beyond the decode steps' own, per
        # request admitted (decayed sums), one figure for both modes: it follows the prompts, a
        # figure per mode goes stale in the mode that stopped running, and each prefill is read
        # in whichever mode happened to run beside it.  Only forwards that refill finished
        # requests count (_read_burst): a load's first wave (many prompts in one forward, cheap
        # per request) says nothing of what a refill costs.  Buffered for an agreement (TP).
        self._ov = [0.0, 0.0]
        self._ov_buf = [0.0, 0.0]
        # The forwards since the last decode result: the seconds charged to them (the decode
        # result that held a launch, their own results, the first decode result after them),
        # their requests, and whether one came on an idle server.
        self._rec_s, self._rec_n, self._rec_idle = 0.0, 0, False
        self._rec_blind = False  # a decode result beside them had no steady time to compare with
        self._c_req = 0.0  # the prefill overhead per request as used (_overhead)
        # The batch each bucket runs at, which a step's share of the prefills and the finishes it
        # scatters or merges scale with: an EMA of its steps' sizes (BATCH_W), its geometric middle
        # until it steps.  A closed loop of C sits at C, often a bucket's lower edge, a fifth below it.
        self._mid = [bucket_mid(b) for b in range(n)]

    def _prefills(self, b: int, acc: float, tp: float, ts: float) -> float:
        """Prefill time a spec step adds (or, below 0, saves) by how it changes the prefill
        forwards that admit the requests' successors, as a share of the step: where groups finish
        together (a lockstep, or what is left of one) it scatters them (_scatter); where finishes
        already come apart it gathers more of them into each forward (_merge).  The merge is not
        credited while groups of a split lockstep still prefill together: it would pick the
        speculation that scatters them."""
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
        speculating): bunched prompts merge less, and a real server's bursts are bunched.  A
        forward holds c prompts (the most tokens one held over prompt tokens per request), and
        what merging saves is 1 - 1/c of that: prompts near a chunk's size take a forward each
        anyway."""
        fixed = self._pf_fixed
        per = self._prompt_tokens / self._admitted if self._admitted > 0.0 else 0.0
        if fixed is None or per <= 0.0 or self._pf_max_tokens <= per:
            return 0.0
        lam = self._mid[b] / max(self._emitted / self._admitted, 1.0)
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
        lam = self._mid[b] * (1.0 + acc) / out
        if not self._refilled:
            if self._wave_apart:  # the first wave's budgets part its finishes: nothing to scatter
                return 0.0
            # No request has finished yet: out is only a lower bound.  The cost lam (1/E - 1/g)
            # is largest at lam = ln g, so take at most that: unsure, err to plain.
            lam = min(lam, math.log(g))
        extra = (-math.expm1(-lam) / lam if lam > 1e-9 else 1.0) - 1.0 / g
        return lam * extra * min(fixed, tp) / ts if extra > 0.0 else 0.0

    def _read_burst(self, bs: int) -> int:
        """The prompts since the last decode step, now decoding at batch bs: how many refill
        requests that finished (the rest grew the batch past its size over the last steps: a new
        load's first wave, which says nothing of how finishes come).  Requests per forward
        (_per_prefill) counts those."""
        burst, fw, self._burst, self._burst_fwd = self._burst, self._burst_fwd, 0, 0
        if self._presumed:  # a server's first forward: taken whole (note_prefill)
            self._presumed = False
        else:
            grew = bs - self._peak
            if grew > 0:
                burst = burst - grew if burst > grew else 0
            if burst and fw:
                g = self._per_prefill
                x = burst / fw
                self._per_prefill = x if g is None else g + self.PF_WEIGHT * (x - g)
        self._peak, self._peak_age = bs, 0
        return burst

    def _read_bursts(self) -> None:
        """How far requests finish together beyond chance: _lock, and the lead that goes with it.

        Prompts arrive in bursts (the prefill forwards between two decode steps) of n requests
        on a share p of decode steps, so n p finish per step.  At random, what a client's round
        trip (ROUND_TRIP decode steps) gathers into one burst is lam = ROUND_TRIP n p of them,
        e = lam / (1 - exp(-lam)) a burst; lockstep is bursts of at least 2 and twice that.
        Before any request has finished, every one so far came in the first burst.  The lead
        runs from lead_apart at chance to the full lead at lockstep's twice chance."""
        p, n = self._burst_p, self._burst_n
        if n is None:  # no prefill told (SGLang 0.5.23's adaptive protocol): the lead in full
            self._lock, self._lead_now = False, self.lead
            return
        if n < 2.0:  # prompts one at a time
            self._lock, self._lead_now = False, self.lead_apart
            return
        if not self._refilled:
            if self._wave_apart:
                self._lock, self._lead_now = False, self.lead_apart
            else:
                self._lock, self._lead_now = True, self.lead
            return
        lam = self.ROUND_TRIP * n * p
        e = lam / -math.expm1(-lam) if lam > 1e-9 else 1.0
        self._lock = n >= 2.0 * e
        self._lead_now = self.lead_apart + (self.lead - self.lead_apart) * min(max(n / e - 1.0, 0.0), 1.0)

    def note_prefill(self, requests: int, tokens: int, seconds: float | None = None, idle: bool = False) -> None:
        self._after_pf = True
        # The forward's whole interval is beyond the decode steps.  Not after an idle pause: a
        # whole forward's latency (waking included), which says nothing of a refill's cost.
        if idle:
            self._rec_idle = True
        elif seconds is not None and self.use_times and seconds > 0.0:
            self._rec_s += seconds
        self._rec_n += requests
        self._refilled = self._refilled or self._emitted > 0.0  # a prompt after decoding began
        self._burst += requests  # read at the next decode step (_read_burst)
        self._burst_fwd += 1
        if self._per_prefill is None:  # the first forward: the first wave of a closed loop is
            self._per_prefill = float(requests)  # presumed in lockstep until refills show otherwise
            self._presumed = True
            self.wants_budgets = True  # unless its output budgets say it cannot be (note_budgets)
        if self._refilled:
            self.wants_budgets = False
        d = self.OUT_DECAY
        self._admitted = self._admitted * d + requests
        self._prompt_tokens = self._prompt_tokens * d + tokens
        if tokens > self._pf_max_tokens:
            self._pf_max_tokens = tokens
        self._emitted *= d
        # The regime's span: half a request's life in decode steps (its output over the tokens a
        # step gives it), so the share f describes the requests in the batch now.
        g = self.acc_global or 0.0
        # (none admitted yet: a server's first forward was a chunk of a long prompt)
        life = self._emitted / self._admitted / (1.0 + self._f * g) if self._admitted > 0.0 else 0.0
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

    def _close_forward(self, refills: int) -> None:
        """The first decode result after prefill forwards came, `refills` of their requests
        successors of finished ones (_read_burst): what they cost is known.  A chunk of a prompt
        (no request admitted) carries its seconds to the forward that ends it."""
        n = self._rec_n
        if n <= 0:
            return
        if refills > 0 and not self._rec_idle and not self._rec_blind:
            self._overhead(self._rec_s * refills / n, refills)
        self._rec_s, self._rec_n, self._rec_idle, self._rec_blind = 0.0, 0, False, False

    def _overhead(self, seconds: float, requests: float) -> None:
        """Wall time around prefills beyond the decode steps' own and the requests those
        prefills admitted (decayed sums; buffered for an agreement under TP)."""
        if self._buffer_times:
            self._ov_buf[0] += seconds
            self._ov_buf[1] += requests
            return
        ov, d = self._ov, self.OV_DECAY
        ov[0] = ov[0] * d + seconds
        ov[1] = ov[1] * d + requests
        self._c_req = max(ov[0], 0.0) / ov[1] if ov[1] > 0.0 else 0.0

    def _costs(self, b: int, acc: float, tp: float, ts: float) -> tuple[float, float]:
        """What a plain and a spec step cost the server's throughput in bucket b: the step, and
        its share of the prefill overhead (per request admitted, times the requests a step
        finishes: batch x tokens a request gets / output per request)."""
        if not self._refilled or self._emitted <= 0.0:  # output per request is known once one finished
            return tp, ts
        per = self._mid[b] * self._admitted / self._emitted
        c = self._c_req * per
        return tp + c, ts + c * (1.0 + acc)

    def note_budgets(self, budgets: Sequence[int]) -> None:
        """The output budgets of the first wave's requests: what each may still generate.  A
        request finishes at its budget or before it (a stop token, at random), so n requests
        whose budgets spread over S tokens finish over S plain steps at least, n ROUND_TRIP / S to
        a round trip's forward: where that is under two they cannot move in lockstep."""
        self.wants_budgets = False
        n = len(budgets)
        if n >= 2 and 2.0 * (max(budgets) - min(budgets) + 1) > n * self.ROUND_TRIP:
            self._wave_apart = True
            self._read_bursts()
            self._refresh(self._last_b)

    def prefill_estimates(self) -> dict:
        """What it reads from prefill forwards (note_prefill): their fixed cost, requests per
        forward and per burst, the share of decode steps after a burst, output per request,
        whether finishes come in lockstep (then speculation pays for scattering them) and the lead
        that goes with how far they come together (_read_bursts)."""
        def r(x: float | None, k: int = 3) -> float | None:
            return None if x is None else round(x, k)

        return {"fixed_ms": r(None if self._pf_fixed is None else 1000 * self._pf_fixed),
                "overhead_ms_per_request": round(1000 * self._c_req, 3),
                "requests_per_prefill": r(self._per_prefill), "requests_per_burst": r(self._burst_n),
                "steps_after_a_burst": r(self._burst_p, 4),
                "output_per_request": r(self._emitted / self._admitted if self._admitted else None, 1),
                "lockstep": self._lock, "lead": round(self._lead_now, 4)}
