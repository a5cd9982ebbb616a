"""How a doctor, watch or bench run of a user's command ends when the command will not (issue 37, items 10 and 12):
its own deadline, SIGTERM then SIGKILL of its whole process group, one line saying so, a daemon it left running
named; a bench says how many times it runs the command; a script that cannot be run is one line and exit 2."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from gpufill.script.bench import VARIANTS, run_order, runs_text
from gpufill.script.launch import run_instrumented
from tests.helpers import USER_SCRIPTS, run_cli

CATCHER = str(USER_SCRIPTS / "ignores_sigterm.py")
# Without torch or gpufill's instrumentation (python -S): up in well under a second, so a deadline of seconds finds it
# already ignoring SIGTERM. It starts a child in its own process group that ignores SIGTERM too.
PLAIN_CATCHER = '''import os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-S", "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)"])
with open(sys.argv[1] + ".tmp", "w") as handle:
    handle.write(f"{os.getpid()}\\n{child.pid}\\n")
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
while True:
    time.sleep(0.05)
'''
GRACE_S = 2.0
"""--grace of these tests: the script ignores SIGTERM, so each waits it out (the default, 10 s, would only add waiting)."""
KILLED = f"the script ignored SIGTERM: killed (SIGKILL to its process group) after {GRACE_S:g} s"


def wait_for(condition, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.1)


def pids_in(path: Path) -> list[int]:
    return [int(line) for line in path.read_text().split()] if path.exists() else []


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.fixture
def pidfile(tmp_path: Path) -> Iterator[Path]:
    """Where the test's script writes its pids; whatever of them still runs afterwards is killed, pass or fail."""
    path = tmp_path / "pids"
    yield path
    for pid in pids_in(path):
        try:
            psutil.Process(pid).kill()
        except psutil.Error:
            pass


@pytest.fixture
def plain_catcher(tmp_path: Path) -> Path:
    script = tmp_path / "plain_catcher.py"
    script.write_text(PLAIN_CATCHER)
    return script


@pytest.mark.slow
def test_doctor_ends_a_script_that_ignores_sigterm_at_its_deadline_and_kills_its_whole_group(pidfile, plain_catcher):
    command = [sys.executable, "-m", "gpufill", "doctor", "--timeout", "3", "--grace", str(GRACE_S), "--json", "--", sys.executable, "-S", str(plain_catcher), str(pidfile)]
    started = time.monotonic()
    run = subprocess.run(command, capture_output=True, text=True, timeout=300)
    report = json.loads(run.stdout)
    assert run.returncode == 128 + signal.SIGKILL and report["exit_code"] == 137, run.stderr
    assert report["ending"] == f"the command passed its deadline of 3 s (--timeout); {KILLED}"
    assert report["not_measured"] == ["everything: gpufill ended the command before it wrote a report (see how, below)"]
    script, child = pids_in(pidfile)
    assert gone(script) and gone(child)  # the child in the script's group went with it
    assert 3 + GRACE_S <= time.monotonic() - started < 3 + GRACE_S + 60


@pytest.mark.slow
def test_bench_ends_a_run_that_ignores_sigterm_at_its_deadline_and_says_so_in_its_one_line(pidfile, plain_catcher):
    command = [sys.executable, "-m", "gpufill", "bench", "--timeout", "3", "--grace", str(GRACE_S), "--", sys.executable, "-S", str(plain_catcher), str(pidfile)]
    run = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert run.returncode == 137 and run.stdout == ""
    assert run.stderr.strip().splitlines()[-1] == ("gpufill bench: the command was not measured: no Python process of the command was "
                                                   f"instrumented (exit code 137); gpufill ended it: the command passed its deadline of 3 s "
                                                   f"(--timeout); {KILLED}")
    assert all(gone(pid) for pid in pids_in(pidfile)) and len(pids_in(pidfile)) == 2


@pytest.mark.slow
def test_sigterm_passed_on_by_watch_and_ignored_ends_in_sigkill_and_a_daemon_it_started_is_named(tmp_path, pidfile):
    out = tmp_path / "watched"
    command = [sys.executable, "-m", "gpufill", "watch", "--out", str(out), "--grace", str(GRACE_S), "--", sys.executable, CATCHER, str(pidfile), "daemon"]
    # Files, not pipes: the daemon inherits them and would hold a pipe open after gpufill has ended.
    with open(tmp_path / "out.txt", "w") as stdout, open(tmp_path / "err.txt", "w") as errors:
        process = subprocess.Popen(command, stdout=stdout, stderr=errors)
        try:
            wait_for(lambda: len(pids_in(pidfile)) == 2)  # the script ignores SIGTERM from here on
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=120)
        finally:
            process.kill()
            process.wait()
    stderr = (tmp_path / "err.txt").read_text()
    script, daemon = pids_in(pidfile)
    assert process.returncode == 137 and gone(script), stderr
    record = json.loads((out / "watch.json").read_text())
    assert record["ending"] == f"gpufill passed SIGTERM on; {KILLED}"
    assert [p["pid"] for p in record["left_running"]] == [daemon] and record["left_running"][0]["command"].endswith("import time; time.sleep(300)")
    assert f"gpufill ended it: gpufill passed SIGTERM on; {KILLED}" in stderr
    assert f"still running, started by the command: pid {daemon}: " in stderr and not gone(daemon)  # named, not killed: no longer the command


