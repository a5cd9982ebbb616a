"""Issue 27's structural counts ("one owner for run one trial"), printed with their targets.

    python tools/layout_counts.py [--json] [--list] [--root DIR]

Each count is read from the source with `ast` (one is a plain text count) over src/gpufill/**/*.py:

- trial_subscripts: occurrences of the text `trial["`. A trial travelling as a dict read by key is what the
  typed, frozen trial description replaces. Target 0.
- result_builders: places that build a trial's result: dict literals holding all of the keys "plan", "metrics"
  and "timings" (not a schema of constants, nor an object writing itself out with every one read from `self`),
  plus calls of a class named `TrialResult`. One builder means one shape of result. Target 1.
- result_patch_sites: assignments (=, +=, ...) to a subscript chain that holds the key "plan", "timings" or
  "metrics" or starts at a variable named `result` or `plan`; calls `x.record(...["plan"]...)`; and calls of
  `unfused_because`. Each is a result edited after it was built, by someone other than its builder. Target 0.
- campaign_engine_imports: import statements of `gpufill.engine` (or a submodule) in src/gpufill/campaign/**,
  function-level ones included. The campaign talks to the engine only for hardware facts: target <= 3, each of
  `gpufill.engine.hardware` (campaign_engine_non_hardware counts the others: target 0).
- folder_loops: pairs of top-level folders under src/gpufill (a top-level module is its own folder) each of
  which reaches the other through imports (directly or through other folders). Target 0.
- fitconfig_frozen: 1 if `gpufill.engine.config.FitConfig` (imported from the tree's src) is a frozen dataclass.
  Target 1.
- flat_test_files: test_*.py directly in tests/ rather than in the folder mirroring src/ (the package-wide
  ones in PACKAGE_LEVEL_TESTS aside). No target.
- stop_rule_modules (issue 59): modules that decide early stopping, i.e. compare a count with something named
  `patience`. One training loop for K = 1 and K > 1 keeps its stop rules in one module. Target 1. bench/ is left
  out: its loops are the hand-written baselines gpufill is measured against, not gpufill's.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

TARGETS = {"trial_subscripts": "0", "result_builders": "1", "result_patch_sites": "0", "campaign_engine_imports": "<= 3",
           "campaign_engine_non_hardware": "0", "folder_loops": "0", "fitconfig_frozen": "1", "flat_test_files": "-",
           "stop_rule_modules": "1"}
RESULT_KEYS = {"plan", "metrics", "timings"}
PATCH_ROOTS = {"result", "plan"}
PACKAGE_LEVEL_TESTS = {"test_imports.py", "test_examples.py", "test_layout_counts.py", "test_tools_demo_metrics.py", "test_time_limit.py"}
"""Tests of the package as a whole (its import graph, its examples), of tools/ or of the suite itself: they stay in tests/."""


def sources(package: Path) -> Iterator[tuple[Path, ast.Module]]:
    for path in sorted(package.rglob("*.py")):
        yield path, ast.parse(path.read_text(), str(path))


def _site(path: Path, node: ast.AST, root: Path) -> str:
    return f"{path.relative_to(root)}:{getattr(node, 'lineno', 0)}"


def trial_subscripts(package: Path) -> int:
    return sum(path.read_text().count('trial["') for path in package.rglob("*.py"))


def result_builders(package: Path, root: Path) -> list[str]:
    sites = []
    for path, tree in sources(package):
        for node in ast.walk(tree):
            if isinstance(node, ast.Dict) and _builds(node) or isinstance(node, ast.Call) and _called(node) == "TrialResult":
                sites.append(_site(path, node, root))
    return _sorted(sites)


def _builds(node: ast.Dict) -> bool:
    """A dict literal with the three keys that builds a result: not a schema (constant values, e.g. the store's
    column types) and not a result object writing itself out (every value read from `self`, e.g. `to_dict`)."""
    values = {k.value: v for k, v in zip(node.keys, node.values, strict=True) if isinstance(k, ast.Constant)}
    if not RESULT_KEYS <= set(values):
        return False
    chosen = [values[key] for key in RESULT_KEYS]
    schema = all(isinstance(v, ast.Constant) for v in chosen)
    serializer = all(isinstance(root, ast.Name) and root.id == "self" for root in (_chain(v)[0] for v in chosen))
    return not schema and not serializer


def _sorted(sites: list[str]) -> list[str]:
    """file:line sites in file order, then line order."""
    return sorted(sites, key=lambda site: (site.split(":")[0], int(site.split(":")[1].split(" ")[0])))


def _called(call: ast.Call) -> str | None:
    """The name a call calls: f(...) -> f, a.b.f(...) -> f."""
    return call.func.id if isinstance(call.func, ast.Name) else call.func.attr if isinstance(call.func, ast.Attribute) else None


def _chain(node: ast.AST) -> tuple[ast.AST, set[Any]]:
    """The root of a subscript/attribute/call chain (`a["x"].b()["y"]` -> a) and the constant keys subscripted along it."""
    keys: set[Any] = set()
    while isinstance(node, (ast.Subscript, ast.Attribute, ast.Call)):
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            keys.add(node.slice.value)
        node = node.func if isinstance(node, ast.Call) else node.value
    return node, keys


def _patches(target: ast.AST) -> bool:
    if isinstance(target, (ast.Tuple, ast.List)):
        return any(_patches(t) for t in target.elts)
    if not isinstance(target, ast.Subscript):
        return False
    root, keys = _chain(target)
    return bool(keys & RESULT_KEYS) or (isinstance(root, ast.Name) and root.id in PATCH_ROOTS)


def result_patch_sites(package: Path, root: Path) -> list[str]:
    sites = []
    for path, tree in sources(package):
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and any(_patches(t) for t in node.targets) or isinstance(node, ast.AugAssign) and _patches(node.target):
                sites.append(_site(path, node, root))
            elif isinstance(node, ast.Call) and _called(node) == "unfused_because":
                sites.append(_site(path, node, root))
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "record" and any(
                    "plan" in _chain(sub)[1] for arg in node.args for sub in ast.walk(arg) if isinstance(sub, ast.Subscript)):
                sites.append(_site(path, node, root))
    return _sorted(sites)


def _imported(node: ast.AST) -> list[str]:
    """The gpufill modules (or names) an import statement names, absolute imports only (the package has no relative ones)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        return [f"{node.module}.{alias.name}" for alias in node.names]
    return []


