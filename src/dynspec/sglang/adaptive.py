"""dynspec's policy behind SGLang 0.5.23's AdaptiveController.

SGLang 0.5.23 (--speculative-adaptive) builds one runtime state per speculative step
count (0 = no drafting: a one-token verify, i.e. a plain decode step) and lets an
`AdaptiveSpecPolicy` pick among them.  The dynspec patch for 0.5.23 hands the
controller a `DynspecAdaptivePolicy` instead of SGLang's acceptance-EMA tiers when
asked, by DYNSPEC_POLICY or by a "dynspec" key in the adaptive config JSON:

    {"1": {"candidate_steps": [0, 3]}, "dynspec": "goodput"}
    {"1": {"candidate_steps": [0, 3]}, "dynspec": {"policy": "goodput", "profile": "seed-blackwell"}}

The integer keys still size SGLang's buffers and validate --speculative-num-steps
(upstream reads them before any policy exists), and SGLang builds one state per step
count in their union.  A policy that chooses the step count (`goodput-k`,
`sglang-default-tiers`, a `table:` of K values: STEP_POLICIES) is handed every one of
them (Policy.set_candidate_steps, the server's --speculative-num-steps as its "on") and
the state its decide_steps answers runs; the union must hold 0 and N.  Any other policy
uses two states, N when it says speculate and 0 when plain, so it runs only with a
config whose candidate steps are exactly [0, N] (`steps_problem`): SGLang's default
([0, 1, 3, 5, 7], used without --speculative-adaptive-config) would size buffers for 7
steps it never runs.

How the protocol's calls map onto dynspec (all on the scheduler thread):
  get_steps_for_batch(bs)   once per decode forward, before drafting -> Policy.decide_steps
  on_verify_complete(acc)   once per decode result, accept counts already on the CPU
                            -> Policy.observe; returns None (the switch happens at the
                            next get_steps_for_batch, never mid-pipeline)
With the overlap scheduler the next forward is launched before the previous result is
processed, so decisions wait in a short queue and each result is matched to the
decision that produced it.

Every TP rank runs the same scheduler loop on the same batch sizes and accept
counts, so every rank takes the same decision; step times reach the policy only
through the Controller (dynspec.sglang.hook), i.e. agreed across ranks by its sync
hook.  A step time is the gap between two consecutive decode results, and counts
only while the GPU ran decode steps back to back: when a step was launched after the
previous result was already in (a prefill ran between, the server idled, or the
overlap scheduler is off), that gap is not taken, nor (as the Controller does after any
other forward) the one after it.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import time
from typing import Callable, Mapping, Sequence

CONFIG_KEY = "dynspec"
# SGLang 0.5.23's DEFAULT_ADAPTIVE_CONFIG: the states it builds without --speculative-adaptive-config.
DEFAULT_STEPS = [0, 1, 3, 5, 7]
# Policies whose decide_steps chooses among the candidate step counts (the others answer on/off).
STEP_POLICIES = ("goodput-k", "sglang-default-tiers", "table")
_log = logging.getLogger("dynspec.sglang.adaptive")


class AdaptiveSelectionError(ValueError):
    """A "dynspec" entry in the adaptive config that cannot be used; one line naming it."""


def read_config(cfg_path: str):
    """The adaptive config JSON, or AdaptiveSelectionError naming why it cannot be read."""
    try:
        with open(cfg_path) as f:
            return json.load(f)
    except (OSError, ValueError) as exc:
        raise AdaptiveSelectionError(f"{cfg_path}: cannot read the adaptive config ({exc})") from None


def config_steps(cfg) -> list[int]:
    """The union of the config's candidate steps, as SGLang reads it (integer keys only):
    what SGLang sizes its buffers for."""
    steps: set[int] = set()
    for key, entry in (cfg.items() if isinstance(cfg, dict) else ()):
        if key.isdigit() and isinstance(entry, dict) and isinstance(entry.get("candidate_steps"), list):
            steps.update(s for s in entry["candidate_steps"] if isinstance(s, int))
    return sorted(steps)


def chooses_steps(spec: str) -> bool:
    """Whether the policy `spec` names chooses a step count among the candidates."""
    return spec.split(":", 1)[0].strip() in STEP_POLICIES


def server_steps(cfg_path: str | None) -> list[int]:
    """The step counts SGLang builds a state for: the config's union, or its default's."""
    return DEFAULT_STEPS if cfg_path is None else config_steps(read_config(cfg_path))


def steps_problem(cfg_path: str | None, spec_steps: int, choose: bool = False) -> str | None:
    """Why this config cannot carry dynspec, or None.  SGLang sizes its buffers for the
    largest candidate step of the config (of DEFAULT_ADAPTIVE_CONFIG without one: steps
    [0, 1, 3, 5, 7], 8 draft tokens and 16 KV slots per request) before any policy
    exists.  A policy that chooses the step count (`choose`) runs any of them and needs 0
    (plain) and speculative_num_steps among them; any other uses only 0 and
    speculative_num_steps, so the config's steps must be exactly those two."""
    want = [0, spec_steps]
    example = json.dumps({"1": {"candidate_steps": want}})
    try:
        got = server_steps(cfg_path)
    except AdaptiveSelectionError as exc:
        return str(exc)
    if choose:
        if 0 in got and spec_steps in got:
            return None
        where = "SGLang's default config" if cfg_path is None else cfg_path
        return (f"{where}: candidate steps {got}, a policy that chooses the step count needs 0 and "
                f"--speculative-num-steps {spec_steps} among them")
    if cfg_path is None:
        return (f"dynspec needs --speculative-adaptive-config with candidate steps {want}, e.g. {example} "
                f"(without one SGLang sizes its buffers for its default steps [0, 1, 3, 5, 7]; "
                f"a policy that chooses the step count, e.g. goodput-k, runs them all)")
    if got != want:
        return (f"{cfg_path}: candidate steps {got}, dynspec needs exactly {want} (SGLang sizes its buffers "
                f"for the largest; a policy that chooses the step count, e.g. goodput-k, runs them all), "
                f"e.g. {example}")
    return None


