"""The spillfs package imports module by module, with no import circle.

Run: .venv/bin/python -m pytest -q tests/python/test_imports.py

Two checks over every module under clients/python/spillfs:

- each one imports alone, in a fresh interpreter (an import that works only
  after another module happened to load first fails here); a module whose
  third-party dependency is missing (PyG for spillfs.pyg) skips, naming it;
- the graph of the package's imports at module level (what runs when a
  module loads: its body, class bodies, ``if``/``try`` blocks; not function
  bodies, which run after every module has loaded) has no cycle. A circle
  works or breaks by the order of the lines in it (gnn -> _sharded -> gnn
  needed an import at the bottom of gnn.py), so none is allowed.
"""

import ast
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SOURCE = os.path.join(ROOT, "clients", "python")
PACKAGE = "spillfs"


def _modules():
    """Module name -> (file, is_package) of every module of the package."""
    modules = {}
    top = os.path.join(SOURCE, PACKAGE)
    for folder, dirs, files in os.walk(top):
        dirs[:] = sorted(d for d in dirs if os.path.exists(os.path.join(folder, d, "__init__.py")))
        parts = os.path.relpath(folder, SOURCE).split(os.sep)
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            stem = name[:-3]
            is_package = stem == "__init__"
            modules[".".join(parts if is_package else parts + [stem])] = (os.path.join(folder, name), is_package)
    return modules


MODULES = _modules()


def _module_level_imports(tree):
    """The Import and ImportFrom nodes that run when the module loads."""
    found = []

    def visit(node):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                found.append(child)
            visit(child)

    visit(tree)
    return found


def _imported(module, node, is_package):
    """The package's modules one import node loads, by name."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[:len(base) - (node.level - 1)]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module
    # `from pkg import name` loads pkg.name when that is a module.
    return [target] + [f"{target}.{alias.name}" for alias in node.names if f"{target}.{alias.name}" in MODULES]


def _graph():
    """Module -> the package's modules it imports at module level. Loading a
    module loads the packages above it first, so an import counts its target
    and the target's packages, less the importer's own packages (which are
    loading already: Python hands back the module as far as it has run)."""
    graph = {}
    for module, (path, is_package) in MODULES.items():
        with open(path) as f:
            tree = ast.parse(f.read(), path)
        own = {".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 2)}
        edges = set()
        for node in _module_level_imports(tree):
            for target in _imported(module, node, is_package):
                parts = target.split(".")
                for i in range(1, len(parts) + 1):
                    name = ".".join(parts[:i])
                    if name in MODULES and name not in own:
                        edges.add(name)
        graph[module] = sorted(edges)
    return graph


def _find_cycle(graph):
    """One cycle of ``graph`` as a list of modules (first == last), or None."""
    WHITE, GREY, BLACK = 0, 1, 2
    colour = dict.fromkeys(graph, WHITE)
    stack = []

    def visit(node):
        colour[node] = GREY
        stack.append(node)
        for nxt in graph[node]:
            if colour[nxt] == GREY:
                return stack[stack.index(nxt):] + [nxt]
            if colour[nxt] == WHITE:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        stack.pop()
        colour[node] = BLACK
        return None

    for node in sorted(graph):
        if colour[node] == WHITE:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def test_the_walk_finds_the_package():
    assert {"spillfs", "spillfs.checkpoint", "spillfs.gnn", "spillfs.torch"} <= set(MODULES)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_module_imports_alone(module):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([SOURCE] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    done = subprocess.run([sys.executable, "-c", f"import {module}"], env=env, capture_output=True, text=True)
    if done.returncode == 0:
        return
    missing = re.search(r"ModuleNotFoundError: No module named '([^']+)'", done.stderr)
    if missing and missing.group(1).split(".")[0] != PACKAGE:
        pytest.skip(f"{module} needs {missing.group(1)}, not installed here")
    pytest.fail(f"import {module} alone failed:\n{done.stderr}")


def test_no_import_circle():
    cycle = _find_cycle(_graph())
    assert cycle is None, "the package imports in a circle: " + " -> ".join(cycle)


def test_the_circle_check_sees_a_circle():
    assert _find_cycle({"a": ["b"], "b": ["c"], "c": ["a"], "d": []}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": ["b"], "b": [], "c": ["a", "b"]}) is None
