"""The GPU node's environment files resolve (scripts/check_env_pins.py), `make test`'s torch is a
CPU build (scripts/install_cpu_torch.py), and SGLang's check_env is captured beside dynspec's record."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("env_file", ["environment.yml", "environment-sm120.yml"])
def test_environment_pins_resolve_together(env_file):
    p = subprocess.run([sys.executable, "scripts/check_env_pins.py", env_file], cwd=ROOT, capture_output=True,
                       text=True, timeout=900)
    out = (p.stdout + p.stderr).strip()
    if p.returncode == 3:  # an index the file needs is unreachable here, or uv is missing: said in one line
        pytest.skip(out.splitlines()[-1])
    assert p.returncode == 0 and out.startswith(f"OK {env_file}: "), out


def test_the_sm120_file_pins_one_cuda_for_torch_and_sgl_kernel():
    import yaml

    deps = yaml.safe_load((ROOT / "environment-sm120.yml").read_text())["dependencies"]
    pip = next(d["pip"] for d in deps if isinstance(d, dict))
    local = {line.split("==")[0]: line.split("+")[1] for line in pip if "==" in line and "+" in line}
    assert local == {"torch": "cu130", "torchaudio": "cu130", "sgl-kernel": "cu130"}
    assert "--extra-index-url https://download.pytorch.org/whl/cu130" in pip


def test_the_test_environment_holds_no_cuda_package():
    import importlib.util

    names = sorted({(d.metadata["Name"] or "").lower() for d in metadata.distributions()})
    assert not [n for n in names if n.startswith("nvidia-")], "make test installed CUDA packages"
    if importlib.util.find_spec("torch") is not None:
        assert "+cpu" in metadata.version("torch") or subprocess.run(
            [sys.executable, "-c", "import torch, sys; sys.exit(torch.version.cuda is not None)"]).returncode == 0


def test_install_cpu_torch_sees_what_the_indexes_would_bring():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import install_cpu_torch
    finally:
        sys.path.pop(0)
    version = metadata.version("torch").split("+")[0]
    names = install_cpu_torch.would_install(f"torch=={version}")  # a dry run: nothing installed
    assert "torch" in names and not any(n.startswith("nvidia-") for n in names)


def test_sglang_check_env_is_captured_or_says_why_not(tmp_path):
    from dynspec.environment import collect_environment, sglang_check_env

    fake = tmp_path / "python"  # an interpreter whose sglang.check_env prints a record
    fake.write_text("#!/bin/sh\necho 'Python: 3.11'\necho 'CUDA available: True'\necho 'sglang: 0.5.9'\n")
    fake.chmod(0o755)
    assert sglang_check_env(str(fake)) == "Python: 3.11\nCUDA available: True\nsglang: 0.5.9"
    broken = tmp_path / "broken"
    broken.write_text("#!/bin/sh\necho 'ModuleNotFoundError: No module named sglang' >&2\nexit 1\n")
    broken.chmod(0o755)
    assert sglang_check_env(str(broken)).startswith("python -m sglang.check_env exited with code 1: ModuleNotFound")
    env = collect_environment(probe_torch=False, check_env=True)
    assert env["sglang_check_env"]  # this machine has no sglang installed: one line saying so
