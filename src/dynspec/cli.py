"""The `dynspec` command: one entry point, a subcommand per module.

Each module listed in COMMANDS exposes `add_cli(subparsers)`; its handler imports
what is heavy only when it runs, so `dynspec --help` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = [
    "dynspec.policy_cli",
    "dynspec.analysis.tune",
    "dynspec.sim.run",
    "dynspec.analysis.fit_cli",
    "dynspec.sim.emulator",
    "dynspec.live.sweep",
    "dynspec.live.readers",
    "dynspec.sglang.patching",
    "dynspec.analysis.pipeline",
    "dynspec.calibrate.run",
]


def main(argv: list[str] | None = None) -> int:
    from dynspec import __version__

    parser = argparse.ArgumentParser(prog="dynspec", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"dynspec {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(name).add_cli(sub)
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    args.argv = ["dynspec", *argv]  # what a command's provenance record says was invoked
    try:
        return int(args.func(args) or 0)
    except (ValueError, OSError, RecursionError, MemoryError) as exc:
        # What a command did not turn into its own message: still one line, exit 2, never a traceback.
        print(f"dynspec {args.command}: {one_line(exc)}", file=sys.stderr)
        return 2


def one_line(exc: BaseException) -> str:
    """An exception as one line: its message squeezed, or its kind when it has none."""
    if isinstance(exc, RecursionError):
        return "input nested too deeply"
    if isinstance(exc, MemoryError):
        return "out of memory (input too large)"
    text = " ".join(str(exc).split())
    if isinstance(exc, OSError) and exc.strerror:
        text = f"{exc.filename or ''}: {exc.strerror}".lstrip(": ")
    return text[:300] or type(exc).__name__


if __name__ == "__main__":
    sys.exit(main())