def campaign_engine_imports(package: Path, root: Path) -> list[str]:
    sites = []
    for path, tree in sources(package / "campaign"):
        for node in ast.walk(tree):
            names = [n for n in _imported(node) if n == "gpufill.engine" or n.startswith("gpufill.engine.")]
            if names:
                sites.append(f"{_site(path, node, root)} {', '.join(names)}")
    return _sorted(sites)


def _folder(package: Path, name: str) -> str | None:
    """The top-level folder (or top-level module) of a gpufill module or name: gpufill.campaign.store -> campaign,
    gpufill.errors.InputError -> errors, gpufill.fit (a name of the package itself) -> gpufill; None outside gpufill."""
    parts = name.split(".")
    if parts[0] != "gpufill":
        return None
    known = len(parts) > 1 and parts[1] != "__init__" and ((package / parts[1]).is_dir() or (package / f"{parts[1]}.py").exists())
    return parts[1] if known else "gpufill"


def folder_edges(package: Path) -> dict[str, set[str]]:
    """folder -> the other folders its modules import (every import statement, function-level ones included)."""
    edges: dict[str, set[str]] = {}
    for path, tree in sources(package):
        own = _folder(package, ".".join(path.relative_to(package.parent).with_suffix("").parts)) or "gpufill"
        edges.setdefault(own, set()).update(f for node in ast.walk(tree) for name in _imported(node) if (f := _folder(package, name)) not in (None, own))
    return edges


