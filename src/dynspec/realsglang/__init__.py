"""The real SGLang server (0.5.9 or 0.5.23), unpatched or patched by dynspec, without its native kernels.

SGLang's `python -m sglang.launch_server` is pure Python over torch plus native kernel
packages (sgl_kernel, flashinfer) that exist only for CUDA and one torch version.  This
package runs the real server anyway, on a CPU (tests, CI) or on a GPU with another torch:

* `sglang_site(patched)`: the 0.5.9 wheel unpacked into a cache folder (never installed),
  and a second copy patched by `dynspec patch apply`;
* `site/`: put first on the server's PYTHONPATH: `sgl_kernel` (a stand-in whose three
  implemented ops are torch, every other entry raises naming itself) and a sitecustomize
  that installs `compat` (the few patches SGLang needs to run EAGLE-3 there, each with
  its reason) in every process of the server;
* `server_env`, `server_argv`: how to start an arm; `tinymodels`: models to serve.

SGLang 0.5.23 (`version="0.5.23"`) has its own stand-in folder, `site-0.5.23/` (sgl_kernel as
sglang-kernel 0.4.10: the CPU index ops of its speculative path in torch), its own compatibility
patches (`compat_0523`; on a GPU its layers take their torch bodies through upstream's
SGLANG_FORCE_FUSED_OP_BACKEND), and its own dependencies (transformers 5, which
cannot share a process with 0.5.9's 4.57): requirements/sglang-0.5.23-cpu.txt, installed by
`make test-venv` into .venv/sglang-0.5.23-deps (or $DYNSPEC_SGLANG_0523_DEPS), first on the
server's PYTHONPATH after the stand-ins.

No other package is stood in for: an absent one raises ImportError as usual.
`python -m dynspec.realsglang --help` does the same from a shell (used by sweep configs).
"""

from __future__ import annotations

import compileall
import hashlib
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

VERSION = "0.5.9"  # the default
VERSIONS = ("0.5.9", "0.5.23")
SITE = Path(__file__).parent / "site"
SITE_0523 = Path(__file__).parent / "site-0.5.23"  # sgl_kernel as 0.5.23 imports it, and its sitecustomize
# torchvision: a stand-in only where the real one cannot load (the CPU torch build).
SITE_CPU = Path(__file__).parent / "site-cpu"
# flashinfer: imported at module level on CUDA only; its stand-in only there.
SITE_GPU = Path(__file__).parent / "site-gpu"

# CPU: the torch-native attention and sampling backends, no CUDA graphs, float32, and a
# KV pool sized in tokens (by default SGLang sizes it to a share of all free CPU memory).
# An idle scheduler (0.5.9's and 0.5.23's) polls its sockets without sleeping: servers sharing a
# few cores would starve the one at work, so on a CPU they sleep until a request comes.
CPU_ARGS = ["--device", "cpu", "--attention-backend", "torch_native", "--sampling-backend", "pytorch",
            "--disable-cuda-graph", "--dtype", "float32", "--max-total-tokens", "8192",
            "--max-running-requests", "8", "--sleep-on-idle"]
# GPU without flashinfer: Triton attention (its draft-extend is CUDA-graphed in 0.5.9).
GPU_ARGS = ["--attention-backend", "triton", "--sampling-backend", "pytorch"]
COMMON_ARGS = ["--grammar-backend", "none", "--random-seed", "0", "--skip-server-warmup"]


def _check_version(version: str) -> None:
    if version not in VERSIONS:
        raise ValueError(f"dynspec.realsglang serves SGLang {' or '.join(VERSIONS)}, not {version!r}")


def deps_0523() -> Path:
    """Where 0.5.23's own dependencies are installed (requirements/sglang-0.5.23-cpu.txt)."""
    return Path(os.environ.get("DYNSPEC_SGLANG_0523_DEPS", Path(sys.prefix) / "sglang-0.5.23-deps"))


def spec_args(draft: str | Path, steps: int = 3, draft_tokens: int = 4) -> list[str]:
    """EAGLE-3 on spec v2 (the worker dynspec patches): topk 1, a chain of `steps` drafts."""
    return ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", str(draft),
            "--speculative-num-steps", str(steps), "--speculative-eagle-topk", "1",
            "--speculative-num-draft-tokens", str(draft_tokens)]


