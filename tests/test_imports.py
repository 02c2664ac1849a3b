"""Data flows one way: no module of dynspec imports, even lazily inside a function, a module that
imports it back (issue 18).  Read from the source, so a cycle is found before anything runs it."""

from __future__ import annotations

import ast
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
    assert "dynspec.engine" in g and "dynspec.acceptance" in g["dynspec.engine"]  # the scan sees imports
    assert cycles(g) == []


def test_the_check_finds_a_cycle_when_there_is_one():
    g = graph()
    g["dynspec.fit"] = g["dynspec.fit"] | {"dynspec.fit_cli"}  # fit_cli (and run_fit) import fit: a cycle
    assert cycles(g) == [["dynspec.fit", "dynspec.fit_cli", "dynspec.run_fit"]]


def test_reports_only_read_runs_and_readers_start_no_servers():
    """A report reads run folders and never runs a sweep; reading saved results never needs the
    module that starts server processes (issue 18, item 4)."""
    g = graph()
    assert "dynspec.servers" in reachable(g, "dynspec.sweep")  # the walk follows imports (sweep's are lazy)
    assert "dynspec.sweep" not in reachable(g, "dynspec.report")
    assert "dynspec.servers" not in reachable(g, "dynspec.readers")
