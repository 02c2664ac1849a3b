"""What machine a run ran on: GPUs, driver, CUDA, and the versions of the serving stack.

Everything is looked up without importing heavy packages where possible (package
metadata for versions), and every absence is said plainly rather than left out.
"""

from __future__ import annotations

import os
import platform
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterable
from importlib import metadata

PACKAGES = ("torch", "sglang", "sgl-kernel", "flashinfer-python", "flashinfer", "triton", "transformers",
            "vllm", "dynspec")


def _run(argv: list[str], timeout: float = 20.0) -> str | None:
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout if r.returncode == 0 else None


def package_versions(names: Iterable[str] = PACKAGES) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def gpu_info() -> dict:
    """GPUs from nvidia-smi, with the driver, CUDA version and interconnect topology."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return {"available": False, "note": "no GPU: nvidia-smi not found on this machine"}
    q = _run([smi, "--query-gpu=index,name,memory.total,driver_version,pci.bus_id",
              "--format=csv,noheader,nounits"])
    if q is None:
        return {"available": False, "note": "no GPU: nvidia-smi found but it failed (no driver or no device)"}
    gpus = []
    for line in q.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 5:
            gpus.append({"index": int(parts[0]), "name": parts[1], "memory_mib": float(parts[2]),
                         "driver": parts[3], "pci_bus_id": parts[4]})
    header = _run([smi]) or ""
    cuda = None
    for token in header.split("CUDA Version:")[1:2]:
        cuda = token.split()[0].strip("|") if token.split() else None
    return {
        "available": bool(gpus),
        "count": len(gpus),
        "gpus": gpus,
        "driver": gpus[0]["driver"] if gpus else None,
        "cuda_driver_version": cuda,
        "topology": _run([smi, "topo", "-m"]),
        **({} if gpus else {"note": "no GPU: nvidia-smi lists none"}),
    }


def gpu_names(timeout: float = 5.0) -> list[str] | None:
    """The GPUs' names from one short nvidia-smi query: [] without nvidia-smi, None when it fails."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    out = _run([smi, "--query-gpu=name", "--format=csv,noheader"], timeout=timeout)
    return None if out is None else [line.strip() for line in out.splitlines() if line.strip()]


def machine() -> dict:
    """This host in a few cheap facts: no subprocess, no import of torch."""
    return {
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "cpu_count": os.cpu_count(),
    }


def torch_cuda() -> dict:
    """torch's CUDA build, asked in a subprocess (importing torch here would cost seconds and memory)."""
    if package_versions(["torch"])["torch"] is None:
        return {"torch": None}
    code = ("import json, torch; print(json.dumps({'torch_cuda': torch.version.cuda, "
            "'cuda_available': torch.cuda.is_available(), 'device_count': torch.cuda.device_count()}))")
    out = _run([sys.executable, "-c", code], timeout=60)
    if out is None:
        return {"torch_cuda": None, "note": "importing torch failed"}
    import json

    try:
        return json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"torch_cuda": None, "note": "could not read torch's answer"}


def nvcc_version() -> str | None:
    nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)
    if nvcc is None:
        return None
    out = _run([nvcc, "--version"])
    if not out:
        return None
    for line in out.splitlines():
        if "release" in line:
            return line.split("release", 1)[1].split(",")[0].strip()
    return None


def sglang_check_env(python: str | None = None, timeout: float = 120.0) -> str:
    """What `python -m sglang.check_env` prints (SGLang's own record: CUDA, GPUs, compute
    capability, every serving package's version, topology), or one line saying why there is none."""
    from importlib.util import find_spec

    python = python or sys.executable
    if python == sys.executable and find_spec("sglang") is None:
        return "sglang is not installed in this environment: no sglang.check_env"
    try:
        r = subprocess.run([python, "-m", "sglang.check_env"], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"python -m sglang.check_env did not finish within {timeout:g}s"
    except OSError as exc:
        return f"python -m sglang.check_env could not start: {exc.strerror or exc}"
    out = r.stdout.strip()
    if r.returncode != 0:
        tail = " | ".join(r.stderr.strip().splitlines()[-2:])
        return f"python -m sglang.check_env exited with code {r.returncode}: {tail[:400]}" + (f"\n{out}" if out else "")
    return out


def collect_environment(*, probe_torch: bool = True, check_env: bool = False) -> dict:
    """A JSON-ready description of this machine and its serving stack."""
    return {
        **machine(),
        "gpu": gpu_info(),
        "nvcc": nvcc_version(),
        "packages": package_versions(),
        "torch_cuda": torch_cuda() if probe_torch else None,
        "env": {k: v for k, v in os.environ.items()
                if k.startswith(("SGLANG_", "DYNSPEC_", "NCCL_", "CUDA_VISIBLE", "FLASHINFER_"))},
        # SGLang's own record beside dynspec's (check_env=True: live runs and 00_environment)
        "sglang_check_env": sglang_check_env() if check_env else None,
    }
