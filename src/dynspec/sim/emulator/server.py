"""`dynspec emulate`: the emulator's app served on a port until SIGTERM or SIGINT."""

from __future__ import annotations

import asyncio
import signal
import sys

from dynspec.sim.emulator.app import emulator_key, make_app
from dynspec.sim.emulator.clock import EmulatorConfig
from dynspec.sim.emulator.limits import ACCEPT_BATCH, HEADER_TIMEOUT_S, ConnectionCap, max_connections, raise_file_limit
from dynspec.models import input_error
from dynspec.sim.run import SIM_ARMS


async def _serve_async(app, host: str, port: int, ready) -> None:
    from aiohttp import web

    runner = web.AppRunner(app, access_log=None, handle_signals=False, keepalive_timeout=HEADER_TIMEOUT_S)
    await runner.setup()
    loop = asyncio.get_running_loop()
    cap = ConnectionCap(runner.server, max_connections(raise_file_limit()))
    try:
        listener = await loop.create_server(cap, host, port, backlog=ACCEPT_BATCH, reuse_address=True)
    except OSError as exc:
        await runner.cleanup()
        raise OSError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    bound = listener.sockets[0].getsockname()[1] if listener.sockets else port
    app[emulator_key()].port = bound
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):  # not the main thread: the caller stops us
            pass
    ready(bound)
    try:
        await stop.wait()
    finally:
        listener.close()
        await runner.cleanup()


def serve(profile, arm: str, host: str = "127.0.0.1", port: int = 30000, time_scale: float = 1.0, *,
          seed: int = 0, model_name: str | None = None, context_length: int = 131072,
          max_running_requests: int | None = None, ready=None) -> None:
    """Serve until SIGTERM or SIGINT; ready(port) is called once the port is bound."""
    app = make_app(profile, arm, time_scale=time_scale, seed=seed, host=host, port=port, model_name=model_name,
                   context_length=context_length, max_running_requests=max_running_requests)
    asyncio.run(_serve_async(app, host, port, ready or (lambda _p: None)))


def _run(args) -> int:
    from dynspec.sim.profile import ProfileError, load_profile

    prog = "dynspec emulate"
    try:
        cfg = EmulatorConfig(profile=args.profile, arm=args.arm, host=args.host, port=args.port,
                             time_scale=args.time_scale, seed=args.seed, model_name=args.model_name,
                             context_length=args.context_length, max_running_requests=args.max_running_requests)
        profile = load_profile(cfg.profile)
    except (ValueError, ProfileError) as exc:  # pydantic's ValidationError is a ValueError
        print(input_error(prog, exc), file=sys.stderr)
        return 2
    if cfg.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"{prog}: note: listening on {cfg.host}, not loopback only", file=sys.stderr)

    def ready(port: int) -> None:
        print(f"dynspec emulate: ready on http://{cfg.host}:{port} (profile {profile.name}, arm {cfg.arm}, "
              f"time-scale {cfg.time_scale:g})", flush=True)

    try:
        serve(profile, cfg.arm, cfg.host, cfg.port, cfg.time_scale, seed=cfg.seed, model_name=cfg.model_name,
              context_length=cfg.context_length, max_running_requests=cfg.max_running_requests, ready=ready)
    except OSError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    return 0


def add_cli(sub) -> None:
    p = sub.add_parser("emulate", help="serve SGLang's HTTP API from a profile, in real time")
    p.add_argument("--profile", required=True, help="a shipped profile name or a .yaml path")
    p.add_argument("--arm", required=True, help=f"{', '.join(SIM_ARMS)} or policy:SPEC")
    p.add_argument("--host", default="127.0.0.1", help="default loopback only")
    p.add_argument("--port", type=int, default=30000, help="0 picks a free port (printed when ready)")
    p.add_argument("--time-scale", type=float, default=1.0, help="run X times faster than the profile")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model-name", default=None, help="served model name (default: dynspec/PROFILE)")
    p.add_argument("--context-length", type=int, default=131072)
    p.add_argument("--max-running-requests", type=int, default=None)
    p.set_defaults(func=_run)


