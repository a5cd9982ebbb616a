"""`bench/gpu_session.sh triage`: every GPU claim at smoke size in one device call of at most 7 minutes.

The script only runs where a GPU is lent, so its shape is checked here: the parts its header lists are the
parts it runs, with the same limits, summing to at most 420 s; each part's script, test files and flags exist.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "gpu_session.sh"
TRIAGE_BUDGET_S = 420


def _triage_block(text: str) -> str:
    start = text.index('if [ "$part" = triage ]; then')
    return text[start:text.index("\nfi\n", start)]


def _steps(block: str) -> list[tuple[str, int, list[str]]]:
    joined = block.replace("\\\n", " ")
    steps = []
    for line in joined.splitlines():
        words = shlex.split(line.strip()) if line.strip().startswith("step ") else []
        if words:
            steps.append((words[1], int(words[2]), words[3:]))
    return steps


def test_the_triage_parts_are_the_ones_its_header_lists_and_fit_seven_minutes() -> None:
    text = SCRIPT.read_text()
    header = dict((name, int(limit)) for name, limit in re.findall(r"^#\s+(triage-[\w-]+) (\d+)\s", text, flags=re.M))
    steps = _steps(_triage_block(text))
    assert [name for name, _, _ in steps] == list(header) == ["triage-tests", "triage-fit_speed", "triage-pack_any", "triage-campaign",
                                                              "triage-doctor"]
    assert {name: limit for name, limit, _ in steps} == header
    assert sum(header.values()) <= TRIAGE_BUDGET_S
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, check=False).returncode == 0


def test_every_triage_part_names_files_and_flags_that_exist() -> None:
    for name, _, command in _steps(_triage_block(SCRIPT.read_text())):
        paths = [word for word in command if word.startswith(("bench/", "tests/")) and not word.endswith(".json")]
        for path in paths:
            assert (ROOT / path).exists(), (name, path)
        script = next((p for p in paths if p.startswith("bench/") and p.endswith(".py")), None)
        if script is None:
            continue
        source = (ROOT / script).read_text()
        for flag in (word for word in command if word.startswith("--")):
            assert f'"{flag}"' in source, (name, script, flag)  # an argparse option of that script


def test_triage_returns_its_logs_as_one_archive() -> None:
    # A device call returns at most 8 files: four JSON records and one archive of every log.
    text = SCRIPT.read_text()
    assert '[ "$part" = triage ] && logs=/tmp/gpu-session-logs' in text
    assert 'tar czf "$out/logs.tgz" -C "$logs" .' in text
    outs = [word for _, _, command in _steps(_triage_block(text)) for word in command if word.startswith('$out/') or '$out/' in word]
    assert len(outs) + 1 <= 8
