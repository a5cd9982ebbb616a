"""Running trials, wherever they run: a local worker process, a Ray actor or a Slurm job.

Every executor runs a task the same way: :func:`start_runner` once per process (thread
count, campaign, data cache), then ``TrialRunner.run_task(task)`` per `Task`, whose `TaskEnded`
goes back to the scheduler (policy/messages.py). Nothing here touches the store: the scheduler is its only
writer. Thread limits (OMP/MKL/OpenBLAS) are in the process's environment before it
starts (each executor puts them there; a worker forked from its lane's zygote takes them after the fork:
take_lane_threads); torch, XGBoost and LightGBM are told explicitly.

A worker trains a trial only on the data its id names: it loads the data itself, and before a
trial compares the loaded project's fingerprint with the trial's. On a difference it reads the
data once more (the file may have been restored); still different, or not loadable at all, the
trial fails as an environment failure (attempt.EnvironmentFailure), which uses none of its retries.

Run as ``python -m gpufill.campaign.worker.worker FD`` it is a local worker (executors/local.py).
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Callable, Mapping
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpufill.campaign.policy import environment
from gpufill.campaign.policy.messages import Heartbeat, Message, Outcome, Progress, Ready, Started, Task, TaskEnded, TrialEnded
from gpufill.campaign.worker.attempt import EnvironmentFailure, attempt, failure
from gpufill.campaign.worker.early import thread_env
from gpufill.forecasting.trial import GLOBAL_PROJECT, PackEntry, Trial, TrialResult

if TYPE_CHECKING:
    from gpufill.forecasting.run import TrialSetup

HEARTBEAT_EVERY_S = 2.0
"""A local worker says it is alive this often, busy or idle (resources.heartbeat_timeout is its limit)."""
REREAD_EVERY_S = 1.0
"""Data that differs from a trial's id is read again at most once per task and this often: a project changed for good
fails its trials quickly (each retried later by the scheduler), without reading a large file for every one."""


def take_lane_threads(threads: int) -> None:
    """A worker forked from its lane's zygote has the zygote's one thread in every pool (campaign/executors/forked.py):
    the lane's count goes where each library reads it from now on, as a fresh worker's environment gives it at import:
    the environment (what this worker starts), the OpenMP and BLAS pools loaded (threadpoolctl), torch's MKL (the
    zygote refuses the fork of a lane of several threads where it cannot be set); torch's own count is use_threads'."""
    if threads == 1:
        return
    os.environ.update(thread_env(threads))
    from threadpoolctl import threadpool_limits

    from gpufill.forecasting.run import use_mkl_threads

    threadpool_limits(limits=threads)  # as a call (not a with-block) the limits stay
    use_mkl_threads(threads)  # inside torch's library, where threadpoolctl does not look


def start_runner(setup: dict[str, Any], *, forked: bool = False) -> TrialRunner:
    """A worker's start, the same for every executor: torch's thread count, then the campaign.

    `setup` is executors.base.worker_setup's: the campaign as data, the lane's threads and device. `forked`: the
    worker is a fork of its lane's zygote, which imported at one thread.
    """
    import torch

    from gpufill.forecasting.run import use_threads

    if forked:
        take_lane_threads(setup["threads"])
    use_threads(setup["threads"])
    if setup["device"].startswith("cuda"):
        # Creating the CUDA context holds the interpreter for seconds on a large GPU: do it at start-up,
        # not inside the first trial, where it would silence the heartbeat.
        torch.zeros(1, device=setup["device"])
    return TrialRunner(setup["spec"], Path(setup["base_dir"]), threads=setup["threads"], device=setup["device"], tune_cache=setup.get("tune_cache"),
                       projects=setup.get("data"))


def run_job(setup: dict[str, Any], task: Task) -> TaskEnded:
    """A batch job's whole life (Slurm): start, run one task, return its end."""
    return start_runner(setup).run_task(task)


def worker_main(conn: Connection, *, forked: bool = False) -> None:
    """A local worker: serve tasks from `conn` until it sends None or the scheduler goes away (`forked`: start_runner's)."""
    try:
        setup = conn.recv()  # see start_runner
    except (EOFError, OSError):
        return
    sending = threading.Lock()  # the heartbeat thread and the trials share the connection

    def send(message: Message) -> None:
        with sending:
            conn.send(message)

    from gpufill.engine.hardware import context_bytes

    runner = start_runner(setup, forked=forked)
    runner.on_progress = send
    # Heartbeats count from here: start-up (imports, CUDA) is not a hang. GPU admission counts the context's memory.
    send(Ready(os.getpid(), context_bytes(setup["device"])))
    threading.Thread(target=_heartbeat, args=(send,), name="gpufill-heartbeat", daemon=True).start()
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):  # the scheduler died: nothing to report to
            return
        if task is None:  # told to stop: nothing to flush, so skip torch's interpreter teardown (~0.5 s)
            os._exit(0)
        try:
            send(runner.run_task(task))
        except (BrokenPipeError, OSError):
            return
        release_cached_memory(setup["device"])


