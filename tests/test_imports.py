"""Data flows one way: no module of dynspec imports, even lazily inside a function, a module that
imports it back.  Read from the source, so a cycle is found before anything runs it.

And each subpackage keeps its own dependency rule: dynspec.policy is standard
library only (nothing of dynspec outside it), the SGLang hook adds only dynspec.policy, the simulator never reaches the live or
analysis code, the live code never reaches the analysis, and only dynspec.calibrate imports torch
when it is imported."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "dynspec"


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, known: set[str]) -> set[str]:
    """The dynspec modules a file imports, at any depth of its code."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        out |= {n for n in names if n in known}
    return out


def graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in SRC.rglob("*.py")}
    known = set(files)
    return {m: imports_of(p, known) - {m, "dynspec"} for m, p in files.items()}


def reachable(g: dict[str, set[str]], start: str) -> set[str]:
    """Every module start imports, directly or through others."""
    seen, todo = set(), [start]
    while todo:
        for w in g[todo.pop()] - seen:
            seen.add(w)
            todo.append(w)
    return seen


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    g = graph()
    assert "dynspec.sim.engine" in g and "dynspec.sim.acceptance" in g["dynspec.sim.engine"]  # the scan sees imports
    assert cycles(g) == []


def test_the_check_finds_a_cycle_when_there_is_one():
    g = graph()
    g["dynspec.sim.fit"] = g["dynspec.sim.fit"] | {"dynspec.analysis.fit_cli"}  # fit_cli (and run_fit) import fit: a cycle
    assert cycles(g) == [["dynspec.analysis.fit_cli", "dynspec.analysis.run_fit", "dynspec.sim.fit"]]


def test_reports_only_read_runs_and_readers_start_no_servers():
    """A report reads run folders and never runs a sweep; reading saved results never needs the
    module that starts server processes."""
    g = graph()
    assert "dynspec.live.servers" in reachable(g, "dynspec.live.sweep")  # the walk follows imports (sweep's are lazy)
    assert "dynspec.live.sweep" not in reachable(g, "dynspec.analysis.report")
    assert "dynspec.live.servers" not in reachable(g, "dynspec.live.readers")


# --- the subpackages' dependency rules --------------------------------------------------------

# Folders of realsglang that a real SGLang process puts on its path as top-level packages
# (stand-ins for sgl_kernel, torchvision, flashinfer): not dynspec modules.
OVERLAYS = ("site", "site-cpu", "site-gpu", "site-0.5.23")


def in_package(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def modules_of(package: str) -> list[str]:
    out = sorted(m for m in graph() if in_package(m, package))
    assert out, package  # the scan sees the package
    return out


def module_level_imports(path: Path) -> set[str]:
    """Every module a file imports when it is imported: its statements outside functions, and
    outside `if TYPE_CHECKING:` blocks (dynspec or not, as written: "numpy", "dynspec.policy")."""
    out: set[str] = set()

    def walk(nodes):
        for node in nodes:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
                walk(node.orelse)
                continue
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                out.add(node.module)
            elif isinstance(node, ast.Import):
                out.update(a.name for a in node.names)
            walk(ast.iter_child_nodes(node))

    walk(ast.parse(path.read_text()).body)
    return out


def all_imports(path: Path) -> set[str]:
    """Every module a file imports at any depth of its code (lazily inside functions too)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return out


def path_of(module: str) -> Path:
    files = {module_name(p): p for p in SRC.rglob("*.py")}
    return files[module]


def third_party(names: set[str]) -> set[str]:
    roots = {n.split(".")[0] for n in names}
    return {r for r in roots if r not in sys.stdlib_module_names and r != "dynspec"}


def loaded_after_import(*modules: str) -> set[str]:
    """The top-level packages in sys.modules after a fresh interpreter imports `modules`."""
    code = f"import sys; import {', '.join(modules)}; print(' '.join(sorted({{m.split('.')[0] for m in sys.modules}})))"
    env_path = str(SRC.parent)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin"})
    return set(out.stdout.split())


HEAVY = {"numpy", "pandas", "pyarrow", "pydantic", "yaml", "torch"}


def dynspec_imports(source: str, module: str) -> set[str]:
    """The dynspec modules a source imports at any depth of its code, relative imports resolved
    against `module` (the module's dotted name)."""
    out: set[str] = set()
    package = module.split(".")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level] if node.level else []
            name = ".".join(base + ([node.module] if node.module else []))
            out |= {name} | {f"{name}.{a.name}" for a in node.names} if name else set()
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return {n for n in out if n.split(".")[0] == "dynspec"}


def test_policy_imports_only_the_standard_library():
    """dynspec.policy runs inside SGLang: the standard library only, and nothing of dynspec outside
    it, not even lazily (a profile named in a spec is loaded by the caller's load_profile)."""
    for m in modules_of("dynspec.policy"):
        path = path_of(m)
        assert third_party(all_imports(path)) == set(), m
        name = m + ".__init__" if path.name == "__init__.py" else m  # a package resolves relative imports in itself
        outside = {n for n in dynspec_imports(path.read_text(), name) if not in_package(n, "dynspec.policy")}
        assert outside == set(), (m, outside)
    assert not HEAVY & loaded_after_import("dynspec.policy", "dynspec.policy_cli")


def test_the_policy_check_sees_any_dynspec_import():
    lazy = "def f():\n    from dynspec.sim.profile import load_profile\n"
    assert dynspec_imports(lazy, "dynspec.policy.spec") == {"dynspec.sim.profile", "dynspec.sim.profile.load_profile"}
    assert dynspec_imports("import dynspec.roles\n", "dynspec.policy") == {"dynspec.roles"}
    assert dynspec_imports("from ..sim import run\n", "dynspec.policy.spec") == {"dynspec.sim", "dynspec.sim.run"}
    assert dynspec_imports("from . import base\nimport math\n", "dynspec.policy.spec") == \
        {"dynspec.policy", "dynspec.policy.base"}


# Imports every module of dynspec.policy with a guard on the import system that records every
# dynspec module loaded, then prints those outside dynspec.policy.
GUARD = """
import importlib, sys
loaded = []
class Guard:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] == 'dynspec':
            loaded.append(name)
        return None
sys.meta_path.insert(0, Guard())
for m in sys.argv[1:]:
    importlib.import_module(m)
print(' '.join(n for n in loaded if n != 'dynspec' and n != 'dynspec.policy' and not n.startswith('dynspec.policy.')))
"""


def test_importing_the_policy_package_loads_nothing_else_of_dynspec():
    modules = modules_of("dynspec.policy")
    assert "dynspec.policy.goodput.decision" in modules  # the scan sees the sub-package
    out = subprocess.run([sys.executable, "-c", GUARD, *modules], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(SRC.parent), "PATH": "/usr/bin:/bin"})
    assert out.stdout.split() == []
    # the guard sees what an import loads
    out = subprocess.run([sys.executable, "-c", GUARD, "dynspec.policy", "dynspec.roles"], capture_output=True,
                         text=True, check=True, env={"PYTHONPATH": str(SRC.parent), "PATH": "/usr/bin:/bin"})
    assert "dynspec.roles" in out.stdout.split()


