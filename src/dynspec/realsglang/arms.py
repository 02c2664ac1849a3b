"""Arms of real SGLang servers started side by side, and the greedy client that compares them.

An arm is one server: plain or EAGLE-3, upstream or patched by dynspec, with or without a
policy.  `start_arms` starts them all at once (each in its own process group, logs kept in
`logdir`), waits until every one answers /health, and stops them all on exit.  `greedy`
sends the same prompts to an arm at a given concurrency with temperature 0 and returns
the token ids and SGLang's per-request metadata: identical ids across arms is the test that
a plain step computes exactly what a plain server computes.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from dynspec import realsglang
from dynspec.live.servers import ArmServer, ServerError, quiet_port


@dataclass(frozen=True)
class Arm:
    name: str
    speculative: bool = True
    patched: bool = False
    policy: str | None = None  # DYNSPEC_POLICY; None leaves it unset
    env: dict = field(default_factory=dict)
    args: tuple[str, ...] = ()
    site: Path | None = None  # an sglang copy other than the cached upstream/patched one
    tp: int = 1  # --tp-size: tensor-parallel ranks (on a CPU over gloo, one scheduler process each)
    version: str = "0.5.9"  # the SGLang release served: 0.5.9 or 0.5.23


def arm_server(arm: Arm, models: Path, logdir: Path, *, gpu: bool = False, extra_args: Sequence[str] = (),
               startup_timeout: float = 900.0) -> ArmServer:
    site = arm.site or realsglang.sglang_site(arm.patched, version=arm.version)
    # Only what the server needs beyond the caller's environment (ArmServer adds that back).
    env = realsglang.server_env(site, gpu=gpu, base={"PYTHONPATH": os.environ.get("PYTHONPATH", "")},
                                version=arm.version)
    if arm.speculative:
        env["SGLANG_ENABLE_SPEC_V2"] = "1"
    if arm.policy is not None:
        env["DYNSPEC_POLICY"] = arm.policy
    env.update(arm.env)
    # Both of the server's TCP ports chosen here, away from the ephemeral range: left to itself,
    # SGLang picks its NCCL store port at random, and arms started together can collide.
    port = quiet_port()
    argv = realsglang.server_argv(models / "target", port, draft=models / "draft" if arm.speculative else None,
                                  gpu=gpu, extra=[*extra_args, *arm.args, *tp_args(arm.tp), "--nccl-port", str(quiet_port())],
                                  version=arm.version)
    return ArmServer(arm.name, argv, port=port, env=env, log_path=logdir / f"{arm.name}.log",
                     startup_timeout=startup_timeout, shutdown_grace=10)


def tp_args(tp: int) -> list[str]:
    if tp < 1:
        raise ValueError(f"Arm.tp must be 1 or more, not {tp}")
    return [] if tp == 1 else ["--tp-size", str(tp)]


@contextlib.contextmanager
def start_arms(arms: list[Arm], models: Path, logdir: Path, **kw):
    """Start every arm at once; yield {name: ArmServer} once all are healthy; stop all on exit."""
    servers = {a.name: arm_server(a, models, logdir, **kw) for a in arms}
    try:
        for s in servers.values():
            s.start()
        t0 = time.monotonic()
        for s in servers.values():
            s.wait_healthy()
            s.healthy_after = time.monotonic() - t0
        yield servers
    finally:
        for s in servers.values():
            s.stop()


def shrinking_prompts(n: int = 4, seed: int = 7, vocab: int = 256) -> tuple[list[list[int]], list[int]]:
    """n random prompts whose output lengths differ (24, 34, ...), so the batch shrinks n -> 1."""
    import random

    rng = random.Random(seed)
    prompts = [[rng.randrange(3, vocab) for _ in range(rng.randrange(6, 24))] for _ in range(n)]
    return prompts, [24 + 10 * i for i in range(n)]


def generate(base_url: str, ids: list[int], max_new_tokens: int, timeout: float = 600.0) -> dict:
    body = json.dumps({"input_ids": ids, "sampling_params": {
        "temperature": 0, "max_new_tokens": max_new_tokens, "ignore_eos": True}}).encode()
    req = urllib.request.Request(base_url + "/generate", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def greedy(server: ArmServer, prompts: list[list[int]], lengths: list[int], concurrency: int,
           timeout: float = 600.0) -> list[dict]:
    """Each prompt with its output length, `concurrency` at a time: [{"ids", "meta"}] in prompt order.
    A request unanswered after `timeout` seconds raises (a hung server is a failure, not a wait)."""
    pool = ThreadPoolExecutor(concurrency)
    try:
        outs = list(pool.map(lambda p: generate(server.base_url, p[0], p[1], timeout=timeout), zip(prompts, lengths)))
    finally:  # after a timeout the queued prompts are not sent: one watchdog period, not one per prompt
        pool.shutdown(wait=True, cancel_futures=True)
    return [{"ids": o["output_ids"], "meta": o["meta_info"]} for o in outs]


def server_info(server: ArmServer) -> dict:
    snap = server.scrape()
    if snap.server_info is None:
        raise ServerError(f"arm {server.name}: /get_server_info failed ({snap.error})")
    return snap.server_info
