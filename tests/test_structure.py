"""The layout rules of DESIGN.md, checked on the source (ast): who may import whom.

* ``models/`` (RLModules, encoders) and ``envs/`` (simulator, envs) import nothing from
  ``cloudrl/``, not even lazily inside a function;
* ``models/`` holds RLModules and encoders only: no algorithm configs, algorithms or
  learners (those live in ``cloudrl/algorithms/<name>/``);
* the modules of ``cloudrl/`` import each other without cycles (a cycle means two
  modules that are one, or a callback into the caller); in particular the MLflow side of
  a sweep never imports the sweep;
* inside ``cloudrl/`` every import goes down the layer table (``LAYERS``, the one of
  DESIGN.md "Layers inside cloudrl/"): never up, and never sideways between two rooms of
  one layer (two pipelines, say), except among the small shared services. A module that
  belongs to no room fails too, so the table stays the map.
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


def imports_of(root: Path, package: str, target: str) -> list[str]:
    """``file:line name`` of every import of ``target`` in ``root/package`` (lazy too)."""
    bad = []
    for path in modules(root, package).values():
        for line, name in imported_names(root, path):
            if name == target or name.startswith(target + "."):
                bad.append(f"{path.relative_to(root)}:{line} {name}")
    return bad


def cloudrl_imports(root: Path, package: str) -> list[str]:
    """``file:line name`` of every import of ``cloudrl`` in ``root/package``."""
    return imports_of(root, package, "cloudrl")


# the entry points that start the decision service: the only modules of cloudrl/ that may
# import serve_apps/ (the service sits above the library; the library never reaches up)
SERVICE_ENTRY_POINTS = ("cloudrl/serve_cli.py", "cloudrl/deploy/serve_config.py",
                        "cloudrl/steer/canary.py")  # entry points that start the service


# Layers inside cloudrl/, bottom first: (layer, rooms, may its rooms import each other).
# A room is a module or package under cloudrl/ (the longest matching prefix wins).
# Beyond DESIGN.md's table: checkpoint_policy is part of algorithms/ (it reads a checkpoint
# through the algorithm table, and the hierarchy loads sub-agent checkpoints with it), so
# evaluate.py and recording.py, which run any policy a checkpoint included, sit just
# above algorithms/; the operator-feedback store sits just above the formats it writes;
# loop/ and labelling/ compose the alignment pipeline (retrain, reward-model uncertainty)
# and sit above the pipelines.
LAYERS: list[tuple[str, tuple[str, ...], bool]] = [
    ("shared services", ("cloudrl", "protocol", "metrics", "tracking", "replay",
                         "config_loader", "ray_utils", "threads", "callbacks", "connectors",
                         "env_runners", "policy", "quiet", "demo_report", "trace_import",
                         "signals", "argparsing", "parallel", "progress"), True),
    ("data", ("data", "serving"), False),  # serving: the decision service's wire format
    ("operator feedback", ("feedback",), False),
    ("policies", ("heuristics", "mpc", "lower_bound"), False),
    ("algorithms", ("algorithms",), False),
    ("evaluation", ("evaluate", "recording"), False),
    ("driver", ("training",), False),
    ("pipelines", ("headline", "alignment", "offline", "sweep", "compare", "scenarios"),
     False),
    # sites: real-data scenarios composed from the scenario runner and tuner
    ("composed pipelines", ("loop", "labelling", "sites"), False),
    # the steering loop drives the labelling app and the production loop's pieces
    ("operator loops", ("steer",), False),
    ("entry points", ("cli", "serve_cli", "signals_cli", "__main__", "deploy"), True),
]
# modules that belong to another room (a module and its helper)
SAME_ROOM = {"sweep_tracking": "sweep", "violation_floor": "lower_bound",
             "checkpoint_policy": "algorithms"}


def room_of(module: str, package: str = "cloudrl") -> str | None:
    """The room of a dotted module name: its first part below ``package``."""
    if module == package:
        return package
    parts = module.split(".")
    if parts[0] != package or len(parts) < 2:
        return None
    return SAME_ROOM.get(parts[1], parts[1])


def layer_violations(graph: dict[str, set[str]],
                     layers: list[tuple[str, tuple[str, ...], bool]] = LAYERS,
                     package: str = "cloudrl") -> list[str]:
    """``a -> b: why`` for every import that goes up or sideways, or leaves the table."""
    level, shared = {}, {}
    for i, (_, rooms, may_share) in enumerate(layers):
        for room in rooms:
            level[SAME_ROOM.get(room, room)] = i
            shared[SAME_ROOM.get(room, room)] = may_share
    bad = []
    for module in sorted(graph):
        src = room_of(module, package)
        if src not in level:
            bad.append(f"{module}: room {src!r} is in no layer (add it to LAYERS)")
            continue
        for dep in sorted(graph[module]):
            dst = room_of(dep, package)
            if dst == src or dst not in level:
                continue  # the same room; an unknown one is reported as a source
            if level[dst] > level[src]:
                bad.append(f"{module} -> {dep}: up from {layers[level[src]][0]} to "
                           f"{layers[level[dst]][0]}")
            elif level[dst] == level[src] and not shared[src]:
                bad.append(f"{module} -> {dep}: sideways inside {layers[level[src]][0]}")
    return bad


def test_models_and_envs_import_nothing_from_cloudrl() -> None:
    assert cloudrl_imports(ROOT, "models") == []
    assert cloudrl_imports(ROOT, "envs") == []


def test_envs_models_and_the_service_import_each_other_without_cycles() -> None:
    for package in ("envs", "models", "serve_apps"):
        assert cycles(import_graph(ROOT, package)) == [], package


def test_the_library_never_imports_the_service() -> None:
    """``serve_apps/`` imports ``cloudrl/``, never the reverse: the schemas and state the
    library shares with the service live in ``cloudrl/`` (only the entry point that starts
    the service imports it)."""
    found = [hit for hit in imports_of(ROOT, "cloudrl", "serve_apps")
             if not hit.startswith(SERVICE_ENTRY_POINTS)]
    assert found == []


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


def test_cloudrl_imports_only_go_down_the_layers() -> None:
    """Algorithms import no pipeline, the driver and the pipelines do not import each
    other, the feedback store reaches into no pipeline: every arrow goes down."""
    graph = import_graph(ROOT, "cloudrl")
    assert layer_violations(graph) == []
    algorithms = {d for m, deps in graph.items() if m.startswith("cloudrl.algorithms")
                  for d in deps}
    for upper in ("cloudrl.alignment", "cloudrl.offline", "cloudrl.headline",
                  "cloudrl.training"):
        assert not any(d == upper or d.startswith(upper + ".") for d in algorithms), upper
    assert not any(d.startswith("cloudrl.alignment") for d in graph["cloudrl.training"])
    assert not any(d.startswith("cloudrl.alignment") for d in graph["cloudrl.feedback"])


def test_the_layer_check_finds_upward_sideways_and_unmapped_imports(tmp_path: Path) -> None:
    """The checker itself, on a made-up package: an import up a layer, one sideways
    between two pipelines and a module in no room are each reported; a downward import
    and one inside a room are not."""
    app = tmp_path / "cloudrl"
    (app / "algorithms").mkdir(parents=True)
    for name in ("__init__.py", "algorithms/__init__.py", "protocol.py"):
        (app / name).write_text("")
    (app / "algorithms" / "a.py").write_text("from cloudrl.algorithms import b\n"
                                             "from cloudrl.protocol import SEEDS\n"
                                             "def f():\n    from cloudrl.headline import x\n")
    (app / "algorithms" / "b.py").write_text("")
    (app / "headline.py").write_text("import cloudrl.offline\n")
    (app / "offline.py").write_text("from cloudrl.algorithms.a import f\n")
    (app / "mystery.py").write_text("")
    bad = layer_violations(import_graph(tmp_path, "cloudrl"))
    assert bad == [
        "cloudrl.algorithms.a -> cloudrl.headline: up from algorithms to pipelines",
        "cloudrl.headline -> cloudrl.offline: sideways inside pipelines",
        "cloudrl.mystery: room 'mystery' is in no layer (add it to LAYERS)",
    ]


def test_experiments_are_split_by_role() -> None:
    """``experiments/`` holds benchmarks, configs and analyses, each in its own package
    (runnable as ``python -m experiments.<role>.<name>``), each script with a docstring."""
    exp = ROOT / "experiments"
    loose = sorted(p.name for p in exp.iterdir()
                   if p.is_file() and p.name != "__init__.py")
    assert loose == []
    assert {p.name for p in exp.iterdir() if p.is_dir() and p.name != "__pycache__"} == {
        "analyses", "benchmarks", "configs"}
    for role in ("analyses", "benchmarks"):
        assert (exp / role / "__init__.py").is_file()
        for script in (exp / role).glob("*.py"):
            assert ast.get_docstring(ast.parse(script.read_text())), script.name
    assert sorted(p.suffix for p in (exp / "configs").iterdir()) == [".yaml"] * len(
        list((exp / "configs").iterdir()))
    assert not list(exp.rglob("probe_*.py"))  # retired: docs/results/retired-probes.md


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
    (app / "c.py").write_text("import cloudrl.a\n"
                              "def serve():\n    from serve_apps.schemas import Request\n")
    assert cycles(import_graph(tmp_path, "cloudrl")) == [["cloudrl.a", "cloudrl.b"]]
    assert imports_of(tmp_path, "cloudrl", "serve_apps") == [
        "cloudrl/c.py:3 serve_apps.schemas.Request"]
    envs = tmp_path / "envs" / "scenario"  # a lazy import that closes a cycle in envs/
    envs.mkdir(parents=True)
    for name in ("../__init__.py", "__init__.py"):
        (envs / name).write_text("")
    (envs / "env.py").write_text("def make():\n    from envs.scenario.gated import G\n")
    (envs / "gated.py").write_text("from envs.scenario.env import make\n")
    assert cycles(import_graph(tmp_path, "envs")) == [
        ["envs.scenario.env", "envs.scenario.gated"]]