def folder_loops(edges: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Pairs of folders each reaching the other through imports."""
    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in edges.get(todo.pop(), set()) - seen:
                seen.add(nxt)
                todo.append(nxt)
        return seen

    reached = {folder: reach(folder) for folder in edges}
    return sorted((a, b) for a in edges for b in reached[a] if a < b and a in reached.get(b, set()))


def frozen_dataclass(cls: type) -> bool:
    return dataclasses.is_dataclass(cls) and bool(cls.__dataclass_params__.frozen)  # type: ignore[attr-defined]


def fitconfig_frozen(src: Path) -> int:
    """Imported in a child interpreter from `src`, so that the tree counted is the tree imported."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); sys.path.insert(0, sys.argv[2]); import layout_counts as lc;"
            "from gpufill.engine.config import FitConfig; print(int(lc.frozen_dataclass(FitConfig)))")
    done = subprocess.run([sys.executable, "-c", code, str(Path(__file__).resolve().parent), str(src)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"importing FitConfig from {src} failed:\n{done.stderr[-2000:]}")
    return int(done.stdout.strip())


def stop_rule_modules(package: Path, root: Path) -> list[str]:
    """file:line of the first comparison with a name or attribute `patience` in each module that has one."""
    sites = []
    for path, tree in sources(package):
        if "bench" in path.relative_to(package).parts[:1]:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare) and any(isinstance(c, ast.Name | ast.Attribute) and (getattr(c, "id", None) or getattr(c, "attr", None)) == "patience"
                                                     for c in node.comparators):
                sites.append(_site(path, node, root))
                break
    return sites


def flat_test_files(tests: Path) -> list[str]:
    return sorted(p.name for p in tests.glob("test_*.py") if p.name not in PACKAGE_LEVEL_TESTS)


def counts(root: Path, *, frozen: bool = True) -> tuple[dict[str, int], dict[str, list[str]]]:
    """Every count of the tree at `root`, and the sites behind the listed ones."""
    package = root / "src" / "gpufill"
    engine = campaign_engine_imports(package, root)
    lists = {"result_builders": result_builders(package, root), "result_patch_sites": result_patch_sites(package, root),
             "campaign_engine_imports": engine, "folder_loops": [" <-> ".join(p) for p in folder_loops(folder_edges(package))],
             "flat_test_files": flat_test_files(root / "tests"), "stop_rule_modules": stop_rule_modules(package, root)}
    hardware = ("gpufill.engine.hardware", "gpufill.engine.hardware.")
    values = {"trial_subscripts": trial_subscripts(package), **{name: len(sites) for name, sites in lists.items()},
              "campaign_engine_non_hardware": sum(any(not (n == hardware[0] or n.startswith(hardware[1])) for n in site.split(" ", 1)[1].split(", "))
                                                  for site in engine)}
    if frozen:
        values["fitconfig_frozen"] = fitconfig_frozen(root / "src")
    return {name: values[name] for name in TARGETS if name in values}, lists


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object: count name -> value")
    parser.add_argument("--list", action="store_true", help="also list the sites behind each count (file:line)")
    parser.add_argument("--root", type=Path, default=None, help="the checkout to count (default: the one holding this script)")
    args = parser.parse_args(argv)
    root = args.root.resolve() if args.root else next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").exists())
    values, lists = counts(root)
    if args.json:
        print(json.dumps({**values, **({"sites": lists} if args.list else {})}, indent=1))
        return 0
    for name, value in values.items():
        print(f"{name:<30} {value:>4}   target {TARGETS[name]}")
    if args.list:
        for name, sites in lists.items():
            print(f"\n{name}:" + "".join(f"\n  {site}" for site in sites))
    return 0


if __name__ == "__main__":
    sys.exit(main())
