# Loaded by every Python process of a real SGLang 0.5.23 server that dynspec.realsglang starts
# (this folder is first on its PYTHONPATH): the compatibility patches for 0.5.23 in every process.
from dynspec.realsglang import compat, compat_0523  # noqa: F401  (compat_0523 registers 0.5.23's hooks)

compat.install(version="0.5.23")