def selection(cfg_path: str | None, env: Mapping[str, str] | None = None) -> dict[str, str] | None:
    """The policy (and profile) asked for, as DYNSPEC_* settings; None when nothing asks.

    The adaptive config's "dynspec" key wins over the environment: it belongs to this
    one server's configuration.
    """
    env = os.environ if env is None else env
    entry = None
    if cfg_path is not None:
        cfg = read_config(cfg_path)
        entry = cfg.get(CONFIG_KEY) if isinstance(cfg, dict) else None
    if entry is not None:
        if isinstance(entry, str):
            entry = {"policy": entry}
        if not isinstance(entry, dict) or set(entry) - {"policy", "profile"}:
            raise AdaptiveSelectionError(
                f'{cfg_path}: "{CONFIG_KEY}" must be a policy spec string or '
                f'{{"policy": SPEC, "profile": NAME_OR_PATH}}, got {entry!r}')
        spec, profile = entry.get("policy"), entry.get("profile")
        if not isinstance(spec, str) or not spec.strip():
            raise AdaptiveSelectionError(f'{cfg_path}: "{CONFIG_KEY}.policy" must be a non-empty spec string')
        if profile is not None and (not isinstance(profile, str) or not profile.strip()):
            raise AdaptiveSelectionError(f'{cfg_path}: "{CONFIG_KEY}.profile" must be a profile name or path')
        # The config's entry is complete on its own: no profile there means none.
        return {"DYNSPEC_POLICY": spec.strip(), "DYNSPEC_PROFILE": profile.strip() if profile else ""}
    spec = (env.get("DYNSPEC_POLICY") or "").strip()
    if not spec:
        return None
    out = {"DYNSPEC_POLICY": spec}
    if (env.get("DYNSPEC_PROFILE") or "").strip():
        out["DYNSPEC_PROFILE"] = env["DYNSPEC_PROFILE"].strip()
    return out


