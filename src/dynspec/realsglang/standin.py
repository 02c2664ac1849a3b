"""Stand-ins for native packages SGLang imports but a tiny model never needs.

A stand-in is a real folder on the server's PYTHONPATH (`site/<package>/`), named for one
package, never a catch-all.  Its module calls `populate(globals(), implemented)`: the names
in `implemented` are real code; every other name, and every submodule, still imports (SGLang
binds many names at import time) but is a `Missing` that raises NotImplementedError naming
itself when called.  Nothing returns a dummy value, so a path that needs the real package
fails loudly instead of computing something else.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types


class Missing:
    """A name the stand-in does not implement: importable, fails when used."""

    def __init__(self, qualname: str):
        self.__name__ = self.__qualname__ = qualname

    def __call__(self, *args, **kwargs):
        raise NotImplementedError(f"{self.__name__} belongs to a native package that dynspec only stands in "
                                  "for (dynspec/realsglang/site); it is not implemented")

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Missing(f"{self.__name__}.{attr}")

    def __repr__(self) -> str:
        return f"<stand-in: {self.__name__} (not implemented)>"


class _Submodules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """`package.<anything>` without a real file: a module of Missing names."""

    def __init__(self, package: str, real: set[str]):
        self.package, self.real = package, real

    def find_spec(self, name, path=None, target=None):
        if name.startswith(self.package + ".") and name not in self.real:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        populate(vars(module), {})
        return module

    def exec_module(self, module):
        pass


def populate(namespace: dict, implemented: dict, real_submodules: tuple[str, ...] = ()) -> None:
    """Make a stand-in module of `namespace` (a module's globals())."""
    name = namespace["__name__"]

    def __getattr__(attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        if attr in implemented:
            return implemented[attr]
        return Missing(f"{name}.{attr}")

    namespace["__getattr__"] = __getattr__
    if "." not in name:
        sys.meta_path.append(_Submodules(name, {f"{name}.{s}" for s in real_submodules}))