def cache_root() -> Path:
    return Path(os.environ.get("DYNSPEC_SGLANG_CACHE", "~/.cache/dynspec/sglang")).expanduser()


def _patch_digest(version: str = VERSION) -> str:
    """A digest of the shipped patch set, so a changed patch gets a fresh patched copy."""
    from dynspec.sglang.patching import patches_root

    h = hashlib.sha256()
    for f in sorted((patches_root() / f"sglang-{version}").iterdir()):
        h.update(f.name.encode() + f.read_bytes())
    return h.hexdigest()[:12]


def sglang_site(patched: bool, root: Path | None = None, version: str = VERSION) -> Path:
    """A folder holding sglang `version` (upstream, or patched by dynspec) to put on PYTHONPATH."""
    from dynspec.sglang import patching
    from dynspec.realsglang import wheels

    _check_version(version)
    root = root or cache_root()
    name = f"{version}-patched-{_patch_digest(version)}" if patched else f"{version}-upstream"
    dest = root / name
    if (dest / ".complete").exists():
        if not (dest / ".compiled").exists():  # unpacked before copies were byte-compiled
            _compile(dest, dest)
            (dest / ".compiled").write_text("")
        return dest
    tmp = root / f".{name}.{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    wheels.unpack(version, tmp)
    if patched:
        out = patching.do_apply(patching.find_sglang(tmp))
        if out.code != 0:
            raise RuntimeError(f"dynspec patch apply failed on the unpacked wheel: {out.message}")
    _compile(tmp, dest)
    (tmp / ".compiled").write_text("")
    (tmp / ".complete").write_text("")
    try:
        tmp.rename(dest)
    except OSError:  # another process made it first
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def _compile(tree: Path, final: Path) -> None:
    """Byte-compile an unpacked SGLang once, as pip does on install: every process of every server
    otherwise compiles its few hundred modules again, and a Python run with PYTHONDONTWRITEBYTECODE
    (as some CI images set) never keeps what it compiled.  Paths in tracebacks name `final`.  A file
    this Python cannot compile is left as source: importing it would fail the same way."""
    compileall.compile_dir(tree, ddir=str(final), quiet=2, workers=0)


def server_env(site: Path, *, gpu: bool = False, base: dict | None = None,
               version: str = VERSION) -> dict[str, str]:
    """The environment of a server process: stand-ins first, then the chosen sglang copy."""
    _check_version(version)
    env = dict(os.environ if base is None else base)
    if version == "0.5.23":
        # 0.5.23 imports no flashinfer at module level, so a GPU needs no stand-in for it.
        sites = [SITE_0523, deps_0523()] if gpu else [SITE_0523, SITE_CPU, deps_0523()]
        # Only the tiny models' classes are registered (site-0.5.23/dynspec_models), not all of SGLang's.
        env.setdefault("SGLANG_EXTERNAL_MODEL_PACKAGE", "dynspec_models")
        if gpu:  # the layers' CUDA bodies are the kernel package's: upstream's switch to their torch bodies
            env["SGLANG_FORCE_FUSED_OP_BACKEND"] = "torch"
    else:
        sites = [SITE, SITE_GPU] if gpu else [SITE, SITE_CPU]
    path = [*map(str, sites), str(site)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(path)
    env["SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK"] = "1"  # the stand-in is not sgl-kernel 0.3.21
    if gpu:
        env["SGLANG_IS_FLASHINFER_AVAILABLE"] = "false"
    else:
        env["SGLANG_USE_CPU_ENGINE"] = "1"  # SGLang's CPU device path
        # Several servers share a small machine: one compute thread each, and glibc's
        # per-thread malloc arenas capped (they grew a scheduler to 3 GB here).
        env.setdefault("OMP_NUM_THREADS", "1")
        env.setdefault("MALLOC_ARENA_MAX", "2")
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def server_argv(model: str | Path, port: int, *, host: str = "127.0.0.1", draft: str | Path | None = None,
                gpu: bool = False, extra: Sequence[str] = (), version: str = VERSION) -> list[str]:
    """`python -m sglang.launch_server ...` for a tiny model on this machine."""
    argv = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(model),
            "--host", host, "--port", str(port)]
    argv += GPU_ARGS if gpu else CPU_ARGS
    argv += COMMON_ARGS
    if draft is not None:
        argv += spec_args(draft)
    return argv + list(extra)
