#!/usr/bin/env python3
"""Rewrite an SGLang wheel without what a text-only server never imports, so that it travels in one
run on the GPU machine (64 MiB with the working tree): the multimodal generation package and the Rust
extensions of the gRPC server, the benchmark and the multimodal processors.  The wheel is only
unzipped by dynspec.realsglang.wheels (never pip-installed), so its RECORD is left as it was.
Every real 0.5.23 server test passes on the slimmed wheel (the cp311 one, 39.1 -> 26.0 MB, on a
2-core CPU, 2026-12-04): put it alone in a folder D, then
`DYNSPEC_WHEEL_CACHE=D DYNSPEC_SGLANG_CACHE=$(mktemp -d) pytest tests/test_real_sglang_0523.py`.

    python scripts/slim_sglang_wheel.py .whl-0523/sglang-0.5.23-cp312-cp312-manylinux_2_34_x86_64.whl
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
import zipfile
from pathlib import Path

DROP = re.compile(r"^sglang/(multimodal_gen/|srt/rust_extensions/_(grpc|bench|multimodal)\.[^/]*\.so$)")


def slim(path: Path) -> tuple[int, int]:
    """Rewrite `path` in place without the DROP members; (bytes before, bytes after)."""
    before = path.stat().st_size
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        with zipfile.ZipFile(path) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
            for info in src.infolist():
                if not DROP.match(info.filename):
                    dst.writestr(info, src.read(info), compress_type=zipfile.ZIP_DEFLATED)
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return before, path.stat().st_size


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not argv[0].endswith(".whl"):
        print("usage: slim_sglang_wheel.py SGLANG_WHEEL", file=sys.stderr)
        return 2
    try:
        before, after = slim(Path(argv[0]))
    except (OSError, zipfile.BadZipFile) as exc:
        print(f"slim_sglang_wheel: {argv[0]}: {exc}", file=sys.stderr)
        return 1
    print(f"{argv[0]}: {before / 1e6:.1f} MB -> {after / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
