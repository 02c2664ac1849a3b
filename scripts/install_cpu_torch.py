#!/usr/bin/env python3
"""Install torch's CPU build (what `make test` needs) on any Linux x86_64 machine.

    python scripts/install_cpu_torch.py 2.13.0

PyPI's torch wheel for Linux is the CUDA build, which pulls gigabytes of nvidia-* packages;
PyTorch's CPU index (https://download.pytorch.org/whl/cpu) serves `2.13.0+cpu` without them.
First pip is asked, without installing (--dry-run --report), what `torch==VERSION` would bring
from the indexes this machine is configured with: when that is a CPU build already (a local
wheel, a mirror of the CPU index) it is installed as is; when it would bring nvidia-* packages,
torch comes from the CPU index instead (TORCH_CPU_INDEX overrides its URL).  Nothing CUDA is
installed either way: if the CPU index cannot be reached, this fails and says so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

CPU_INDEX = os.environ.get("TORCH_CPU_INDEX", "https://download.pytorch.org/whl/cpu")


def would_install(spec: str) -> list[str]:
    """The distributions `pip install spec` would install here (names, lowercase)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--dry-run", "--ignore-installed",
                        "--report", str(report), spec], check=True)
        data = json.loads(report.read_text())
    return [item["metadata"]["name"].lower() for item in data.get("install", [])]


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: install_cpu_torch.py TORCH_VERSION", file=sys.stderr)
        return 2
    version = argv[0]
    try:
        names = would_install(f"torch=={version}")
    except subprocess.CalledProcessError:
        names = ["nvidia-unknown"]  # cannot tell: take the CPU index
    if not any(n.startswith("nvidia-") for n in names):
        print(f"torch=={version}: the configured indexes give a CPU build; installing it")
        argv = [sys.executable, "-m", "pip", "install", "--quiet", f"torch=={version}"]
    else:
        print(f"torch=={version}: the configured indexes give the CUDA build; taking {version}+cpu from {CPU_INDEX}")
        argv = [sys.executable, "-m", "pip", "install", "--quiet", "--index-url", CPU_INDEX, f"torch=={version}+cpu"]
    r = subprocess.run(argv)
    if r.returncode != 0:
        print(f"install_cpu_torch: could not install torch {version} without CUDA ({' '.join(argv[3:])}); "
              f"set TORCH_CPU_INDEX to a reachable mirror of {CPU_INDEX}", file=sys.stderr)
    return r.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