def test_the_sglang_runtime_path_imports_only_the_standard_library_and_policy():
    """A patched SGLang imports dynspec.sglang.hook (and the modules it imports) and
    dynspec.sglang.adaptive: when imported they load the standard library and dynspec.policy only,
    so neither numpy nor pandas nor pyarrow unless a profile is used."""
    helpers = ["dynspec.sglang.tp_agreement", "dynspec.sglang.step_trace", "dynspec.sglang.metrics",
               "dynspec.sglang.policy_control"]
    runtime = ["dynspec.sglang", "dynspec.sglang.hook", "dynspec.sglang.adaptive", *helpers]
    allowed = ("dynspec.policy", "dynspec.sglang.hook", "dynspec.sglang.adaptive", "dynspec.sglang", *helpers)
    for m in runtime:
        names = module_level_imports(path_of(m))
        assert third_party(names) == set(), m
        dyn = {n for n in names if n.split(".")[0] == "dynspec"}
        assert all(n in allowed or n.startswith("dynspec.policy.") for n in dyn), (m, dyn)
    # What a function imports lazily: Prometheus only with --enable-metrics, a profile only when named.
    assert third_party(all_imports(path_of("dynspec.sglang.metrics"))) == {"prometheus_client"}
    for m in ["dynspec.sglang.hook", "dynspec.sglang.tp_agreement", "dynspec.sglang.step_trace"]:
        assert third_party(all_imports(path_of(m))) == set(), m
    loaded = loaded_after_import("dynspec.sglang.hook")
    assert "dynspec" in loaded and not {"numpy", "pandas", "pyarrow"} & loaded
    assert not HEAVY & loaded_after_import("dynspec.sglang.hook", "dynspec.sglang.adaptive")


def test_the_patches_import_dynspec_by_its_current_paths():
    """Every `from dynspec... import` line a patch adds names a module that exists."""
    import importlib.util

    patches = sorted((Path(__file__).resolve().parents[1] / "src/dynspec/sglang/patches").glob("*/*.patch"))
    added = [line[1:] for p in patches for line in p.read_text().splitlines() if line.startswith("+")]
    modules = {ln.split()[1] for ln in added if ln.strip().startswith("from dynspec")}
    assert modules, "the patches import dynspec somewhere"
    assert all(importlib.util.find_spec(m) is not None for m in modules), modules


def test_the_simulator_never_reaches_live_or_analysis():
    """Nothing under dynspec.sim imports, directly, lazily or through another module, a module of
    dynspec.live (processes, HTTP) or dynspec.analysis (pandas, the report)."""
    g = graph()
    assert "dynspec.sim.profile" in reachable(g, "dynspec.sim.run")  # the walk follows imports
    for m in modules_of("dynspec.sim"):
        bad = {w for w in reachable(g, m) if in_package(w, "dynspec.live") or in_package(w, "dynspec.analysis")}
        assert bad == set(), (m, bad)


def test_live_never_reaches_analysis():
    g = graph()
    assert "dynspec.sim.run" in reachable(g, "dynspec.live.sweep")  # live may use the simulator
    for m in modules_of("dynspec.live"):
        bad = {w for w in reachable(g, m) if in_package(w, "dynspec.analysis")}
        assert bad == set(), (m, bad)


def test_only_calibrate_imports_torch_when_imported():
    """torch is imported at module level only under dynspec.calibrate (random_model); elsewhere only
    inside the functions that need it, so `dynspec --help` and the simulator never load it."""
    torch_at_import = set()
    for p in SRC.rglob("*.py"):
        if p.relative_to(SRC).parts[:2] in {("realsglang", o) for o in OVERLAYS}:
            continue  # stand-in packages a real SGLang (with torch) imports, not dynspec modules
        if any(n == "torch" or n.startswith("torch.") for n in module_level_imports(p)):
            torch_at_import.add(module_name(p))
    assert "dynspec.calibrate.random_model" in torch_at_import  # the scan sees a module-level import
    assert all(in_package(m, "dynspec.calibrate") for m in torch_at_import), torch_at_import
