"""Stand-ins for SGLang's native GPU kernel packages, for importing SGLang on a CPU.

Why this exists: SGLang 0.5.9 imports sgl_kernel, flashinfer, deep_gemm, flash_mla and
torch_memory_saver (CUDA extension modules) and torchvision at module level.  None can
load on a machine without a GPU (and PyPI's torchvision would drag in a multi-GB CUDA
torch), so the patch tests put these permissive stubs in front of them.  Every attribute
of a stub is a dummy that can be called, subclassed or used as a decorator; calling a
stubbed kernel at run time raises, so a test can never pass by silently "running" one.
Only these packages are stubbed: torch, triton and SGLang's own Python are real.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

STUBBED = ("sgl_kernel", "flashinfer", "deep_gemm", "flash_mla", "torch_memory_saver", "torchvision")


class StubKernelCalled(RuntimeError):
    """A stubbed native kernel was called: the code under test left the CPU-safe path."""


class _Dummy:
    """Any attribute, any call signature at import time; calling it raises."""

    def __init__(self, name: str):
        self.__name__ = self.__qualname__ = name.rsplit(".", 1)[-1]
        self._name = name
        self.__doc__ = f"stub for {name}"

    def __getattr__(self, item: str):
        if item.startswith("__") and item.endswith("__"):
            raise AttributeError(item)
        return _Dummy(f"{self._name}.{item}")

    def __call__(self, *args, **kwargs):
        # Used as a bare decorator at import time: @stub.jit def f(...)
        if len(args) == 1 and not kwargs and callable(args[0]) and not isinstance(args[0], _Dummy):
            return args[0]
        raise StubKernelCalled(f"stubbed native kernel {self._name} was called")

    def __mro_entries__(self, bases):
        return (type(self.__name__, (), {"__doc__": f"stub base {self._name}"}),)

    def __repr__(self) -> str:
        return f"<stub {self._name}>"


class _StubModule(types.ModuleType):
    def __getattr__(self, item: str):
        if item.startswith("__") and item.endswith("__"):
            raise AttributeError(item)
        return _Dummy(f"{self.__name__}.{item}")


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".", 1)[0] in STUBBED:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        mod = _StubModule(spec.name)
        mod.__path__ = []  # a package, so submodules import too
        mod.__version__ = "0.0.0+stub"
        mod.__dynspec_stub__ = True
        return mod

    def exec_module(self, module):
        pass


_FINDER = _StubFinder()


def install() -> None:
    """Put the stubs in front of the real import system (idempotent)."""
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


def uninstall() -> None:
    """Remove the stubs again (the modules they created are the caller's to drop)."""
    while _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)
