"""Real SGLang wheels: downloaded once, cached, unpacked where a test or a server needs them.

`wheel(version)` returns a cached sglang-<version> wheel, fetching it with
`pip download --no-deps` on a miss; `unpack(version, dest)` unzips it (a wheel is a
zip) so that dest looks like a site-packages directory holding sglang/ and its
dist-info.  The cache is ~/.cache/dynspec/wheels, or $DYNSPEC_WHEEL_CACHE.
Nothing here installs SGLang anywhere: the tests work on the unpacked copies.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import zipfile
from pathlib import Path


def cache_dir() -> Path:
    return Path(os.environ.get("DYNSPEC_WHEEL_CACHE", "~/.cache/dynspec/wheels")).expanduser()


def _find(cache: Path, version: str) -> Path | None:
    # Pure-Python (0.5.9) or a cp311 manylinux wheel (0.5.23 ships Rust extensions; its patched files are .py).
    hits = sorted(cache.glob(f"sglang-{version}-*.whl"))
    return hits[0] if hits else None


def wheel(version: str) -> Path:
    """The pure-Python sglang wheel of `version`, from the cache or PyPI."""
    cache = cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    hit = _find(cache, version)
    if hit is not None:
        return hit
    with open(cache / ".lock", "w") as lock:  # one download at a time
        fcntl.flock(lock, fcntl.LOCK_EX)
        hit = _find(cache, version)
        if hit is None:
            cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                   "--only-binary=:all:", "--python-version", "3.11", f"sglang=={version}", "-d", str(cache)]
            subprocess.run(cmd, check=True, timeout=600)
            hit = _find(cache, version)
    if hit is None:
        raise FileNotFoundError(f"pip download gave no wheel of sglang {version} in {cache}")
    return hit


def unpack(version: str, dest: Path) -> Path:
    """Unzip the sglang `version` wheel into dest (created); return dest."""
    dest.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel(version)) as zf:
        zf.extractall(dest)
    return dest
