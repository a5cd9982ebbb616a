"""The documentation site (issue 40): `mkdocs build --strict` builds every page, the API page holds the docstrings,
every link of the README and of the pages resolves, and what the README shows is true: its `gpufill` commands and
their options parse, its `make` targets exist, its campaign is the demo file shortened and its `fit` example trains
and prints what the README says it prints."""

from __future__ import annotations

import html
import inspect
import math
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers import run_cli

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").exists())
DOCS = ROOT / "docs"
README = ROOT / "README.md"
MKDOCS = Path(sys.executable).with_name("mkdocs")
# docs page -> where the built site has it (use_directory_urls: one index.html per page)
PAGES = {
    "index.md": "index.html",
    "campaigns.md": "campaigns/index.html",
    "tune.md": "tune/index.html",
    "train.md": "train/index.html",
    "diagnose.md": "diagnose/index.html",
    "forecasting.md": "forecasting/index.html",
    "scale-out.md": "scale-out/index.html",
    "tracking.md": "tracking/index.html",
    "guarantees.md": "guarantees/index.html",
    "benchmarks.md": "benchmarks/index.html",
    "architecture.md": "architecture/index.html",
    "api.md": "api/index.html",
}
README_MAX_LINES = 200
LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(([^)\s]+)\)")


def env() -> dict[str, str]:
    # The package of this checkout; no end-of-life banner from mkdocs-material among the build's messages.
    return {**os.environ, "PYTHONPATH": str(ROOT / "src"), "NO_MKDOCS_2_WARNING": "1"}


def text_of(page: Path) -> str:
    """What a reader sees of a built page: tags dropped, entities read, whitespace folded."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", page.read_text())).split())


def blocks(markdown: str, language: str) -> list[str]:
    """The fenced code blocks of one language ("": blocks that name none), in order."""
    found: list[str] = []
    fence: str | None = None
    lines: list[str] = []
    for line in markdown.splitlines(keepends=True):
        if line.startswith("```"):
            if fence is None:
                fence, lines = line.strip()[3:], []
            else:
                if fence == language:
                    found.append("".join(lines))
                fence = None
        elif fence is not None:
            lines.append(line)
    return found


def slug(heading: str) -> str:
    """A heading's anchor as Python-Markdown's toc and GitHub both make it for plain headings."""
    words = re.sub(r"[^\w\s-]", "", heading.replace("`", "")).strip().lower()
    return re.sub(r"[-\s]+", "-", words)


def anchors(markdown: str) -> set[str]:
    prose = re.sub(r"^```.*?^```", "", markdown, flags=re.S | re.M)  # a `# comment` in a code block is no heading
    return {slug(title) for title in re.findall(r"^#{1,6} (.+)$", prose, re.M)}


# -- the site --------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    assert MKDOCS.exists(), f"no mkdocs next to {sys.executable}: pip install -e '.[dev]' (or '.[docs]')"
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run([str(MKDOCS), "build", "--strict", "--site-dir", str(out)], cwd=ROOT, env=env(), capture_output=True,
                          text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "WARNING" not in done.stderr, done.stderr[-4000:]
    return out


@pytest.mark.slow
def test_the_site_builds_strict_with_one_page_per_entry_of_the_nav(site):
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    listed = [page for entry in nav for page in entry.values()]
    assert sorted(listed) == sorted(PAGES) == sorted(p.name for p in DOCS.glob("*.md"))  # no page left out of the nav
    built = {p.relative_to(site).as_posix() for p in site.rglob("index.html")}
    assert built == set(PAGES.values())
    titles = {name: text_of(site / path) for name, path in PAGES.items()}
    assert "Get started" in titles["index.md"] and "Guarantees" in titles["guarantees.md"]


@pytest.mark.slow
def test_the_api_page_holds_the_docstrings_of_fit_fit_many_and_their_types(site):
    import gpufill

    page = text_of(site / PAGES["api.md"])
    for name in ("fit", "fit_many", "FitConfig", "FitResult", "Plan", "TrainingMonitor", "InputError"):
        first_line = inspect.getdoc(getattr(gpufill, name)).splitlines()[0]
        assert "".join(first_line.replace("`", "").split()) in "".join(page.split()), name  # inline tags leave spaces
    assert "Learning rate at the reference batch" in page  # a FitConfig field's own docstring
    assert "gpufill.engine.loop.fit" in page


def test_every_page_holds_its_content():
    written = [name for name in PAGES if name != "api.md"]  # the API page is mkdocstrings' directives: the test above reads it built
    words = {name: len((DOCS / name).read_text().split()) for name in written}
    assert {name for name, count in words.items() if count < 150} == set(), words


# -- links -----------------------------------------------------------------------------------------------------------

def test_the_readme_is_the_front_page_at_most_200_lines():
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, len(lines)
    linked = {target.split("#")[0] for target in LINK.findall(README.read_text())}
    assert {f"docs/{name}" for name in PAGES} <= linked  # a way into every page


def test_every_relative_link_of_the_readme_resolves():
    readme = README.read_text()
    targets = [t for t in LINK.findall(readme) if not re.match(r"[a-z]+:", t)]
    assert len(targets) >= len(PAGES)
    for target in targets:
        path, _, anchor = target.partition("#")
        file = README if not path else ROOT / path
        assert file.exists(), target
        if anchor and file.suffix == ".md":
            assert anchor in anchors(file.read_text()), target


def test_every_link_between_pages_resolves_and_none_leaves_the_site():
    """mkdocs --strict checks these too; this says which page and link, without a build."""
    for page in DOCS.glob("*.md"):
        for target in LINK.findall(page.read_text()):
            assert not re.match(r"[a-z]+:", target), (page.name, target)  # the pages link to each other only
            path, _, anchor = target.partition("#")
            file = page if not path else DOCS / path
            assert file.exists() and file.parent == DOCS, (page.name, target)
            if anchor:
                assert anchor in anchors(file.read_text()), (page.name, target)


def test_every_test_named_in_brackets_exists():
    """[test_x] marks a claim a test holds (Guarantees): each name is a file under tests/ (or a bench/ script)."""
    tests = {p.relative_to(ROOT / "tests").with_suffix("").as_posix() for p in (ROOT / "tests").rglob("test_*.py")}
    named = []
    for page in [README, *DOCS.glob("*.md")]:
        for inside in re.findall(r"\[([^\]\n]*\btest_\w+[^\]\n]*)\](?!\()", page.read_text()):
            named += [name.strip().removesuffix(".py") for name in inside.split(",")]
    assert len(named) >= 40
    for name in named:
        if name.startswith("bench/"):
            assert (ROOT / f"{name}.py").exists(), name
        elif name.startswith("tests/"):
            assert name.removeprefix("tests/") in tests, name
        elif "/" in name:
            assert name in tests, name
        else:
            assert any(t.rsplit("/", 1)[-1] == name for t in tests), name


# -- the README's commands ---------------------------------------------------------------------------------------------

def commands(markdown: str) -> list[list[str]]:
    """Each shell command of the bash blocks, as words, comments and line continuations removed."""
    out = []
    for block in blocks(markdown, "bash"):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words:
                out.append(words)
    return out


HELP: dict[tuple[str, ...], str] = {}
"""Each subcommand's --help, read once per session."""


