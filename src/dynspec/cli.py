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
    "dynspec.tune",
    "dynspec.sim",
    "dynspec.fit",
    "dynspec.emulator",
    "dynspec.sweep",
    "dynspec.readers",
    "dynspec.patching",
    "dynspec.pipeline",
    "dynspec.calibrate",
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dynspec", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(name).add_cli(sub)
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
