"""dynspec's stand-in for `flashinfer` on a GPU machine without it.

Why: SGLang 0.5.9's JIT RoPE module (sglang.jit_kernel.rope) imports flashinfer at module
level on CUDA, although a server started with SGLANG_IS_FLASHINFER_AVAILABLE=false and Triton
attention never calls it (RoPE takes its torch path, dynspec.realsglang.compat).  Every entry
raises naming itself if called.
"""

from dynspec.realsglang.standin import populate

__version__ = "0.0.0+dynspec.standin"
populate(globals(), {})