def help_text(capsys, *subcommand: str) -> str:
    if subcommand not in HELP:
        with pytest.MonkeyPatch.context() as patch:  # 200 columns: an option's name is never cut
            patch.setenv("COLUMNS", "200")
            patch.setenv("NO_COLOR", "1")
            code, out, err = run_cli(capsys, *subcommand, "--help")
        assert code == 0, (subcommand, err[-2000:])
        HELP[subcommand] = out
    return HELP[subcommand]


def check_gpufill(capsys, words: list[str]) -> None:
    """`gpufill SUB ... [options] [-- COMMAND]`: the subcommand has help, each option is in it, each file named exists."""
    words = words[: words.index("--")] if "--" in words else words  # after `--`: the user's own command
    subcommand = []
    for word in words[1:]:
        if not re.fullmatch(r"[a-z][a-z-]*", word) or word in subcommand:
            break
        subcommand.append(word)
    usage = help_text(capsys, *subcommand)
    assert subcommand and f"gpufill {' '.join(subcommand)}" in usage, words
    for word in words[1 + len(subcommand):]:
        if word.startswith("-"):
            assert re.search(rf"(?<![\w-]){re.escape(word.split('=')[0])}(?![\w-])", usage), (words, word)
        elif word.startswith(("examples/", "bench/")):
            assert (ROOT / word.split(":")[0]).exists(), (words, word)


