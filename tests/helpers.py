"""Shared test helpers: small campaign files, the real CLI entry point run in-process, HTML reports in headless Chromium."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from gpufill import cli

CHROMIUM = Path("/usr/bin/chromium")
# tests/ itself, wherever a test file sits: the helper modules campaigns name by dotted path
# (tests.custom_model_fixture:make_tiny) and the plain scripts doctor, watch and bench run (user_scripts/).
TESTS = Path(__file__).resolve().parent
USER_SCRIPTS = TESTS / "user_scripts"
# gloo's teardown can abort a rank after its work is done (a known torch/gloo race at process exit);
# gpufill's own ranks wait for each other before leaving, which makes it rare, not impossible.
GLOO_TEARDOWN_ABORT = "terminate called without an active exception"


def load_script(path: Path) -> ModuleType:
    """A script of bench/ or tools/ as a module (neither folder is a package)."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_ranks(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    """A multi-process run, started once more only if a rank died of the gloo teardown abort."""
    done = subprocess.run(command, capture_output=True, text=True, **kwargs)
    if done.returncode != 0 and GLOO_TEARDOWN_ABORT in done.stderr:
        done = subprocess.run(command, capture_output=True, text=True, **kwargs)
    return done


def run_cli(capsys, *args):
    old = sys.argv
    sys.argv = ["gpufill", *map(str, args)]
    try:
        with pytest.raises(SystemExit) as done:
            cli.main()
    finally:
        sys.argv = old
    out, err = capsys.readouterr()
    return done.value.code, out, err


class _Streams:
    """What run_cli reads from a capsys, for a caller without one: the text written to stdout and stderr."""

    def __init__(self) -> None:
        self.out, self.err = io.StringIO(), io.StringIO()

    def readouterr(self) -> tuple[str, str]:
        return self.out.getvalue(), self.err.getvalue()


def run_cli_captured(*args):  # noqa: ANN201 - (code, stdout, stderr) as run_cli
    """run_cli where there is no capsys (a module-scoped fixture: capsys is per test): the streams redirected here."""
    streams = _Streams()
    with contextlib.redirect_stdout(streams.out), contextlib.redirect_stderr(streams.err):
        return run_cli(streams, *args)


def write_campaign(directory: Path, name: str = "tiny", models: str = "mlp: {hidden_size: 16}\n  linear: {}", projects: int = 2,
                   epochs: int = 2, retries: int = 1) -> Path:
    """A small campaign file; `models` is the YAML under `models:` (entries separated by newline + 2 spaces)."""
    path = directory / f"{name}.yaml"
    lines = [
        f"name: {name}",
        f"data: {{source: synthetic, projects: {projects}, length: 300, seed: 0}}",
        "task: {lookback: [12], horizon: 1}",
        "models:",
        f"  {models}",
        f"train: {{epochs: {epochs}, early_stopping: null}}",
        "seeds: [0]",
        f"resources: {{retries: {retries}}}",
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def chromium(page: Path, profile: Path, *args: str) -> subprocess.CompletedProcess:
    command = [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync", "--enable-logging=stderr",
               f"--user-data-dir={profile}", "--virtual-time-budget=5000", *args, page.as_uri()]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


def console_errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "Uncaught" in line or ("CONSOLE" in line and ("ERROR" in line or "rror" in line.split("CONSOLE", 1)[1]))]


def check_in_chromium(report: Path, tmp_path: Path, must_contain: tuple[str, ...] = ('<table id="summary">',)) -> int:
    """Screenshot and DOM of the report in headless Chromium; returns the number of plots that rendered."""
    n_images = report.read_text().count("<img class='plot'")
    shot = tmp_path / "shot.png"
    shown = chromium(report, tmp_path / "profile-1", f"--screenshot={shot}", "--window-size=1280,4000")
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
    dumped = chromium(report, tmp_path / "profile-2", "--dump-dom")
    assert dumped.returncode == 0, dumped.stderr[-2000:]
    for fragment in must_contain:
        assert fragment in dumped.stdout, fragment
    assert f'data-plots="{n_images}/{n_images}"' in dumped.stdout
    assert not console_errors(shown.stderr + dumped.stderr)
    return n_images


def report_summary(page: str) -> dict[str, str]:
    """The report's summary table (`<table id='summary'>`) as label -> value."""
    table = re.search(r"<table id='summary'>(.*?)</table>", page, re.S)
    assert table, "no summary table"
    return dict(re.findall(r"<tr><td>([^<]*)</td><td>([^<]*)</td></tr>", table.group(1)))


def a_result(test: dict, naive: dict, *, timings: dict | None = None, forecasts: dict | None = None, plan: dict | None = None,
             status: str = "completed"):  # noqa: ANN201 - a TrialResult
    """A trial's result as a worker reports it (forecasting.trial.TrialResult), for store and scheduler tests."""
    from gpufill.forecasting.trial import TrialResult

    return TrialResult(project="p", family="f", params={}, status=status, plan=plan or {}, metrics={"test": test, "naive": naive},
                       timings=timings or {}, forecasts=forecasts or {})


def a_trial(trial_id: str = "t1", *, shape: str = "s", kind: str = "neural", project: str = "p0"):  # noqa: ANN201 - a Trial
    """A trial as the scheduler sends it (forecasting.trial.Trial), for tests that need only its id and shape."""
    from gpufill.forecasting.trial import Trial

    return Trial(trial_id=trial_id, project=project, family="lstm" if kind == "neural" else "linear", kind=kind,  # type: ignore[arg-type]
                 params={}, train={}, seed=0, lookback=8, shape=shape)


@contextlib.contextmanager
def registry_restored() -> Iterator[None]:
    """The model registry as it was before the block, whatever the block registered (the built-in families are not
    registered: `registry.load_built_in` keeps them apart)."""
    from gpufill.forecasting.models import registry

    saved = dict(registry._FAMILIES)
    try:
        yield
    finally:
        registry._FAMILIES.clear()
        registry._FAMILIES.update(saved)
