#!/usr/bin/env python3
"""Check that the pip pins of a conda environment file resolve together, without installing.

    python scripts/check_env_pins.py environment.yml [environment-sm120.yml ...]

For each file: its `pip:` section (index options and pins; local `-e .` lines are dynspec
itself and left out) goes to `uv pip compile` for Linux x86_64 and the file's Python, which
reads package metadata from the indexes but installs nothing.  Exit status: 0 every file
resolves, 1 one does not (uv's reason printed), 2 usage error, 3 skipped: an index the file
needs cannot be reached from here (printed with the URL), or uv is missing (how to get it).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import yaml

PYPI = "https://pypi.org/simple/"
SKIP = 3


def pip_section(path: Path) -> tuple[str, list[str]]:
    """(python version, pip lines) of an environment file."""
    data = yaml.safe_load(path.read_text())
    deps = data.get("dependencies", []) if isinstance(data, dict) else []
    python = next((d.split("=", 1)[1] for d in deps if isinstance(d, str) and d.startswith("python=")), "3.11")
    pip = next((d["pip"] for d in deps if isinstance(d, dict) and "pip" in d), [])
    return python, [str(x) for x in pip if not str(x).startswith("-e ")]


def indexes(lines: list[str]) -> list[str]:
    urls = [PYPI]
    for line in lines:
        if line.startswith(("--extra-index-url", "--index-url")):
            urls.append(line.split(None, 1)[1].strip())
    return urls


def unreachable(url: str, timeout: float = 10.0) -> str:
    """Why url cannot be reached ("" when it can)."""
    try:
        urllib.request.urlopen(urllib.request.Request(url, method="GET"), timeout=timeout).close()
        return ""
    except urllib.error.HTTPError as exc:  # the host answered: reachable (an index root may 404)
        return "" if exc.code < 500 else f"HTTP {exc.code}"
    except (urllib.error.URLError, OSError) as exc:
        return str(getattr(exc, "reason", exc))


def check(path: Path, uv: str) -> int:
    python, lines = pip_section(path)
    if not lines:
        print(f"{path}: no pip section")
        return 1
    for url in indexes(lines):
        why = unreachable(url)
        if why:
            print(f"SKIP {path}: {url} cannot be reached from here ({why}); run this where it can")
            return SKIP
    with tempfile.TemporaryDirectory() as tmp:
        req = Path(tmp) / "requirements.in"
        req.write_text("\n".join(lines) + "\n")
        # unsafe-best-match: a +cu130 torch lives only on PyTorch's index while PyPI has the plain one
        argv = [uv, "pip", "compile", str(req), "--python-version", python, "--python-platform", "x86_64-manylinux_2_28",
                "--index-strategy", "unsafe-best-match", "--no-header", "--no-annotate", "--quiet"]
        env = dict(os.environ, UV_NO_CONFIG="1")  # proxies kept; no uv.toml of the user's
        if os.environ.get("PIP_CERT") and not os.environ.get("SSL_CERT_FILE"):
            env["SSL_CERT_FILE"] = os.environ["PIP_CERT"]  # the CA bundle pip is told to trust
        r = subprocess.run(argv, capture_output=True, text=True, timeout=900, env=env)
    if r.returncode != 0:
        print(f"FAIL {path}: the pins do not resolve together:\n{r.stderr.strip()}")
        return 1
    pinned = [ln for ln in r.stdout.splitlines() if "==" in ln]
    wanted = {ln.split("==")[0].strip().lower(): ln.split("==")[1].strip() for ln in lines if "==" in ln}
    got = {ln.split("==")[0].strip().lower(): ln.split("==")[1].strip() for ln in pinned}
    moved = {k: (v, got.get(k)) for k, v in wanted.items() if got.get(k) != v}
    if moved:
        print(f"FAIL {path}: resolved other versions than pinned: {moved}")
        return 1
    print(f"OK {path}: {len(wanted)} pins resolve together ({len(pinned)} packages in all, Python {python}, "
          f"linux x86_64)")
    return 0


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    uv = shutil.which("uv") or str(Path(sys.executable).with_name("uv"))
    if not Path(uv).exists():
        print(f"SKIP: uv not found; install it with `{sys.executable} -m pip install uv==0.13.9`")
        return SKIP
    codes = [check(Path(p), uv) for p in argv]
    return 1 if 1 in codes else SKIP if SKIP in codes else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
