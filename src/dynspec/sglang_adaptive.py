"""Old path of dynspec.sglang.adaptive, kept because patched SGLangs import it: re-exports that module."""

import sys

from dynspec.sglang import adaptive

sys.modules[__name__] = adaptive  # the same module object: its state and monkeypatches are shared
