"""Goodput's acceptance estimates: accepted drafts per request per bucket, and how requests differ.

A batch's acceptance is not the population's: requests that accept little stay longer while the
server speculates (_settled), and up to PER_REQUEST_MAX requests, told their ids, are estimated
from their own steps, each shrunk to the arrivals' (empirical Bayes)."""

from __future__ import annotations

import math
import operator
from typing import Hashable, Sequence

from dynspec.policy.buckets import BUCKET_EDGES, bucket_of
from dynspec.policy.goodput.base import GoodputBase
from dynspec.policy.step_cost import StepCost


class AcceptanceEstimates(GoodputBase):
    def _init_acceptance(self, profile: StepCost | None) -> None:
        n = len(BUCKET_EDGES)
        self.acc_est: list[float | None] = [None] * n
        self.n_acc = [0] * n  # speculative steps that fed acc_est[b]
        self._restarts = [0] * n  # estimates started again after a probe showed the requests changed
        self.acc_global: float | None = None
        self._n_acc_global = 0  # speculative steps that fed acc_global (a profile's prior: SHRINK)
        # Per bucket, what a bucket with few samples leans on instead of acc_global, when a
        # better-informed estimate is at hand (GoodputK: every K's steps, read by position).
        self.acc_prior: list[float] | None = None
        if profile is not None:
            self.acc_global = profile.acceptance.mean_accepted
            self._n_acc_global = int(self.SHRINK)  # a prior worth a few samples, not one
        # Speculative steps behind each bucket's acceptance (the gain's uncertainty, _gain_sd):
        # capped, as the estimate forgets (an EMA over about 1 / acc_alpha of them).
        self._acc_steps = [float(self.SHRINK) if profile is not None else 0.0] * n
        self._acc_steps_max = 1.0 / self.acc_alpha
        self._acc_weight = [min(1.0 / self.ACC_STEPS, self.alpha, 1.0 - (1.0 - self.acc_alpha) ** k) for k in range(257)]
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
        # Bucket b's accepted drafts over the unit _var_between is kept in: 1 where every bucket
        # runs one draft length; with a K per bucket (GoodputK) its E[accepted | K] over the
        # server's own, so pairs of steps at any K measure one spread and each bucket reads it at
        # its own K (to first order accepted drafts scale with K's, and their spread with them).
        self._acc_scale = [1.0] * n
        self._departed = 0  # requests folded into those (_depart)
        self._departed_mean: float | None = None  # their own means' mean: the arrivals'
        self._sd_within = 1.0  # sqrt of the within-request variance of accepted drafts (_gain_sd)
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
        bt *= self._acc_scale[b] ** 2
        if self._batch_acc is None:
            arrivals = self._population(b, 0.0)
            mean = pop if arrivals is None else arrivals
            shrink, req, total = max(wi / bt, self.SHRINK_MIN), self._req, 0.0
            for rid in batch:
                s = req.get(rid)
                total += mean if s is None else (s[0] + shrink * mean) / (s[2] + shrink)
            self._batch_acc = total / len(batch)
        return self._batch_acc

    def _own_draws(self, b: int) -> list[tuple[float, float] | None] | None:
        """For the batch of requests told by id in bucket b: each one's own mean accepted drafts
        so far and the weight _accepted gives them, n / (n + S), against the arrivals' mean (None
        for one that has told nothing); None while how requests differ is not yet measured (then
        _accepted is the population's)."""
        batch, wi, bt = self._batch, self._var_within, self._var_between
        if batch is None or b != self._batch_bucket or wi is None or bt is None or bt <= 0.0:
            return None
        shrink = max(wi / (bt * self._acc_scale[b] ** 2), self.SHRINK_MIN)
        req, out = self._req, []
        for rid in batch:
            s = req.get(rid)
            out.append(None if s is None or s[2] <= 0.0 else (s[0] / s[2], s[2] / (s[2] + shrink)))
        return out

    def _population(self, b: int, regime: float = 1.0) -> float | None:
        """Accepted drafts per request in bucket b over whichever requests ran there, in a batch
        formed while a share `regime` of steps speculate (_settled): by default as they settle
        while speculating steadily."""
        a, g = self.acc_est[b], self.acc_global if self.acc_prior is None else self.acc_prior[b]
        if a is None or g is None:
            return g if a is None else self._settled(a, self._f_acc[b], regime, self._acc_scale[b])
        k, s = self.n_acc[b], self.SHRINK
        a = (k * a + s * g) / (k + s)
        v = self._var_between
        if v is None or v <= 0.0:  # _settled's first line, inline: this runs every step
            return a
        return self._settled(a, (k * self._f_acc[b] + s * self._f_global) / (k + s), regime, self._acc_scale[b])

    def _settled(self, a: float, f: float, regime: float = 1.0, scale: float = 1.0) -> float:
        """Accepted drafts per request per step in a batch formed while a share `regime` of steps
        speculate, from a mean a sampled while a share f did.  Requests differ (variance v of
        their own means m); each stays for its output over the tokens it gains per step, so the
        batch holds requests in proportion to 1 / (1 + f (m - 1)): under plain steps (f = 0) as
        they arrive, mean mu; steadily speculating (f = 1) the slow ones linger, and the batch's
        mean falls to the harmonic mean; to second order mu - f v / (1 + f (mu - 1)).  A probe
        from plain sees the arrivals' mean: without this, speculation looks better than it will
        be.  scale: the bucket's _acc_scale."""
        v = self._var_between
        if v is None or v <= 0.0 or f == regime:
            return a
        v *= scale * scale
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

    def rescale_requests(self, r: float, own: dict | None = None) -> None:
        """The draft length changed: accepted drafts scale by r (to first order), so do what
        the running requests accepted so far (by own[id] where a request's own chain is known),
        the departed ones' mean and the spread within a request (the spread between requests is
        kept in one unit: _acc_scale)."""
        for rid, s in self._req.items():
            o = r if own is None else own.get(rid, r)
            s[0] *= o
            s[1] *= o * o
        if self._departed_mean is not None:
            self._departed_mean *= r
        if self._var_within is not None:
            self._var_within *= r * r
            self._sd_within = math.sqrt(self._var_within) if self._var_within > 0.0 else 1.0
        self._batch_acc = None

    def _depart(self, s: list) -> None:
        """Fold a departed request's own mean into the spread within and between requests.  Its
        spread is taken around the mean of the requests that departed before it (every request
        departs once, so they are the arrivals), not around an estimate that itself leans on the
        spread: centred on the population's settled estimate, one outlier among the first
        departures feeds back through _settled and the spread grows without bound."""
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
        between = ((mean - centre) ** 2 - self._var_within / n) / self._acc_scale[self._last_b] ** 2
        self._var_between = between if self._var_between is None else self._var_between + w * (between - self._var_between)

    def wants_requests(self, batch_size: int) -> bool:
        return batch_size <= self.PER_REQUEST_MAX or self._n_acc_global >= self._pair_at

    def _pair_sample(self, rids: Sequence[Hashable], accepted: Sequence[int], b: int) -> None:
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
        cov = (sxy - sx * sy / n) / (n - 1) / self._acc_scale[b] ** 2
        # One step's draws are noisy (a product of two of them per request), so a pair weighs
        # PAIR_WEIGHT per request, and the first ones their mean with PAIR_PRIOR requests'
        # worth of no spread at all: a few small batches must not make up a spread that would
        # cut the value of speculating (_settled) by half.
        self._pair_df += n - 1
        w = max(1.0 - (1.0 - self.PAIR_WEIGHT) ** (n - 1), (n - 1) / (self._pair_df + self.PAIR_PRIOR))
        v = self._var_between or 0.0
        self._var_between = v + w * (cov - v)

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
        in the bucket (a profile's prior counts as SHRINK of them), each with _step_sd's spread."""
        n = self._acc_steps[b]
        if n <= 0.0:
            return 0.0
        return g * self._step_sd(b) / (math.sqrt(n) * (1.0 + acc))

    def _step_sd(self, b: int) -> float:
        """The spread of one sampled step's mean accepted drafts in bucket b.  Its B requests
        draw apart (the within-request variance over B, B at most `draws`) but keep
        what they are (the between-request variance, whole: a batch's requests persist from
        step to step).  Never more than one request's draw, which is what a step counts as
        until requests are measured, and by default (draws=1: a batch's requests may share
        more than the pairs of steps measure)."""
        wi, bt, most = self._sd_within, self._var_between, self.draws
        if bt is None or most == 1:
            return wi
        n = BUCKET_EDGES[b]
        v = wi * wi / (n if n < most else most) + (bt * self._acc_scale[b] ** 2 if bt > 0.0 else 0.0)
        return wi if v >= wi * wi else math.sqrt(v)

    def acceptance_estimates(self) -> dict:
        """How requests differ and the regime the batch formed in (_settled): the variance of
        requests' own mean accepted drafts, the requests compared in pairs of speculative steps
        (_pair_sample), and the share of recent steps that speculated."""
        v = self._var_between  # (in the server's own K's accepted drafts: _acc_scale)
        return {"between_requests_variance": None if v is None else round(v, 4),
                "requests_compared": self._pair_df, "speculating_share": round(self._f, 3)}