def release_cached_memory(device: str) -> None:
    """Between tasks a GPU worker gives its allocator's cached blocks back, so an idle worker holds
    only its context and GPU admission's sum of running packs is the GPU's real use."""
    if device.startswith("cuda"):
        import torch

        torch.cuda.empty_cache()


def _heartbeat(send: Callable[[Message], None]) -> None:
    """Runs beside the trials: a process that is stopped, frozen or deadlocked in C stops sending."""
    while True:
        time.sleep(HEARTBEAT_EVERY_S)
        try:
            send(Heartbeat(time.time()))
        except (BrokenPipeError, OSError):
            return


class TrialRunner:
    """Loads the campaign's data once per process and runs tasks on it: one trial, or a pack of one shape's
    trials. What a trial is and how it trains is forecasting's (forecasting/run.py, packs.py); this is where
    and with which data."""

    def __init__(self, spec_payload: dict[str, Any], base_dir: Path, *, threads: int, device: str, tune_cache: str | None = None,
                 projects: Mapping[str, Any] | None = None):
        """`projects`: the data the scheduler loaded and listed the trials from (executors/base.py: hand_data), or None:
        read from the file at the first trial."""
        from gpufill.campaign.spec.spec import CHECKED, CampaignSpec

        self.spec = CampaignSpec.model_validate(spec_payload, context=CHECKED)
        self.base_dir = base_dir
        self.threads = threads
        self.device = device
        self.tune_cache = tune_cache
        self._projects: dict[str, Any] | None = dict(projects) if projects is not None else None
        self._prints: dict[str, str] = {}
        """Fingerprints of the loaded projects (and "*": all of them, as a global-mode trial's id holds them)."""
        self._reread = False
        """Whether the data was read again during the current task (a difference is looked into once per task)."""
        self._pruning: dict[str, Any] | None = None
        """The current task's search pruner: its settings and the earlier rounds' trials per project (campaign/trials/pruning.py)."""
        self._read_at = time.monotonic()
        self._windows: dict[tuple[str, int, str, bool], Any] = {}
        """(project, lookback, scaling, folded) -> its windows, each cut and scaled once per process."""
        self.on_progress: Callable[[Progress], None] | None = None
        """Where a local worker sends which trials started and finished within a task (None: nowhere)."""

    def setup(self, trial: Trial) -> TrialSetup:
        """How `trial` trains on this worker: the campaign's settings and recipe, this worker's device, threads and tune
        cache. On a CPU an "auto" precision is fp32, not timed against bf16 (`timed_precision=False`): timing flips with
        the machine's load, and a study killed and resumed under load differed from an uninterrupted one on 16 of 36
        trials (up to 1e-3 relative). A study's numbers are fixed by its file, not by the second it started; the other
        choices that change them are the lane's (threads) or taken once per workdir and shape (a pack's size and kind,
        whose members train the same numbers at any size). `train.precision: bf16` asks for bf16."""
        from gpufill.forecasting.run import trial_setup

        base = self.spec.base_config(trial.train, trial.seed)
        if self.device == "cpu":
            base = dataclasses.replace(base, timed_precision=False)
        return trial_setup(trial, self.spec.recipe(trial.family, trial.train), base, threads=self.threads,
                           device=self.device, tune_cache=self.tune_cache, memory_margin=self.spec.resources.memory_margin,
                           refit=self.spec.train.refit)

    def note(self, message: Progress) -> None:
        """Trials started, or one ended (or a pack size measured): so a crash fails only the trial that was running."""
        if self.on_progress is not None:
            self.on_progress(message)

    def attempt(self, trial: Trial, run: Callable[[], TrialResult]) -> Outcome:
        """One trial's work, reported as it starts and ends."""
        self.note(Started((trial.trial_id,)))
        outcome = attempt(trial, run)
        self.note(TrialEnded(outcome))
        return outcome

    def projects(self) -> dict[str, Any]:
        """The campaign's projects: the scheduler's, where it handed them over, else loaded once per process (and again
        where a trial's id names other data: `check_data`). The scheduler loaded the same data before the run: failing
        here, the data changed under the run (a file missing, unreadable, broken): an environment failure."""
        if self._projects is None:
            self._read_at = time.monotonic()
            try:
                self._projects = self.spec.data.load(self.base_dir)
            except Exception as error:
                raise EnvironmentFailure(f"the data could not be loaded: {error}") from error
        return self._projects

    def check_data(self, trial: Trial) -> None:
        """Raise EnvironmentFailure unless the loaded data is the data `trial`'s id names (read again once on a difference)."""
        wanted = trial.data_fingerprint
        if not wanted:  # a store older than fingerprints: nothing to compare
            return
        if self._fingerprint(trial.project) == wanted:
            return
        if not self._reread and time.monotonic() - self._read_at >= REREAD_EVERY_S:  # what this process read may be older than the file
            self._projects, self._prints, self._windows, self._reread = None, {}, {}, True
        found = self._fingerprint(trial.project)
        if found != wanted:
            what = "the data" if trial.is_global else f"the data of project {trial.project}"
            raise EnvironmentFailure(f"{what} {environment.CHANGED} (fingerprint {found} now, {wanted} in the trial's id): "
                                     "not trained on data its id does not name")

    def _fingerprint(self, project: str) -> str:
        if project not in self._prints:
            from gpufill.campaign.trials.trials import data_digest

            projects = self.projects()
            if project == GLOBAL_PROJECT:
                self._prints[project] = data_digest({name: self._fingerprint(name) for name in projects})
            else:
                self._prints[project] = projects[project].fingerprint() if project in projects else "(project missing)"
        return self._prints[project]

    def windows(self, project: str, lookback: int, scaling: str = "project", *, folded: bool = False) -> Any:
        """The project's windows at `lookback`, scaled per window by `scaling` (each cut and scaling made once);
        `folded`: with the validation region folded into training (a refit's)."""
        from gpufill.forecasting.data.window_scaling import scale_windows

        projects = self.projects()
        key = (project, lookback, scaling, folded)
        if key not in self._windows:
            cut = (self.windows(project, lookback, folded=folded) if scaling != "project"
                   else self.spec.windows(projects[project], lookback, folded=folded))
            self._windows[key] = scale_windows(cut, scaling)  # the cut itself for "project"
        return self._windows[key]

    def trial_windows(self, trial: Trial, project: str | None = None, *, folded: bool = False) -> Any:
        """The windows `trial` trains on (of `project` in global mode), scaled as its recipe says: of the data its id
        names; `folded`: those a refit trains on."""
        self.check_data(trial)
        return self.windows(project or trial.project, trial.lookback, self.spec.recipe(trial.family, trial.train).scaling, folded=folded)

    def folded_windows(self, trial: Trial, setup: Any) -> list[Any] | None:
        """The windows `trial`'s refit trains on (every project's in global mode), or None where it does not refit: a
        refit needs `train.refit`, a network and a validation region to fold in."""
        if not setup.refit or not self.spec.task.split.val:
            return None
        return [self.trial_windows(trial, name, folded=True) for name in (self.projects() if trial.is_global else [trial.project])]

    def run_task(self, task: Task) -> TaskEnded:
        """A task is one trial, or trials to train one at a time or as one fused pack: as its `PackOrder` says (the
        policy's decision; policy/policy.py)."""
        trials, waiting, self._reread = list(task.trials), [], False
        self._pruning = task.pruning  # a pruned search's settings and its earlier rounds (campaign/trials/pruning.py)
        order = task.pack
        if order.size == 1:  # classical and global trials, an unfused shape, a lone trial of a shape not measured yet
            unfused = PackEntry(1, order.reason) if order.reason else None
            return TaskEnded(tuple(self.attempt(t, lambda t=t: self.run(t, pack=unfused)) for t in trials))
        if len(trials) > 1:  # a pack reads every trial's data before any trains: check it first
            waiting = self._not_ready(trials)  # these wait for the environment; the rest pack
            trials = [t for t in trials if t.trial_id not in {o.trial_id for o in waiting}]
        if not trials:
            return TaskEnded(tuple(waiting))
        from gpufill.campaign.worker.packs import run_pack

        ended = run_pack(self, trials, order)
        return dataclasses.replace(ended, outcomes=(*waiting, *ended.outcomes))

    def _not_ready(self, trials: list[Trial]) -> list[Outcome]:
        """Failures of the trials whose data is not what their ids name (or cannot be read)."""
        waiting = []
        for trial in trials:
            try:
                self.check_data(trial)
            except EnvironmentFailure as error:
                waiting.append(failure(trial, error))
        return waiting

    def run(self, trial: Trial, *, pack: PackEntry | None = None) -> TrialResult:
        """`trial` alone (or, in global mode, over every project) on the data its id names."""
        from gpufill.forecasting.run import run_alone, run_global

        setup = self.setup(trial)
        windows = [self.trial_windows(trial, name) for name in self.projects()] if trial.is_global else [self.trial_windows(trial)]
        watch, folded = self.watch(trial, windows), self.folded_windows(trial, setup)
        if trial.is_global:
            return run_global(trial, windows, setup, where=self.spec.path and str(self.spec.path), watch=watch, folded=folded)
        return run_alone(trial, windows[0], setup, pack=pack, watch=watch, folded=folded[0] if folded else None)

    def watch(self, trial: Trial, windows: list[Any]) -> Any:
        """What watches `trial`'s network train on `windows`: the current task's search pruner (campaign/trials/pruning.py),
        or None."""
        if not self._pruning or trial.kind != "neural":
            return None
        from gpufill.campaign.trials.pruning import PrunerWatch

        return PrunerWatch(self._pruning["settings"], self._pruning["history"].get(trial.project, []), windows)


if __name__ == "__main__":  # started by executors/local.py: python -m gpufill.campaign.worker.worker FD
    import sys

    worker_main(Connection(int(sys.argv[1])))

