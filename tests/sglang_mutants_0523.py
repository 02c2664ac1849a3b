"""Deliberate breaks of dynspec's plain step on SGLang 0.5.23, for tests/test_real_sglang_0523.py.

As tests/sglang_mutants.py does for 0.5.9: a copy of the patched 0.5.23 (the cached unpacked
wheel) with one line of the plain step changed; the real-server test serves it and asserts that
its checks fail where the correct patch passes them.
"""

from __future__ import annotations

import shutil

from dynspec import realsglang

VERSION = "0.5.23"

# Text of the patched eagle_worker_v2.py -> broken text.
MUTANTS = {
    # The plain forward does not count the token it writes: the target attends one position
    # short and reads the bonus token at the previous position; greedy output changes.
    "mutant-plain-seq-lens": ("        plain.seq_lens = seq_lens + 1  # a plain decode counts the token it writes\n",
                              "        plain.seq_lens = seq_lens\n"),
    # The draft's K and V for the plain steps' tokens are computed but never written: output is
    # unchanged (the target verifies), but after a plain stretch the draft reads holes.
    "mutant-no-kv-catch-up": ("    draft_runner.token_to_kv_pool.set_kv_buffer(attn.attn, loc,",
                              "    0 and draft_runner.token_to_kv_pool.set_kv_buffer(attn.attn, loc,"),
    # The resume runs before the window's pending catch-up rows are written (the cycle's two
    # plain steps are far fewer than the window): the draft resumes over holes.
    "mutant-resume-before-flush": ("        dyn.flush()  # the resume's draft extend attends to the plain positions\n", ""),
    # No resume: the first draft after plain steps starts from the placeholder state.
    "mutant-no-resume": ("                    self._dynspec_resume(batch)\n",
                         "                    pass\n"),
}


def mutant_site(tmp, name: str):
    """A copy of the patched sglang 0.5.23 with one line of the plain step broken."""
    site = tmp / name
    shutil.copytree(realsglang.sglang_site(patched=True, version=VERSION), site, symlinks=True)
    path = site / "sglang/srt/speculative/eagle_worker_v2.py"
    old, new = MUTANTS[name]
    text = path.read_text()
    assert text.count(old) == 1, f"mutant {name}: the patched plain step no longer has {old!r}"
    path.write_text(text.replace(old, new))
    return site
