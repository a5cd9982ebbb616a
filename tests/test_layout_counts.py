"""tools/layout_counts.py (issue 27): the structural counts stay at or under a ratchet, and each counter counts
what it says on a small synthetic tree."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers import load_script

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").exists())


tool = load_script(ROOT / "tools" / "layout_counts.py")

# Issue 27's targets, met (at commit 90fdd68, when the restructuring began: 83, 3, 11, 12, 8 and 54 flat test files).
CEILING = {
    "trial_subscripts": 0,  # trials travel as a typed, frozen Trial, not a dict read by key
    "result_builders": 1,  # one builder of a trial's result (forecasting.trial.trial_result)
    "result_patch_sites": 0,  # no result edited after it is built
    "campaign_engine_imports": 3,  # each of gpufill.engine.hardware: the campaign reaches the engine through forecasting
    "campaign_engine_non_hardware": 0,
    "flat_test_files": 2,  # tests mirror src/; test_file_safety and test_hostile_input span every folder
    "stop_rule_modules": 1,  # issue 59: engine/epochs.py alone decides early stopping, for one model and for packs (3 before)
}


@pytest.mark.slow
def test_the_counts_stay_under_the_ratchet():
    values, sites = tool.counts(ROOT)
    over = {name: (values[name], ceiling, sites.get(name)) for name, ceiling in CEILING.items() if values[name] > ceiling}
    assert over == {}
    assert values["folder_loops"] == 0, sites["folder_loops"]
    assert values["fitconfig_frozen"] == 1


def write(root: Path, relative: str, text: str) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def tree(tmp_path: Path) -> Path:
    """A tiny checkout: src/gpufill with campaign/, forecasting/, engine/, errors.py, and tests/."""
    for package in ("", "campaign/", "forecasting/", "engine/"):
        write(tmp_path, f"src/gpufill/{package}__init__.py", "")
    write(tmp_path, "src/gpufill/errors.py", "class InputError(Exception): ...\n")
    write(tmp_path, "src/gpufill/campaign/worker.py",
          'def run(trial, result):\n'
          '    name = trial["family"] + trial["project"]\n'
          '    result["plan"]["x"] = 1\n'
          '    return name\n')
    return tmp_path


def test_trial_subscripts_and_a_patch_site(tmp_path):
    root = tree(tmp_path)
    values, sites = tool.counts(root, frozen=False)
    assert values["trial_subscripts"] == 2
    assert values["result_patch_sites"] == 1
    assert sites["result_patch_sites"] == ["src/gpufill/campaign/worker.py:3"]


def test_every_kind_of_patch_site_and_what_is_not_one(tmp_path):
    root = tree(tmp_path)
    write(root, "src/gpufill/forecasting/edits.py",
          "def edit(out, plan, other, recipe):\n"
          '    out["metrics"]["n"] += 1\n'  # 2: augmented, through a key
          "    plan[name] = 3\n"  # 3: rooted at plan
          "    recipe.record(out['plan'], neural=True)\n"  # 4: record(...["plan"])
          "    unfused_because(out, 'why')\n"  # 5
          "    a, result['x'] = 1, 2\n"  # 6: one target of a tuple, rooted at result
          "    value = out['plan']\n"  # read, not a patch
          "    other['x'] = out\n"  # neither a result key nor a result root
          "    result = {}\n"  # a new name, not a patch
          "    recipe.record(other['x'])\n")
    sites = tool.result_patch_sites(root / "src" / "gpufill", root)
    assert sites == ["src/gpufill/campaign/worker.py:3", *(f"src/gpufill/forecasting/edits.py:{line}" for line in (2, 3, 4, 5, 6))]


def test_result_builders_count_literals_and_trial_result_calls_not_schemas_or_serializers(tmp_path):
    root = tree(tmp_path)
    write(root, "src/gpufill/forecasting/results.py",
          "TYPES = {'plan': 'object', 'metrics': 'object', 'timings': 'object'}\n"  # a schema
          "class TrialResult:\n"
          "    def to_dict(self):\n"
          "        return {'plan': self.plan.copy(), 'metrics': self.metrics, 'timings': self.timings}\n"  # a serializer
          "def build(fit, test):\n"
          "    return {'plan': fit.plan, 'metrics': {'test': test}, 'timings': fit.timings, 'status': 'done'}\n"  # line 6
          "def typed(fit):\n"
          "    return TrialResult(plan=fit.plan)\n"  # line 8
          "def partial(fit):\n"
          "    return {'plan': fit.plan, 'metrics': {}}\n")  # two of the three keys
    assert tool.result_builders(root / "src" / "gpufill", root) == ["src/gpufill/forecasting/results.py:6", "src/gpufill/forecasting/results.py:8"]


def test_campaign_engine_imports_include_function_level_ones(tmp_path):
    root = tree(tmp_path)
    write(root, "src/gpufill/campaign/lanes.py",
          "import gpufill.engine.loop\n"
          "from gpufill.errors import InputError\n"
          "def cores():\n"
          "    from gpufill.engine.hardware import cpu_count, detect\n"
          "    return cpu_count()\n")
    write(root, "src/gpufill/forecasting/run.py", "from gpufill.engine.loop import fit\n")  # not the campaign
    values, sites = tool.counts(root, frozen=False)
    assert sites["campaign_engine_imports"] == ["src/gpufill/campaign/lanes.py:1 gpufill.engine.loop",
                                                "src/gpufill/campaign/lanes.py:4 gpufill.engine.hardware.cpu_count, gpufill.engine.hardware.detect"]
    assert (values["campaign_engine_imports"], values["campaign_engine_non_hardware"]) == (2, 1)


def test_folder_loops_direct_and_through_a_third_folder(tmp_path):
    root = tree(tmp_path)
    package = root / "src" / "gpufill"
    write(root, "src/gpufill/forecasting/a.py", "from gpufill.engine import b\nfrom gpufill.errors import InputError\n")
    assert tool.folder_loops(tool.folder_edges(package)) == []
    write(root, "src/gpufill/engine/b.py", "def late():\n    import gpufill.campaign.worker\n")  # engine -> campaign
    write(root, "src/gpufill/campaign/c.py", "from gpufill.forecasting.a import b\n")  # campaign -> forecasting -> engine -> campaign
    edges = tool.folder_edges(package)
    assert edges["forecasting"] == {"engine", "errors"}
    assert tool.folder_loops(edges) == [("campaign", "engine"), ("campaign", "forecasting"), ("engine", "forecasting")]
    assert tool.folder_loops({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [("a", "b")]


def test_a_name_of_the_package_itself_is_its_root_folder(tmp_path):
    root = tree(tmp_path)
    write(root, "src/gpufill/__init__.py", "def lazy():\n    from gpufill.campaign import runner\n")
    write(root, "src/gpufill/campaign/runner.py", "from gpufill import fit\nimport os\n")
    edges = tool.folder_edges(root / "src" / "gpufill")
    assert (edges["gpufill"], edges["campaign"]) == ({"campaign"}, {"gpufill"})
    assert tool.folder_loops(edges) == [("campaign", "gpufill")]


def test_fitconfig_frozen_is_read_from_the_tree_counted(tmp_path):
    root = tree(tmp_path)
    write(root, "src/gpufill/engine/config.py", "import dataclasses\n@dataclasses.dataclass(frozen=True)\nclass FitConfig:\n    epochs: int = 1\n")
    assert tool.fitconfig_frozen(root / "src") == 1
    write(root, "src/gpufill/engine/config.py", "import dataclasses\n@dataclasses.dataclass\nclass FitConfig:\n    epochs: int = 1\n")
    assert tool.fitconfig_frozen(root / "src") == 0

    @dataclass(frozen=True)
    class Frozen:
        x: int = 0

    assert tool.frozen_dataclass(Frozen) and not tool.frozen_dataclass(dict)


def test_flat_test_files_leave_out_package_level_ones_and_folders(tmp_path):
    root = tree(tmp_path)
    for name in ("tests/test_store.py", "tests/test_imports.py", "tests/campaign/test_lanes.py", "tests/helpers.py"):
        write(root, name, "")
    assert tool.flat_test_files(root / "tests") == ["test_store.py"]


def test_stop_rule_modules_count_each_module_comparing_with_patience_once(tmp_path):
    root = tree(tmp_path)
    write(root, "src/gpufill/engine/stopping.py", "def stop(bad, rules):\n    return bad >= rules.patience or bad > rules.patience\n")
    write(root, "src/gpufill/engine/loop.py", "def f(patience, bad):\n    return bad >= patience\n")
    write(root, "src/gpufill/engine/other.py", "patience = 3\n")
    assert tool.stop_rule_modules(root / "src" / "gpufill", root) == ["src/gpufill/engine/loop.py:2", "src/gpufill/engine/stopping.py:2"]


def test_the_json_output_holds_every_count(tmp_path, capsys):
    root = tree(tmp_path)
    write(root, "src/gpufill/engine/config.py", "import dataclasses\n@dataclasses.dataclass(frozen=True)\nclass FitConfig:\n    epochs: int = 1\n")
    assert tool.main(["--json", "--root", str(root)]) == 0
    assert json.loads(capsys.readouterr().out) == {"trial_subscripts": 2, "result_builders": 0, "result_patch_sites": 1, "campaign_engine_imports": 0,
                                                   "campaign_engine_non_hardware": 0, "folder_loops": 0, "fitconfig_frozen": 1, "flat_test_files": 0,
                                                   "stop_rule_modules": 0}
