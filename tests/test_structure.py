"""The layout rules of DESIGN.md, checked on the source (ast): who may import whom.

* ``models/`` (RLModules, encoders) and ``envs/`` (simulator, envs) import nothing from
  ``cloudrl/``, not even lazily inside a function;
* ``models/`` holds RLModules and encoders only: no algorithm configs, algorithms or
  learners (those live in ``cloudrl/algorithms/<name>/``);
* the modules of ``cloudrl/`` import each other without cycles (a cycle means two
  modules that are one, or a callback into the caller); in particular the MLflow side of
  a sweep never imports the sweep.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def modules(root: Path, package: str) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` under ``root/package``."""
    out = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def imported_names(root: Path, path: Path) -> list[tuple[int, str]]:
    """(line, dotted name) of every import in the file, at any depth (lazy ones too).

    ``from a.b import c`` yields ``a.b.c`` (which is the module ``a.b.c`` when there is
    one, else a name in ``a.b``); relative imports are resolved against the file.
    """
    tree = ast.parse(path.read_text(), filename=str(path))
    package = list(path.relative_to(root).parts[:-1])  # the package the file is in
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package[:len(package) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            out += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return out


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """Module -> the modules of ``package`` it imports (a name resolves to its module)."""
    mods = modules(root, package)
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        deps = set()
        for _, imported in imported_names(root, path):
            target = imported
            while target and target not in mods:
                target = target.rpartition(".")[0]
            if target and target != name:
                deps.add(target)
        graph[name] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def cloudrl_imports(root: Path, package: str) -> list[str]:
    """``file:line name`` of every import of ``cloudrl`` in ``root/package``."""
    bad = []
    for path in modules(root, package).values():
        for line, name in imported_names(root, path):
            if name == "cloudrl" or name.startswith("cloudrl."):
                bad.append(f"{path.relative_to(root)}:{line} {name}")
    return bad


def test_models_and_envs_import_nothing_from_cloudrl() -> None:
    assert cloudrl_imports(ROOT, "models") == []
    assert cloudrl_imports(ROOT, "envs") == []


def test_models_holds_rlmodules_and_encoders_only() -> None:
    """No AlgorithmConfig, Algorithm or Learner subclass in ``models/``."""
    found = []
    for path in modules(ROOT, "models").values():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = [ast.unparse(b).rpartition(".")[2] for b in node.bases]
                if any(b.endswith(("Config", "Learner")) or b in ("Algorithm", "DQN", "PPO")
                       for b in bases):
                    found.append(f"{path.relative_to(ROOT)}: {node.name}({', '.join(bases)})")
    assert found == []


def test_cloudrl_modules_import_each_other_without_cycles() -> None:
    graph = import_graph(ROOT, "cloudrl")
    assert "cloudrl.sweep" not in graph["cloudrl.sweep_tracking"]
    assert cycles(graph) == []


def test_the_checks_see_lazy_imports_and_cycles(tmp_path: Path) -> None:
    """The scanners themselves: a lazy import inside a method is found; a cycle through a
    ``TYPE_CHECKING`` import and a relative import is found."""
    pkg = tmp_path / "models"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "m.py").write_text("class A:\n    def f(self):\n        from cloudrl.x import y\n")
    assert cloudrl_imports(tmp_path, "models") == ["models/m.py:3 cloudrl.x.y"]
    app = tmp_path / "cloudrl"
    app.mkdir()
    (app / "__init__.py").write_text("")
    (app / "a.py").write_text("from .b import thing\n")
    (app / "b.py").write_text("from typing import TYPE_CHECKING\n"
                              "if TYPE_CHECKING:\n    from cloudrl.a import Other\n")
    (app / "c.py").write_text("import cloudrl.a\n")
    assert cycles(import_graph(tmp_path, "cloudrl")) == [["cloudrl.a", "cloudrl.b"]]
