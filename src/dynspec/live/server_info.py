"""What SGLang's /get_server_info payload says about the scheduler, and dynspec's block in it.

Apart from dynspec.live.servers, which starts processes, so that code reading saved payloads (a
results file, a run's scrapes) does not depend on it.
"""

from __future__ import annotations


def server_state(server_info: dict | None) -> dict:
    """internal_states[0] of /get_server_info (the decode server's, when disaggregated)."""
    info = server_info or {}
    if isinstance(info.get("decode"), list) and info["decode"]:
        info = info["decode"][0]  # as sglang.bench_serving reads it
    states = info.get("internal_states") if isinstance(info, dict) else None
    return states[0] if isinstance(states, list) and states and isinstance(states[0], dict) else {}


def dynspec_state(server_info: dict | None) -> dict | None:
    """The dynspec counters a patched SGLang (or the emulator) reports, None without dynspec.

    Both put them where SGLang keeps per-scheduler state: internal_states[0]["dynspec"]."""
    block = server_state(server_info).get("dynspec")
    return block if isinstance(block, dict) else None