class DynspecAdaptivePolicy:
    """SGLang 0.5.23's AdaptiveSpecPolicy, answered by a dynspec Controller.

    `controller` is a dynspec.sglang.hook.Controller (policy + counters + switch log
    + agreed step times); `spec_steps` is the server's speculative_num_steps.
    """

    # Decisions not yet matched to a result: at most two are in flight with the
    # overlap scheduler; more means results were skipped (their decisions are dropped).
    MAX_PENDING = 8

    def __init__(self, controller, spec_steps: int, candidate_steps: Sequence[int] | None = None, *,
                 clock: Callable[[], float] = time.perf_counter):
        if spec_steps < 1:
            raise ValueError(f"dynspec needs a positive speculative_num_steps to speculate with, got {spec_steps}")
        steps = sorted(set(candidate_steps)) if candidate_steps else [0, spec_steps]
        if 0 not in steps or spec_steps not in steps:
            raise ValueError(f"candidate steps {steps} need 0 and speculative_num_steps {spec_steps}")
        self.controller = controller
        self.spec_steps = spec_steps
        self._candidates = steps
        # The policy chooses among every state the server built (decide_steps).
        controller.set_candidate_steps(steps, spec_steps)
        self._clock = clock
        self._cuda_graph_bs: list[int] | None = None
        self._steps = spec_steps  # the state SGLang starts in (its initial speculative_num_steps)
        self._pending: collections.deque = collections.deque()  # (batch_size, steps, launch_time)
        self._last_result_t: float | None = None
        self.unmatched_results = 0
        # What the patched worker ran for each decode step (plain_decode, steps0_verify, resume).
        self.forwards: collections.Counter = collections.Counter()

    # --- the AdaptiveSpecPolicy protocol ------------------------------------------------
    @property
    def candidate_steps(self) -> list[int]:
        return list(self._candidates)

    def set_cuda_graph_bs(self, cuda_graph_bs: list[int] | None) -> None:
        self._cuda_graph_bs = sorted(cuda_graph_bs) if cuda_graph_bs else None

    def cuda_graph_bs_for_step(self, step: int) -> list[int] | None:
        # A dynspec policy may pick any state at any batch size: each gets every graph.
        if self._cuda_graph_bs is None:
            return None
        return list(self._cuda_graph_bs) if step in self._candidates else []

    def get_steps_for_batch(self, batch_size: int) -> int:
        if batch_size <= 0:  # an idle batch: nothing to decide, keep the current state
            return self._steps
        k = self._steps = self.controller.decide_steps(batch_size)
        if len(self._pending) >= self.MAX_PENDING:
            self._pending.popleft()
        self._pending.append((batch_size, k, self._clock()))
        return k

    def on_verify_complete(self, num_correct_drafts_per_req: Sequence[int], batch_size: int) -> int | None:
        now = self._clock()
        match = None
        i = next((i for i, p in enumerate(self._pending) if p[0] == batch_size), None)
        if i is not None:  # decisions before it had no result (skipped): drop them
            for _ in range(i):
                self._pending.popleft()
            _, k, launched = self._pending.popleft()
            match = (k, launched)
        if match is None:
            # A result whose decision we did not see: attribute it to the current
            # state, and take no step time from it.
            self.unmatched_results += 1
            k, back_to_back = self._steps, False
        else:
            k, launched = match
            back_to_back = self._last_result_t is not None and launched <= self._last_result_t
        if not back_to_back and self._last_result_t is not None:
            # Not a decode step time (the very first result has no interval at all).
            self.controller.note_gap()
        self.controller.observe(batch_size, k > 0, num_correct_drafts_per_req if k else (), steps=k)
        self._last_result_t = now
        return None  # dynspec switches only before a step (get_steps_for_batch)

    def note_forward(self, kind: str) -> None:
        """Called by the patched EAGLEWorkerV2 for each forward it chose (a counter only)."""
        self.forwards[kind] += 1

    # --- reporting ---------------------------------------------------------------------
    def dynspec_stats(self) -> dict:
        """The Controller's counters, for /get_server_info (key "dynspec")."""
        stats = self.controller.stats()
        stats["engine"] = "sglang-0.5.23-adaptive"
        stats["spec_steps"] = self.spec_steps
        stats["unmatched_results"] = self.unmatched_results
        stats["forwards"] = dict(self.forwards)
        return stats


def build_adaptive_policy(
    spec_steps: int,
    cfg_path: str | None,
    *,
    tp_rank: int = 0,
    tp_size: int = 1,
    sync_factory: Callable[[], Callable[[list], list] | None] | None = None,
    min_sync: Callable[[list], list] | None = None,
    env: Mapping[str, str] | None = None,
    logger: logging.Logger | None = None,
) -> DynspecAdaptivePolicy | None:
    """The dynspec policy the server asked for, or None (then SGLang's own policy runs).

    Like dynspec.sglang.hook.load_controller it never raises: a bad request logs one
    warning on rank 0 and returns None, and the server runs SGLang's adaptive tiers.
    With `min_sync` (an all-reduce MIN over the TP ranks) and tp_size > 1, every rank
    that was asked joins one MIN (hook.agree_start), so either every rank runs
    dynspec or none.
    """
    from dynspec.sglang.hook import agree_start, load_controller

    logger = logger or _log
    env = os.environ if env is None else env
    try:
        asked = selection(cfg_path, env)
    except AdaptiveSelectionError as exc:
        if tp_rank == 0:
            logger.warning("dynspec: %s; dynspec is OFF and SGLang's adaptive policy runs", exc)
        return None
    if asked is None:
        return None
    why: str | None
    if spec_steps < 1:
        why = (f"speculative_num_steps is {spec_steps}, so there is no speculative state to switch to")
    else:
        why = steps_problem(cfg_path, spec_steps, chooses_steps(asked["DYNSPEC_POLICY"]))
    if why is None:
        ctl = load_controller(tp_rank=tp_rank, tp_size=tp_size, sync_factory=sync_factory, min_sync=min_sync,
                              initial_steps=spec_steps, env={**env, **asked}, logger=logger)
        return None if ctl is None else DynspecAdaptivePolicy(ctl, spec_steps, server_steps(cfg_path))
    if tp_rank == 0:
        logger.warning("dynspec: %s; dynspec is OFF and SGLang's adaptive policy runs", why)
    if tp_size > 1 and min_sync is not None:
        agree_start(None, min_sync, tp_rank, logger)  # the other ranks' start agreement: off on every rank
    return None
