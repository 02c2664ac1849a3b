"""dynspec's stand-in for `sgl_kernel`, SGLang's native CUDA kernel package.

Why: the real package has no CPU build, and its CUDA build is tied to one torch version,
so neither this CPU machine nor a GPU machine with another torch can load it; SGLang 0.5.9
imports it at module level.  The three ops EAGLE-3 spec v2 (topk 1) calls on its own path
are torch code (`ops.py`); every other entry raises naming itself (dynspec.realsglang.standin).
"""

from dynspec.realsglang.standin import populate

from . import ops

__version__ = "0.3.21"  # what SGLang 0.5.9 pins; the ops follow its semantics
populate(globals(), {name: getattr(ops, name) for name in ops.IMPLEMENTED}, real_submodules=("ops",))
ops.define_fake_targets()
