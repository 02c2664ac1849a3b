"""Policies: before each decode step, speculate or decode plainly.

Every policy answers `decide(batch_size) -> bool` before a step and learns from
`observe(StepRecord)` after it.  The same objects run inside the patched SGLang
server (one copy per tensor-parallel rank), the simulator and the emulator, so this
package imports the standard library only.

Tensor-parallel safety: every rank must take the same decision at every step, or
the collectives hang.  So a decision may depend only on what every rank sees
identically (batch size, accepted-token counts, a profile read at start, the step
counter) or on values the ranks agreed on through the `sync` hook the caller
supplies.  Local wall-clock step times never reach a decision directly.  A policy
says what the ranks agree on (`sync_values`/`sync_apply`), when (`sync_schedule`,
a function of the step stream only) and what its decisions depend on (`state_key`,
checksummed across ranks); `Goodput(sync=hook)` runs the agreements itself, and
dynspec.sglang.hook.Controller runs them for any policy in a TP server (`defer_sync`).

Modules: base (Policy, StepRecord), sync (agreement across ranks), buckets, static
(always, never, threshold, table, cycle), tiers (SGLang's adaptive tiers), goodput
(dynspec's own), failsafe, step_cost (what a policy reads from a profile) and spec
(building a policy from its spec string).
"""

from dynspec.policy.base import Policy, PolicySpecError, StepRecord
from dynspec.policy.buckets import BUCKET_EDGES, bucket_mid, bucket_of
from dynspec.policy.failsafe import FailSafePolicy, log
from dynspec.policy.goodput import Goodput, GoodputParams
from dynspec.policy.spec import POLICY_NAMES, build_policy, check_spec
from dynspec.policy.static import Always, Cycle, Never, Table, Threshold
from dynspec.policy.step_cost import ProfileLoader, StepCost
from dynspec.policy.sync import SYNC_EVERY, SyncHook, SyncSchedule, state_checksum
from dynspec.policy.tiers import SGLANG_DEFAULT_TIERS, SglangTiers

__all__ = [
    "BUCKET_EDGES", "POLICY_NAMES", "SGLANG_DEFAULT_TIERS", "SYNC_EVERY", "Always", "Cycle", "FailSafePolicy",
    "Goodput", "GoodputParams", "Never", "Policy", "PolicySpecError", "ProfileLoader", "SglangTiers", "StepCost",
    "StepRecord", "SyncHook", "SyncSchedule", "Table", "Threshold", "bucket_mid", "bucket_of", "build_policy",
    "check_spec", "log", "state_checksum",
]
