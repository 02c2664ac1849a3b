# Loaded by every Python process of a real SGLang server that dynspec.realsglang starts
# (this folder is first on its PYTHONPATH): the compatibility patches must be in place in
# the scheduler and detokenizer processes SGLang spawns, not only in the launcher.
import os

from dynspec.realsglang import compat

compat.install()
if os.environ.get("DYNSPEC_SYNC_CENSUS"):  # a diagnostic: experiments/h200-real-sglang/sync_census.py
    from dynspec.realsglang import census

    census.install(os.environ["DYNSPEC_SYNC_CENSUS"])
if os.environ.get("DYNSPEC_HOST_TIMES"):  # a diagnostic: experiments/h200-real-sglang/sync_census.py --host-times
    from dynspec.realsglang import hosttime

    hosttime.install(os.environ["DYNSPEC_HOST_TIMES"])
