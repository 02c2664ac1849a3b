# Loaded by every Python process of a real SGLang 0.5.23 server that dynspec.realsglang starts
# (this folder is first on its PYTHONPATH): the compatibility patches for 0.5.23 in every process.
import os

from dynspec.realsglang import compat, compat_0523  # noqa: F401  (compat_0523 registers 0.5.23's hooks)

compat.install(version="0.5.23")
if os.environ.get("DYNSPEC_HOST_TIMES"):  # a diagnostic: experiments/cpu-sglang-0523-steps0/measure.py --host-times
    from dynspec.realsglang import hosttime

    hosttime.install(os.environ["DYNSPEC_HOST_TIMES"])
