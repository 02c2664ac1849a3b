"""One provenance record beside every output: what made it, from which code, on which machine.

    {"dynspec": "0.1.0",                       the version `dynspec --version` prints
     "git": {"commit": "...", "dirty": false}, the checkout dynspec ran from (null: not a checkout)
     "command": "sim", "argv": ["dynspec", "sim", ...],
     "config": {...},                          the command's resolved, typed config as data
     "profile": {"name", "source", "sha256"},  the profile it read (null: none)
     "outputs": {"FILE": "sha256", ...},       files written whole before the record (null: they grow)
     "machine": {"host", "platform", "python", "cpu_count", "gpus"},
     "created": "2026-01-01T12:00:00+00:00"}

It goes in an output folder as provenance.json (a run folder, a report folder, `tune --out`)
or beside a single-file output as OUTPUT.provenance.json.  Building it never fails a command:
a git that is missing, slow or not looking at a checkout gives git null.  docs/PROVENANCE.md.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import subprocess
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

from pydantic import BaseModel

from dynspec.io.atomic import write_json
from dynspec.paths import REPO_ROOT

FILE_NAME = "provenance.json"
GIT_TIMEOUT_S = 5.0


def in_folder(folder: str | Path) -> Path:
    """Where the record of an output folder goes."""
    return Path(folder) / FILE_NAME


def beside(output: str | Path) -> Path:
    """Where the record of a single-file output goes."""
    output = Path(output)
    return output.with_name(f"{output.name}.{FILE_NAME}")


def version() -> str:
    from dynspec import __version__

    return __version__


def git_state(root: str | Path = REPO_ROOT, timeout: float = GIT_TIMEOUT_S) -> dict | None:
    """The commit and dirty flag of the checkout at root; None when root is not the top of a
    checkout (an installed package), git is missing, or it does not answer within timeout."""
    root = Path(root)

    def git(*args: str) -> str | None:
        try:  # --no-optional-locks: a status never takes the index lock from the user's own git
            r = subprocess.run(["git", "--no-optional-locks", "-C", str(root), *args], capture_output=True,
                               text=True, timeout=timeout)
        except (OSError, subprocess.SubprocessError):
            return None
        return r.stdout.strip() if r.returncode == 0 else None

    top = git("rev-parse", "--show-toplevel")
    if top is None or Path(top).resolve() != root.resolve():  # a checkout around an installed package is not ours
        return None
    commit = git("rev-parse", "HEAD")
    if not commit:
        return None
    status = git("status", "--porcelain")
    return {"commit": commit, "dirty": None if status is None else bool(status)}


def machine() -> dict:
    from dynspec.environment import gpu_names, machine as host

    return {**host(), "gpus": gpu_names()}


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def profile_ref(name_or_path: str | Path) -> dict:
    """A profile as a record names it: its name, the name or path it was given as, and the hash of
    the bytes that were loaded (a shipped profile's file inside the package, or the file at the path)."""
    from dynspec.sim.profile import load_profile, profile_bytes

    return {"name": load_profile(name_or_path).name, "source": str(name_or_path),
            "sha256": sha256_of(profile_bytes(name_or_path))}


def config_data(config) -> dict:
    """A typed config (pydantic model or dataclass) as JSON data: paths as strings, tuples as lists."""
    if isinstance(config, BaseModel):
        return config.model_dump(mode="json")
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        config = dataclasses.asdict(config)
    return json.loads(json.dumps(config, default=str))


def build(command: str, config, *, argv: list[str] | None, profile: str | Path | None = None,
          outputs: Sequence[Path] = (), git_root: str | Path = REPO_ROOT) -> dict:
    """The record of one command: argv is what was invoked (None when called as a library)."""
    return {
        "dynspec": version(),
        "git": git_state(git_root),
        "command": command,
        "argv": list(argv) if argv is not None else None,
        "config": config_data(config),
        "profile": profile_ref(profile) if profile is not None else None,
        "outputs": {Path(p).name: sha256_of(Path(p).read_bytes()) for p in outputs} or None,
        "machine": machine(),
        "created": datetime.now(timezone.utc).astimezone().isoformat(timespec="seconds"),
    }


def write(path: str | Path, command: str, config, *, argv: list[str] | None, profile: str | Path | None = None,
          outputs: Sequence[Path] = ()) -> Path:
    """Build the record and write it whole at path (provenance.in_folder or provenance.beside)."""
    return write_json(path, build(command, config, argv=argv, profile=profile, outputs=outputs))


def argv_of(args) -> list[str] | None:
    """The command line `dynspec` was invoked with (cli.main puts it on the parsed arguments)."""
    return getattr(args, "argv", None)
