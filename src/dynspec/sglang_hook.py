"""Old path of dynspec.sglang.hook, kept because patched SGLangs import it: re-exports that module."""

import sys

from dynspec.sglang import hook

sys.modules[__name__] = hook  # the same module object: its state and monkeypatches are shared