def test_every_command_of_the_readme_is_real(capsys):
    makefile = (ROOT / "Makefile").read_text()
    kinds = []
    for words in commands(README.read_text()):
        kinds.append(words[0])
        if words[0] == "make":
            for target in words[1:]:
                assert re.search(rf"^{re.escape(target)}:", makefile, re.M), target
        elif words[0] == "source":
            venv = re.search(r"^VENV := (\S+)$", makefile, re.M).group(1)
            assert words[1] == f"{venv}/bin/activate"
        elif words[0] == "gpufill":
            check_gpufill(capsys, words)
        else:
            raise AssertionError(f"a README command this test does not check: {words}")
    assert kinds.count("make") == 2 and kinds.count("gpufill") >= 3  # make demo, make test; a campaign's commands


def test_every_gpufill_command_of_the_pages_parses_and_every_script_they_run_exists(capsys):
    checked = 0
    for page in DOCS.glob("*.md"):
        for words in commands(page.read_text()):
            words = words[1:] if words[0] == "srun" else words
            if words[0] == "gpufill":
                check_gpufill(capsys, words)
                checked += 1
            elif words[0] in (".venv/bin/python", "bash"):
                assert (ROOT / words[1]).exists(), (page.name, words)
    assert checked >= 30


def test_the_readmes_campaign_is_the_demo_file_shortened():
    import gpufill

    shown = yaml.safe_load(blocks(README.read_text(), "yaml")[0])
    demo = yaml.safe_load((ROOT / "examples" / "demo.yaml").read_text())
    assert {key: demo[key] for key in shown if key != "models"} == {key: value for key, value in shown.items() if key != "models"}
    assert shown["models"] == {family: demo["models"][family] for family in shown["models"]}
    assert len(demo["models"]) == 10  # "one grid point for each of ten families", 80 trials on 8 projects
    assert gpufill.Campaign.from_yaml(ROOT / "examples" / "demo.yaml").spec.name == shown["name"]


@pytest.mark.slow
def test_the_readmes_fit_example_trains_and_prints_what_the_readme_shows(tmp_path):
    readme = README.read_text()
    example = blocks(readme, "python")[0]
    shown = next(block for block in blocks(readme, "") if block.startswith("device "))
    done = subprocess.run([sys.executable, "-c", example], cwd=tmp_path, env=env(), capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    printed = done.stdout.splitlines()
    assert [line.split()[0] for line in printed] == [line.split()[0] for line in shown.splitlines()]
    for ran, said in zip(printed[1:4], shown.splitlines()[1:4], strict=True):  # data_placement, step_sync, optimizer: value
        assert ran.split()[:2] == said.split()[:2], (ran, said)
    words = printed[-1].split()
    val_loss, best_epoch = float(words[1]), int(words[3])
    assert math.isfinite(val_loss) and val_loss < 0.1  # the target's variance is ~7.5, its noise's 0.01
    assert 1 <= best_epoch <= 20
    assert abs(val_loss - float(shown.splitlines()[-1].split()[1])) < 0.25 * val_loss  # what the README prints, within CPU rounding


def test_every_example_campaign_loads_and_the_forecasting_recipe_is_the_documented_one():
    """examples/*.yaml load as written (a user copies them first); forecast.yaml is the recipe docs/forecasting.md opens
    with: two N-BEATS scalings at 1, 1.5 and 2 horizons, an ensemble chosen on two horizons of validation, six epochs at
    a decaying rate without early stopping (what issue 61 measured on M1, Tourism and M3), refit, the references."""
    from gpufill.campaign import load_campaign
    from gpufill.campaign.trials.trials import expand

    for path in sorted((ROOT / "examples").glob("*.yaml")):
        spec = load_campaign(path)
        assert spec.search is not None or expand(spec, [f"p{i}" for i in range(2)]), path.name
    recipe = load_campaign(ROOT / "examples" / "forecast.yaml")
    assert recipe.ensemble_members() == ["nbeats", "nbeats@mean"] and recipe.lookbacks("nbeats") == [16, 8, 12]
    assert recipe.train.refit and recipe.task.metric == "smape" and {"ets", "theta", "comb"} <= set(recipe.models)
    assert (recipe.task.split.val, recipe.task.split.test) == (2 * recipe.task.horizon, recipe.task.horizon)
    train = recipe.train
    assert (train.epochs, train.lr, train.schedule, train.early_stopping) == (6, 0.005, "linear", None)
    assert recipe.ensemble is not None and (recipe.ensemble.select, recipe.ensemble.padded) == ("best", "leave_out")
    assert "examples/forecast.yaml" in (DOCS / "forecasting.md").read_text()
