"""Deliberate breaks of dynspec's patched plain step, for the real-server tests.

A mutant is a copy of the patched SGLang (the cached unpacked wheel) with one line changed; a
test serves it and asserts that its checks fail where a correct patch passes them.
"""

from __future__ import annotations

import shutil

from dynspec import realsglang

# Text of the patched eagle_worker_v2.py -> broken text.
MUTANTS = {
    # The target writes its KV one slot off: later tokens attend to a hole.
    "mutant-kv-slot": ("        target_batch.out_cache_loc = slot\n",
                       "        target_batch.out_cache_loc = slot + 1\n"),
    # The draft catch-up computes K and V but never writes them.
    "mutant-no-catch-up": ("    draft_runner.token_to_kv_pool.set_kv_buffer(attn.attn, slot,",
                           "    0 and draft_runner.token_to_kv_pool.set_kv_buffer(attn.attn, slot,"),
    # The resume runs before the window's pending catch-up rows are written (cycle: 2 plain
    # steps, then one speculative; the window holds 32): the draft resumes on stale KV.
    "mutant-resume-before-flush": ("        self._dynspec_flush_draft_kv()\n        stale = self._dynspec_stale",
                                   "        stale = self._dynspec_stale"),
    # A prefill in a plain stretch leaves the prompt's draft KV unwritten (the ring still gets
    # each prompt's last row, so the resume itself is right): the draft reads junk for the prompt.
    "mutant-no-prefill-kv": ("            _dynspec_draft_kv_catch_up(\n                self.draft_worker.draft_runner, aux",
                             "            0 and _dynspec_draft_kv_catch_up(\n                self.draft_worker.draft_runner, aux"),
}
CATCH_UP_MUTANTS = ("mutant-no-catch-up", "mutant-resume-before-flush")
# Under tensor parallelism (tests/test_real_sglang_tp.py): the decision reads a rank-local value,
# its TP rank added to the batch size, so with a batch-size threshold rank 1 goes plain one
# batch size before rank 0 does, and the ranks run different forwards.
TP_MUTANTS = {
    "mutant-rank-local": ("    return not ctl.decide(len(batch.seq_lens), _dynspec_can_plain(batch), batch.reqs)\n",
                          "    return not ctl.decide(len(batch.seq_lens) + ctl.tp_rank, _dynspec_can_plain(batch), "
                          "batch.reqs)\n"),
}


def mutant_site(tmp, name: str):
    """A copy of the patched sglang with one line of the plain step broken."""
    site = tmp / name
    shutil.copytree(realsglang.sglang_site(patched=True), site, symlinks=True)
    path = site / "sglang/srt/speculative/eagle_worker_v2.py"
    old, new = {**MUTANTS, **TP_MUTANTS}[name]
    text = path.read_text()
    assert text.count(old) == 1, f"mutant {name}: the patched plain step no longer has {old!r}"
    path.write_text(text.replace(old, new))
    return site