@pytest.mark.slow
def test_a_script_that_catches_the_stop_and_runs_on_is_ended_after_its_measured_steps(tmp_path, pidfile):
    run = run_instrumented([sys.executable, CATCHER, str(pidfile)], tmp_path / "run", steps=2, warmup=1, sample_every_s=5.0, timeout_s=240,
                           grace_s=1.0, after_stop_s=1.0)
    assert run.exit_code == 137 and run.stopped_by_gpufill  # its 1 + 2 steps were measured
    assert run.report is not None and run.report["stop_reason"] == "stopped after 1 warm-up and 2 measured steps"
    assert run.ending == "the command ran on 1 s after its measured steps; the script ignored SIGTERM: killed (SIGKILL to its process group) after 1 s"
    assert gone(pids_in(pidfile)[0]) and run.left_running == []


@pytest.mark.slow
def test_a_daemon_forked_away_from_the_group_is_named_after_a_command_that_ended_by_itself(tmp_path, pidfile):
    code = ("import os, subprocess, sys; p = subprocess.Popen([sys.executable, '-S', '-c', 'import time; time.sleep(300)'], start_new_session=True); "
            f"open({str(pidfile)!r}, 'w').write(str(p.pid))")
    run = run_instrumented([sys.executable, "-S", "-c", code], tmp_path / "run", sample_every_s=5.0)
    daemon = pids_in(pidfile)[0]
    assert run.exit_code == 0 and run.ending == ""
    assert run.left_running == [{"pid": daemon, "command": f"{sys.executable} -S -c import time; time.sleep(300)"}]


@pytest.mark.slow
def test_bench_says_how_many_times_the_command_runs_before_the_first_run(tmp_path):
    script = tmp_path / "counted.py"
    script.write_text("import sys, torch\nopen(sys.argv[1], 'a').write('run\\n')\nmodel = torch.nn.Linear(4, 1)\n"
                      "optimizer = torch.optim.SGD(model.parameters(), lr=0.01)\nfor _ in range(50):\n"
                      "    model(torch.randn(8, 4)).pow(2).mean().backward()\n    optimizer.step()\n    optimizer.zero_grad()\n")
    runs = tmp_path / "runs.txt"
    command = [sys.executable, "-m", "gpufill", "bench", "--steps", "2", "--try", "one_thread", "--json", "--", sys.executable, str(script), str(runs)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stderr.splitlines() if "your command runs" in line]
    assert said == ["gpufill bench: your command runs 3 times: 2 as it is and 1 with each of one_thread; each run stopped after 3 warm-up + 2 steps"]
    assert runs.read_text().count("run") == 3 and json.loads(done.stdout)["endings"] == []


def test_the_announced_count_is_the_runs_the_bench_makes_at_any_repeats():
    cpu = [v for v in VARIANTS if v.applies_to(False)]
    gpu = [v for v in VARIANTS if v.applies_to(True)]
    assert [len(run_order(cpu, r)) for r in (1, 3)] == [3, 7] and [len(run_order(gpu, r)) for r in (1, 3)] == [6, 16]
    assert [v.name for _, v in run_order(cpu, 2)] == ["as is", "one_thread", "as is", "one_thread", "as is"]
    assert runs_text(cpu, 3, 30).startswith("your command runs 7 times: 4 as it is and 3 with each of one_thread;")


@pytest.mark.parametrize("tool", ["doctor", "watch", "bench"])
def test_a_script_without_the_execute_bit_or_a_directory_is_one_line_and_exit_2(capsys, tmp_path, monkeypatch, tool):
    monkeypatch.chdir(tmp_path)
    Path("train.py").write_text("print('hello')\n")
    Path("runs").mkdir()
    code, _, err = run_cli(capsys, tool, "--", "./train.py")
    assert code == 2 and err == (f"gpufill: error: ./train.py: COMMAND: not executable (no execute permission); fix: chmod +x ./train.py, "
                                 f"or gpufill {tool} -- python ./train.py\n")
    code, _, err = run_cli(capsys, tool, "--", "./runs", "--epochs", "2")
    assert code == 2 and err == f"gpufill: error: ./runs: COMMAND: is a directory, not a command; fix: name the script in it: gpufill {tool} -- python ./runs/train.py\n"
    code, _, err = run_cli(capsys, tool, "--", "train.py")  # a bare name is looked up on PATH, as a shell does
    assert code == 2 and err == f"gpufill: error: train.py: COMMAND: 'train.py' is not a command here; fix: run it as ./train.py, or gpufill {tool} -- python train.py\n"
    assert sorted(os.listdir(tmp_path)) == ["runs", "train.py"]  # nothing ran, no watch folder was made


def test_a_deadline_that_is_not_a_positive_number_is_one_line(capsys):
    code, _, err = run_cli(capsys, "doctor", "--timeout", "0", "--", sys.executable, "-c", "pass")
    assert code == 2 and err == "gpufill: error: command line: --timeout: --timeout 0 is not a positive number of seconds; fix: e.g. --timeout 600\n"


@pytest.mark.parametrize("tool", ["doctor", "watch", "bench"])
def test_a_grace_that_is_not_a_number_of_seconds_is_one_line_before_the_command_runs(capsys, tmp_path, tool):
    ran = tmp_path / "ran"
    for grace in ("-1", "inf"):
        code, _, err = run_cli(capsys, tool, "--grace", grace, "--", sys.executable, "-c", f"open({str(ran)!r}, 'w')")
        assert code == 2 and err == f"gpufill: error: command line: --grace: --grace {float(grace):g} is not a number of seconds; fix: e.g. --grace 10\n"
    assert not ran.exists()
