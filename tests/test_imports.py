"""The package's import graph: no cycles, dependencies one way, and a light `import gpufill`.

Every import statement counts, at module level, inside functions and under TYPE_CHECKING:
a cycle through a function-level import is still two modules that need each other.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import gpufill

PACKAGE = Path(gpufill.__file__).parent
ROOT = PACKAGE.parent

# What each layer may import besides itself (DESIGN.md: cli -> campaign -> forecasting -> engine;
# monitor, doctor, bench and report sit beside them). gpufill.errors, gpufill.files (every file written
# without following a link), gpufill.cpus and gpufill.gpus (the cores and GPUs a process may use, without torch),
# gpufill.lazy (a package's names loaded on first use) and gpufill.user_code (loading `package.module:name`) are
# shared leaves; the engine needs only the first three and lazy.
SHARED = {"gpufill.errors", "gpufill.files", "gpufill.cpus", "gpufill.gpus", "gpufill.lazy", "gpufill.user_code", "gpufill.mlflow_uri"}
ALLOWED = {
    "gpufill.engine": {"gpufill.errors", "gpufill.files", "gpufill.cpus", "gpufill.lazy", "gpufill.mlflow_uri"},
    "gpufill.forecasting": {*SHARED, "gpufill.engine"},
    "gpufill.campaign": {*SHARED, "gpufill", "gpufill.engine", "gpufill.forecasting", "gpufill.monitor"},
    "gpufill.monitor": {*SHARED, "gpufill.engine"},
    # An export to MLflow reads the store and writes the report: above both, below the cli; the campaign starts it by
    # its command line, never by import.
    "gpufill.tracking": {*SHARED, "gpufill.campaign", "gpufill.report", "gpufill.forecasting", "gpufill.engine"},
}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def imports_of(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("gpufill"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("gpufill") and node.level == 0:
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                found.add(candidate if is_module(candidate) else node.module)
    return {name for name in found if is_module(name)}


def graph() -> dict[str, set[str]]:
    modules = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    return {name: imports_of(path) - {name} for name, path in modules.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in edges.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_the_graph_is_read_from_every_module():
    edges = graph()
    assert len(edges) > 80
    assert edges["gpufill.engine"] == {"gpufill.lazy"}  # its names load on first use: no submodule imported
    assert "gpufill.engine.step" in edges["gpufill.engine.training"]
    assert "gpufill.engine.packs.fused" in edges["gpufill.forecasting.models.fused"]


def test_the_package_has_no_import_cycle():
    assert cycles(graph()) == []


def folder(module: str) -> str:
    """The top-level folder (or leaf module) a module belongs to: gpufill.campaign.store -> gpufill.campaign."""
    return ".".join(module.split(".")[:2])


def folder_graph() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for module, targets in graph().items():
        edges.setdefault(folder(module), set()).update(folder(t) for t in targets if folder(t) != folder(module))
    return edges


def test_no_two_folders_import_each_other():
    """The folders (engine, forecasting, campaign, monitor, cli, script, report, ...) form no loop either:
    a folder that imports another is never imported back, through any path."""
    edges = folder_graph()
    assert {"gpufill.campaign", "gpufill.monitor", "gpufill.script", "gpufill.report"} <= set(edges)
    assert cycles(edges) == []


# campaign/'s folders along the flow, bottom up: each imports only folders before it (DEVELOPERS.md, "Layers").
CAMPAIGN_STACK = ["spec", "policy", "store", "trials", "results", "future", "worker", "executors", "run"]


def campaign_folder(module: str) -> str | None:
    """The folder of campaign/ a module is in (gpufill.campaign.store.store -> store); None outside campaign/ and for
    campaign/__init__.py and modules beside it."""
    parts = module.split(".")
    inside = parts[:2] == ["gpufill", "campaign"] and len(parts) > 2
    return parts[2] if inside and (PACKAGE / "campaign" / parts[2]).is_dir() else None


def test_the_campaign_folders_form_a_stack():
    """Inside campaign/, every import between two of its folders points down CAMPAIGN_STACK: no folder is imported
    back by one it imports, and a new folder is placed in the stack before anything may import it."""
    upward = []
    folders = set()
    for module, targets in graph().items():
        here = campaign_folder(module)
        if here is None:
            continue
        folders.add(here)
        for target in targets:
            there = campaign_folder(target)
            if there is not None and there != here and (
                    here not in CAMPAIGN_STACK or there not in CAMPAIGN_STACK or CAMPAIGN_STACK.index(there) > CAMPAIGN_STACK.index(here)):
                upward.append(f"{module} -> {target}")
    assert folders == set(CAMPAIGN_STACK)
    assert upward == []


def documented_campaign_imports() -> dict[str, set[str]]:
    """docs/architecture.md's rules for campaign/'s folders ("Imports go one way"), as folder -> what it may import."""
    text = (ROOT.parent / "docs" / "architecture.md").read_text()
    block = text.split("Imports go one way", 1)[1].split("```", 2)[1]
    rules: dict[str, set[str]] = {}
    for line in block.strip().splitlines():
        name, rest = line.split(maxsplit=1)
        rest = rest.split("(", 1)[0].strip()
        if rest == "imports no other campaign folder":
            rules[name] = set()
        elif rest.startswith("-> every folder but "):
            rules[name] = set(CAMPAIGN_STACK) - {name, rest.removeprefix("-> every folder but ").strip()}
        else:
            rules[name] = {part.strip() for part in rest.removeprefix("->").split(",")}
    return rules


def test_the_campaign_folders_import_only_what_docs_architecture_says():
    """The page's rules are the code's: a folder imports no campaign folder its line does not name (so the page
    cannot drift again), and the page lists every folder of the stack."""
    rules = documented_campaign_imports()
    assert list(rules) == CAMPAIGN_STACK
    broken = set()
    for module, targets in graph().items():
        here = campaign_folder(module)
        for target in targets:
            there = campaign_folder(target)
            if here is not None and there is not None and there != here and there not in rules[here]:
                broken.add(f"{module} -> {target}")
    assert broken == set()


def test_the_engine_leaves_docs_architecture_names_are_the_ones_it_may_import():
    text = (ROOT.parent / "docs" / "architecture.md").read_text()
    sentence = text.split("Dependencies point one way: `engine` imports nothing else of gpufill (but ", 1)[1].split(");", 1)[0]
    assert {f"gpufill.{name.strip(' `')}" for name in sentence.replace(" and ", ", ").split(",")} == ALLOWED["gpufill.engine"]


def test_results_only_reads_the_store():
    """results/ is the store read back: no module of it calls a Store method that opens a write transaction."""
    store_source = (PACKAGE / "campaign" / "store" / "store.py").read_text()
    store_class = next(node for node in ast.parse(store_source).body if isinstance(node, ast.ClassDef) and node.name == "Store")
    writes = {method.name for method in store_class.body if isinstance(method, ast.FunctionDef)
              and "self._transaction" in ast.get_source_segment(store_source, method)}
    assert {"set_meta", "event", "record_done", "mark_running"} <= writes
    called = set()
    for path in (PACKAGE / "campaign" / "results").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in writes:
                called.add(f"{path.name}: {node.func.attr}")
    assert called == set()


def test_cycle_detection_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def within(module: str, package: str) -> bool:
    """`module` is `package` or inside it (the root package "gpufill" only matches itself)."""
    return module == package or (package != "gpufill" and module.startswith(package + "."))


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_each_layer_imports_only_what_sits_below_it(layer):
    outside = {}
    for module, targets in graph().items():
        if within(module, layer):
            bad = sorted(t for t in targets if not within(t, layer) and not any(within(t, allowed) for allowed in ALLOWED[layer]))
            if bad:
                outside[module] = bad
    assert outside == {}


def test_the_shared_leaves_import_only_each_other():
    edges = graph()
    assert edges["gpufill.errors"] == set() and edges["gpufill.files"] == {"gpufill.errors"} and edges["gpufill.cpus"] == set()
    assert edges["gpufill.gpus"] == set() and edges["gpufill.lazy"] == set()


def test_importing_gpufill_and_its_cli_loads_no_heavy_library():
    """`gpufill --help` stays fast (under 0.3 s): torch, pandas, numpy and psutil load only when a command runs."""
    code = ("import sys, gpufill, gpufill.cli; "
            "print(sorted(m for m in ('torch', 'pandas', 'numpy', 'pyarrow', 'sklearn', 'psutil', 'pydantic') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"


def test_lazy_names_resolve():
    assert gpufill.fit.__module__ == "gpufill.engine.loop"
    assert gpufill.FitConfig().epochs >= 1
    assert {"fit", "FitConfig", "Campaign", "TrainingMonitor", "InputError"} <= set(dir(gpufill))
    with pytest.raises(AttributeError):
        gpufill.not_a_name  # noqa: B018
