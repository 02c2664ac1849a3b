"""How the tensor-parallel ranks' Controllers (dynspec.sglang.hook) agree, so that all decide alike.

Every rank runs its own Controller:

* Start: every rank joins one all-reduce MIN (`agree_start`, run by
  `load_controller(min_sync=...)`): dynspec runs on every rank or on none, and the
  mean sync hook is used by every rank or by none.  A rank that cannot even import
  dynspec must still join it, with `min_sync([0.0])`.  Then, after trying to capture
  the plain-step CUDA graphs, `ctl.agree_plain_graphs(captured)` (one more MIN) says
  whether every rank has them; if not, every rank runs plain steps eagerly.
* Running: every `sync_every` steps (and once per bucket just explored, for goodput)
  the Controller runs one all-reduce mean (the `sync` hook) carrying the policy's
  step-time sums and counts, a "failed" flag and a checksum of its decision state.
  If any rank's policy failed or the checksums differ, every rank speculates as
  configured from that step on (one warning, rank 0).  The schedule depends only on
  the step stream, so a rank whose policy failed still joins every agreement.
* Both hooks must be called at the same point on every rank.  Returning before them
  is safe only on conditions identical on every rank (DYNSPEC_POLICY, server args).

Standard library and dynspec.policy only: it runs inside SGLang's scheduler.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, TypeVar

from dynspec.policy import FailSafePolicy, SyncHook, SyncSchedule, state_checksum

# SyncHook (dynspec.policy): an all-reduce MEAN over the TP ranks.
MinSyncHook = Callable[[list[float]], list[float]]  # all-reduce MIN over the TP ranks


def warn_rank0(logger: logging.Logger, tp_rank: int, msg: str, *args) -> None:
    """A warning every rank would log alike, logged by rank 0 only."""
    if tp_rank == 0:
        logger.warning(msg, *args)


class TPAgreement:
    """The agreements of one rank's Controller: the running all-reduce mean (`_agree`, on the
    policy's `SyncSchedule`), the fallback every rank takes at the same step, and the
    plain-step CUDA graph agreement.  The Controller sets the attributes declared here."""

    policy: FailSafePolicy
    tp_rank: int
    tp_size: int
    min_sync: MinSyncHook | None
    log: logging.Logger
    mode: str
    step: int
    fallback: str | None
    plain_step_kind: str
    sync: SyncHook | None
    times_agreed: bool
    agreeing: bool
    _schedule: SyncSchedule
    _n_values: int
    # What agreeing costs this rank: all-reduces run while serving and the host seconds they took
    # (waiting for the slowest rank included), for /get_server_info.
    agreements: int = 0
    agreement_s: float = 0.0

    def _use_sync(self, sync: SyncHook | None) -> None:
        self.sync = sync
        # Step times reach the policy only when they are agreed: one rank, or a sync hook.
        self.times_agreed = self.tp_size <= 1 or sync is not None
        self.agreeing = self.tp_size > 1 and sync is not None
        if self.agreeing:
            inner = self.policy.inner
            inner.defer_sync()
            self._schedule = inner.sync_schedule()
            self._n_values = len(inner.sync_values())

    def _agree(self) -> None:
        """One all-reduce: the policy's values, then "failed", then one checksum slot per
        rank (each rank fills its own), so every rank reads every rank's checksum."""
        t0 = time.perf_counter()
        try:
            self._agree_once()
        finally:
            self.agreements += 1
            self.agreement_s += time.perf_counter() - t0

    def _agree_once(self) -> None:
        pol, k, n, sync = self.policy, self._n_values, self.tp_size, self.sync
        assert sync is not None  # only called while agreeing, which needs the hook
        values, check = [0.0] * k, 0
        if not pol.failed:
            try:
                values = [float(v) for v in pol.inner.sync_values()]
                if len(values) != k:
                    raise RuntimeError(f"sync_values gave {len(values)} values, expected {k}")
                check = state_checksum((self.mode, self.step, pol.inner.state_key()))
            except Exception as exc:  # noqa: BLE001 - this rank fails; the others learn it below
                pol.fail("sync", exc)
                values, check = [0.0] * k, 0
        slots = [0.0] * n
        slots[self.tp_rank] = float(check)
        try:
            agreed = sync(values + [1.0 if pol.failed else 0.0] + slots)
            if len(agreed) != k + 1 + n:
                raise RuntimeError(f"sync hook returned {len(agreed)} values, expected {k + 1 + n}")
        except Exception as exc:  # noqa: BLE001 - no agreement possible: stop deciding here
            self._fall_back(f"the TP sync failed ({type(exc).__name__}: {exc})", every_rank=False)
            return
        if agreed[k] > 0:  # a rank-mean: nonzero when any rank failed
            self._fall_back("the policy failed on a TP rank")
            return
        checks = {round(v * n) for v in agreed[k + 1:]}  # mean * ranks = the one rank's checksum
        if len(checks) > 1:
            self._fall_back(f"the TP ranks' decision states differ at step {self.step}")
            return
        try:
            pol.inner.sync_apply(agreed[:k])
        except Exception as exc:  # noqa: BLE001
            pol.fail("sync_apply", exc)  # carried to every rank by the next agreement

    def _fall_back(self, why: str, every_rank: bool = True) -> None:
        self.fallback = f"fallback: {why}"
        if self.tp_rank == 0 or not every_rank:
            self.log.warning("dynspec: %s; %s speculates as configured from step %d on",
                             why, "every TP rank" if every_rank else f"TP rank {self.tp_rank}", self.step)

    def agree_plain_graphs(self, captured: bool) -> bool:
        """Once per rank after trying to capture the plain-step CUDA graphs: True when
        every rank has them; False: every rank runs plain steps eagerly."""
        ok = captured
        if self.tp_size > 1 and self.min_sync is not None:
            try:
                ok = self.min_sync([1.0 if captured else 0.0])[0] >= 1.0
            except Exception as exc:  # noqa: BLE001 - the server must start; eager is always safe to run
                self.log.warning("dynspec: the TP min hook failed (%s); plain steps run eagerly", exc)
                ok = False
            if captured and not ok and self.tp_rank == 0:
                self.log.warning("dynspec: plain-step CUDA graphs are missing on a TP rank; "
                                 "every rank runs plain steps eagerly")
        self.plain_step_kind = "cuda_graph" if ok else "eager"
        return ok


C = TypeVar("C", bound=TPAgreement)


def agree_start(ctl: C | None, min_sync: MinSyncHook, tp_rank: int, logger: logging.Logger) -> C | None:
    """Every rank, once: MIN over one value (0: no controller, 1: one without a sync hook,
    2: one with); all ranks keep dynspec (and the hook) or none does."""
    mine = 0.0 if ctl is None else (2.0 if ctl.sync is not None else 1.0)
    try:
        agreed = min_sync([mine])[0]
    except Exception as exc:  # noqa: BLE001 - whatever went wrong, the server must start
        logger.warning("dynspec: the TP min hook failed (%s); dynspec is OFF on TP rank %d", exc, tp_rank)
        return None
    if agreed < 1.0 or ctl is None:  # without a controller here the MIN is 0
        if ctl is not None:
            warn_rank0(logger, tp_rank, "dynspec: could not start on every TP rank; dynspec is OFF on every rank "
                       "and the server speculates on every step as configured")
        return None
    if agreed < 2.0 and ctl.sync is not None:
        warn_rank0(logger, tp_rank, "dynspec: the TP sync hook is missing on a TP rank; step times unused on "
                   "every rank, the policy decides from batch size, acceptance and profile")
        ctl._use_sync(None)
    return ctl
