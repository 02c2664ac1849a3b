"""dynspec's stand-in for `sgl_kernel` as SGLang 0.5.23 imports it (the sglang-kernel 0.4.10 package).

Why: sglang-kernel has no CPU build (CUDA only), so it cannot exist on this machine; SGLang
0.5.23 imports names from it at module level.  The ops a CPU server calls on its own path
are torch code (`ops.py`); every other entry raises naming itself (dynspec.realsglang.standin).
"""

from dynspec.realsglang.standin import populate

from . import ops

__version__ = "0.4.10"  # what SGLang 0.5.23 pins; the ops follow its semantics
populate(globals(), {name: getattr(ops, name) for name in ops.IMPLEMENTED}, real_submodules=("ops",))
