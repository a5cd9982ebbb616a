"""`Campaign`: the Python API behind `gpufill run`, `status`, `results`.

A run checks everything it can before it touches the workdir (the file, the data, every
project's length against the longest lookback, the resources, and that the workdir
belongs to this campaign), so a refused run never modifies an existing store.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import sqlite3
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from gpufill.campaign.executors import Executor, LaneRequest, make_executor
from gpufill.campaign.executors.local import plan_here
from gpufill.campaign.policy.lanes import Lane
from gpufill.campaign.store.lock import WorkdirLock
from gpufill.campaign.run.scheduler import RunOutcome, Scheduler, Snapshot
from gpufill.campaign.spec import build_check as build_child
from gpufill.campaign.spec.build_check import BuildCheck, deferred
from gpufill.campaign.spec.spec import CampaignSpec, load_campaign
from gpufill.campaign.run.stopping import RunInterrupted, from_exception, signals_interrupt
from gpufill.campaign.results.reading import best_per_project, find_workdir, read_jobs, read_results, read_status, read_trials
from gpufill.campaign.store.store import DB_NAME, Counts, Store
from gpufill.campaign.run.startup import Timeline
from gpufill.campaign.store.store_health import check_rows, damaged, is_damage, out_of_space
from gpufill.campaign.spec import user_models
from gpufill.campaign.trials.trials import Trial, expand, id_base
from gpufill.campaign.spec.user_models import checked_elsewhere
from gpufill.campaign.store.workdir import check_paths, delete_run_files, open_run_log
from gpufill.errors import InputError
from gpufill.monitor.sampler import QueueSink, Sampler

if TYPE_CHECKING:
    import pandas as pd
    from gpufill.campaign.run.tracking import Follower

log = logging.getLogger("gpufill.campaign")
# A log file per run, rotated past this size so a long campaign cannot fill the disk.
LOG_MAX_BYTES = 10 * 2**20
LOG_BACKUPS = 3
CPU_THREADS_KEY = "cpu_threads"
"""Meta key: the threads per CPU trial the workdir's first run chose (every later run keeps them)."""


@contextmanager
def run_log(workdir: Path, run_id: int, *, verbose: bool) -> Iterator[Path]:
    """Log this run to WORKDIR/logs/run-<id>.log (DEBUG with verbose, else INFO); never through a link."""
    handler = open_run_log(workdir, run_id, maxBytes=LOG_MAX_BYTES, backupCount=LOG_BACKUPS, encoding="utf-8")
    path = Path(handler.baseFilename)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.setLevel(logging.DEBUG if verbose else logging.INFO)
    root = logging.getLogger("gpufill")
    saved_level = root.level
    root.addHandler(handler)
    root.setLevel(min(handler.level, saved_level) if saved_level else handler.level)
    try:
        yield path
    finally:
        root.removeHandler(handler)
        root.setLevel(saved_level)
        handler.close()


@dataclass(frozen=True, slots=True)
class Prepared:
    """Everything a run needs, checked: the trials and the lanes that will run them."""

    trials: list[Trial]
    lanes: list[Lane]
    warnings: list[str]
    bases: dict[str, Any]
    """base_id -> what every trial of a kind shares (stored once: a row's full configuration is base + row)."""
    fingerprints: dict[str, str]
    """project -> its data fingerprint (part of each trial's id): what a search's proposals are listed with."""
    widths: dict[str, int] = field(default_factory=dict)
    """project -> its networks' input width (`Project.width`): the scheduler fuses trials of one width only."""
    cpu_threads_chosen: bool = False
    """Whether the CPU lane's threads per trial were the lane's own choice (cpu_slots and threads_per_trial auto)."""


class Campaign:
    """A campaign file bound to a workdir."""

    def __init__(self, spec: CampaignSpec, workdir: str | Path | None = None, build_check: BuildCheck | None = None):
        self.spec = spec
        self.workdir = Path(workdir) if workdir is not None else Path(f"gpufill-{spec.name}")
        self.source = str(spec.path) if spec.path else "campaign"
        self.tracking_uri: str | None = None
        """Where this run copies finished trials (MLflow), set by `run`."""
        self.build_check = build_check
        """The child building the file's grid points, if still to be heard from (`prepare` waits for it)."""

    @classmethod
    def from_yaml(cls, path: str | Path, workdir: str | Path | None = None) -> Campaign:
        """The scheduler's side of a campaign file, which never imports torch: its own `module:factory` models are
        checked in a child process, and its grid points built by a lane's zygote (or a child) while the run prepares."""
        with checked_elsewhere(), deferred() if build_child.wanted() else contextlib.nullcontext([]) as builds:
            spec = load_campaign(Path(path))
        return cls(spec, workdir, BuildCheck.prepare(builds, str(spec.path), spec._lines))

    @property
    def base_dir(self) -> Path:
        return self.spec.path.parent if self.spec.path else Path.cwd()

    # -- checks before anything runs ------------------------------------------------------
    def prepare(self, *, gpu_slots: int | Literal["auto"] | None = None, cpu_slots: int | Literal["auto"] | None = None,
                executor: Executor | None = None, timeline: Timeline | None = None, fresh: bool = False) -> Prepared:
        """Trials and lanes; the lanes fit what `executor` runs on (default: this machine) and keep the CPU threads the
        workdir's first run chose (unless `fresh`: the run starts it over)."""
        timeline = timeline or Timeline()
        try:
            prepared = self._prepare(gpu_slots, cpu_slots, executor, timeline, fresh)
        finally:
            check, self.build_check = self.build_check, None
            if check is not None:
                check.close()
        return prepared

    def _prepare(self, gpu_slots: Any, cpu_slots: Any, executor: Executor | None, timeline: Timeline, fresh: bool) -> Prepared:
        projects = self.spec.data.load(self.base_dir)
        timeline.mark("data loaded")
        self.spec.check_trial_count(len(projects), where=self.spec.where("models"))  # the file's projects are known now: before the trials are listed
        too_short, notes = _too_short(projects, self.spec)  # fails before the run on any other data problem, naming the project
        # Each project's data is part of its trials' identity (the same on every machine): an edited file re-runs exactly what it changed.
        fingerprints = {name: project.fingerprint() for name, project in projects.items()}
        # A search lists its trials a round at a time, from the store (campaign/trials/search.py): none before the run.
        trials = expand(self.spec, fingerprints) if self.spec.search is None else []
        if too_short:  # local mode: a project too short for a lookback sits out that lookback; the others run
            kept = [t for t in trials if (t.project, t.lookback) not in too_short]
            if not kept:
                raise InputError(f"every project is too short for every lookback: {next(iter(too_short.values()))}", where=self.source,
                                 field="task.lookback", fix="lower the lookback or horizon, or the split sizes")
            notes.extend(_left_out_notes(too_short, Counter(t.project for t in trials if (t.project, t.lookback) in too_short)))
            trials = kept
        timeline.mark("trials listed")
        bases = {trial.base_id: id_base(self.spec, trial.kind, list(projects)) for trial in {t.kind: t for t in trials}.values()}
        resources = self.spec.resources
        request = LaneRequest(
            kinds=frozenset(trial.kind for trial in trials) if self.spec.search is None else frozenset(map(self.spec.kind, self.spec.models)),
            gpu_slots=gpu_slots if gpu_slots is not None else resources.gpu_slots,
            cpu_slots=cpu_slots if cpu_slots is not None else resources.cpu_slots,
            threads_per_trial=resources.threads_per_trial,
            memory_margin=resources.memory_margin,
            where=self.source,
            trial_counts=Counter(trial.kind for trial in trials),  # a search's: none yet, so one thread each
            cpu_threads_before=None if fresh else self._cpu_threads_before(),
        )
        lanes, warnings = executor.plan(request) if executor is not None else plan_here(request)
        timeline.mark("lanes planned")
        if executor is not None:  # the lanes' imports run while the store is opened; a zygote builds the grid points
            executor.hand_data(projects)
            executor.warm(lanes, self.build_check)
        if self.build_check is not None:
            self.build_check.wait()
            timeline.mark("grid points built")
        warnings = [*(user_models.notes[family] for family in self.spec.models if family in user_models.notes), *notes, *warnings]
        return Prepared(trials=trials, lanes=lanes, warnings=warnings, bases=bases, fingerprints=fingerprints,
                        widths={name: project.width for name, project in projects.items()},
                        cpu_threads_chosen=request.cpu_slots == "auto" and request.threads_per_trial == "auto")

    def _cpu_threads_before(self) -> int | None:
        """The threads a CPU trial got in this workdir's first run, where its lane chose them (meta `cpu_threads`)."""
        if not (self.workdir / DB_NAME).exists():
            return None
        try:
            check_paths(self.workdir)  # a link is not read through either
            store = Store.open(self.workdir)
        except (InputError, sqlite3.Error, OSError):  # a link or a damaged store is refused, in one line, when the run opens it
            return None
        try:
            value, ran = store.meta(CPU_THREADS_KEY), store.last_run() is not None
        except sqlite3.Error:
            return None
        finally:
            store.close()
        if value is None:  # runs before the choice was kept trained at one thread a trial
            return 1 if ran else None
        return int(value) if value.isdigit() and int(value) > 0 else None

    def check_workdir(self, *, fresh: bool) -> None:
        """Refuse a workdir that holds another campaign (unless fresh); reads only."""
        if fresh or not (self.workdir / DB_NAME).exists():
            return
        store = Store.open(self.workdir)
        try:
            owner = store.meta("campaign_name")
            if owner is None or owner == self.spec.name:
                check_rows(store.db, store.path)  # the scheduler parses every row's params and train: an unreadable one is one line
        finally:
            store.close()
        if owner is not None and owner != self.spec.name:
            raise InputError(
                f"workdir belongs to campaign {owner!r}, not {self.spec.name!r}",
                where=str(self.workdir),
                field="--workdir",
                fix="pass another --workdir, or --fresh to start this one over there",
            )

    # -- running ------------------------------------------------------------------------
    def run(
        self,
        *,
        gpu_slots: int | Literal["auto"] | None = None,
        cpu_slots: int | Literal["auto"] | None = None,
        fresh: bool = False,
        command: str = "gpufill run",
        verbose: bool = False,
        executor: str | Executor = "local",
        address: str | None = None,
        on_start: Callable[[Prepared, int], None] | None = None,
        on_update: Callable[[Snapshot], None] | None = None,
        mlflow: str | None = None,
    ) -> RunOutcome:
        """Run (or resume) the campaign: done trials are kept, interrupted ones retried.

        `executor` is local (worker processes here), inline, ray (a local Ray, or the cluster at
        `address`) or slurm (jobs through submitit, settings in resources.slurm), or an Executor of your
        own (executors/base.py; tests/campaign/executors/test_executor_suite.py is its checklist); the store,
        the trial ids and resuming are the same whichever runs the trials. `mlflow`: a tracking
        URI finished trials are copied to (overrides the file's tracking.mlflow).
        """
        self.tracking_uri = tracking_uri(self.spec, mlflow, self.workdir)
        timeline = Timeline()
        timeline.mark("run begins (interpreter, imports, campaign file)")
        follower = self._follower()  # its imports (MLflow, the report's) run while this run prepares
        runs = executor if not isinstance(executor, str) else make_executor(executor, spec=self.spec, base_dir=str(self.base_dir),
                                                                            workdir=self.workdir, address=address)
        try:
            return self._locked_run(runs, gpu_slots, cpu_slots, fresh, command, verbose, on_start, on_update, timeline, follower)
        except (sqlite3.Error, OSError) as error:
            if out_of_space(error):
                raise InputError(f"the disk holding the workdir is full ({error}); the run stopped, done trials are kept",
                                 where=str(self.workdir), field="disk",
                                 fix=f"free space there (or pass another --workdir), then resume with: {self.resume_command(command)}") from None
            if is_damage(error):
                raise damaged(self.workdir / DB_NAME, error) from None
            raise
        finally:
            runs.shutdown()  # the scheduler's own shutdown aside: e.g. leave a Ray cluster joined to plan the lanes
            if follower is not None:
                follower.close()  # one that never began (a refused run) ends, having written nothing

    def _follower(self) -> Follower | None:
        """With a tracking URI, the child that exports finished trials (campaign/run/tracking.py), started now."""
        if self.tracking_uri is None:
            return None
        from gpufill.campaign.run.tracking import Follower

        experiment = (self.spec.tracking.experiment if self.spec.tracking else None) or self.spec.name
        return Follower(self.workdir, self.tracking_uri, experiment)

    def resume_command(self, command: str) -> str:
        """What to type to carry on where a stopped run left off."""
        return "gpufill demo" if command == "gpufill demo" else f"gpufill run {self.source} --workdir {self.workdir}"

    def _locked_run(self, runs: Executor, gpu_slots: Any, cpu_slots: Any, fresh: bool, command: str, verbose: bool, on_start: Any,
                    on_update: Any, timeline: Timeline, follower: Follower | None) -> RunOutcome:
        prepared = self.prepare(gpu_slots=gpu_slots, cpu_slots=cpu_slots, executor=runs, timeline=timeline, fresh=fresh)
        with WorkdirLock(self.workdir, command) as lock:  # before --fresh deletes anything: one run per workdir
            check_paths(self.workdir)  # a link where the run writes: refused before anything is written or deleted
            self.check_workdir(fresh=fresh)
            if fresh:
                self.delete_store()
            store = Store.create(self.workdir)
            try:
                run_id = store.begin_run(command)
                if lock.taken_over:
                    prepared.warnings.append(f"took the workdir over from a run that stopped without releasing it (pid {lock.taken_over.get('pid')} "
                                             f"on {lock.taken_over.get('host')})")
                with run_log(self.workdir, run_id, verbose=verbose), self._tracked(store, run_id, follower) as tracked:
                    timeline.start_logging()
                    return tracked(self._run(store, run_id, prepared, runs, on_start, on_update, timeline))
            finally:
                store.close()

    @contextmanager
    def _tracked(self, store: Store, run_id: int, follower: Follower | None) -> Iterator[Callable[[RunOutcome], RunOutcome]]:
        """With a tracking URI, a follower exports finished trials while the run goes on (campaign/run/tracking.py); at the
        end it gets a last pass, and the outcome says what reached the server (an interrupted run waits less)."""
        if follower is None:
            yield lambda outcome: outcome
            return
        follower.begin()
        said: list[str] = []

        def finished_trials() -> int:
            with contextlib.suppress(sqlite3.Error):
                counts = store.counts().total
                return counts["done"] + counts["failed"] + counts["pruned"]
            return 0

        def finished(outcome: RunOutcome) -> RunOutcome:
            said.append(follower.finish(finished_trials()))
            outcome.tracking = said[0]
            return outcome

        try:
            yield finished
        finally:
            if not said:  # stopped before its end (Ctrl-C, a signal): a short last pass
                from gpufill.campaign.run.tracking import INTERRUPTED_PASS_S

                said.append(follower.finish(finished_trials(), wait_s=INTERRUPTED_PASS_S))
            with contextlib.suppress(sqlite3.Error):
                store.event("tracking", said[0], run_id=run_id)
            log.info(said[0])

    def _run(self, store: Store, run_id: int, prepared: Prepared, executor: Executor, on_start: Any, on_update: Any,
             timeline: Timeline) -> RunOutcome:
        # base_dir: where the file's relative data paths start, absolute (a later `gpufill forecast` may run from elsewhere)
        store.set_meta({"campaign_name": self.spec.name, "campaign_file": self.source, "spec": self.spec.model_dump_json(),
                        "base_dir": str(self.base_dir.resolve())})
        cpu = next((lane for lane in prepared.lanes if lane.name == "cpu"), None)
        if cpu is not None and prepared.cpu_threads_chosen and store.meta(CPU_THREADS_KEY) is None:
            store.set_meta({CPU_THREADS_KEY: str(cpu.threads)})  # what every later run of this workdir keeps
        lane_of = {kind: lane.queue for lane in prepared.lanes for kind in lane.kinds}  # pending trials belong to a queue
        extras: dict[str, Any] = {}
        search, refill = self._search(store, prepared, lane_of, extras)
        added, skipped = store.sync_trials(prepared.trials, lane_of, prepared.bases)
        recovered = store.recover_interrupted(run_id)
        waiting, why = store.waiting_on_environment()
        if waiting:  # what this run retries that an earlier one could not run
            prepared.warnings.append(f"{waiting} trials an earlier run left pending after environment failures (not counted as attempts) "
                                     f"are run again; the last failure: {why}")
        timeline.mark("store ready")
        orphans = store.orphan_jobs(run_id)
        if orphans:  # their results would never be collected: their trials are retried instead
            executor.cancel_jobs(orphans)
            prepared.warnings.append(f"cancelled {len(orphans)} batch job(s) a stopped run left behind: {', '.join(orphans)}")
        for message in [*prepared.warnings, f"{added} new trials, {skipped} no longer in the file, {recovered} interrupted ones retried",
                        f"trial timeout: {describe_timeout(self.spec.resources)}"]:
            store.event("run", message, run_id=run_id)
            log.info(message)
        for lane in prepared.lanes:
            log.info("lane %s: %d slots x %d threads on %s (%s): %s", lane.name, lane.slots, lane.threads, lane.device, ", ".join(lane.kinds), lane.reason)
        if on_start is not None:
            on_start(prepared, run_id)
        prepared.trials.clear()  # in the store now: the scheduler works from its rows (36,000 Trial objects are ~20 MB)
        pack_size = self.spec.resources.pack_size
        queue = QueueSink()
        sampler = Sampler(interval=1.0, gpu_source="auto", pids=executor.pids, sink=queue)
        scheduler = Scheduler(
            store, executor, prepared.lanes, retries=self.spec.resources.retries, run_id=run_id,
            pack_size=None if pack_size == "auto" else int(pack_size), on_update=on_update, samples=queue.drain,
            trial_timeout=self.spec.resources.trial_timeout, heartbeat_timeout=self.spec.resources.heartbeat_timeout,
            timeline=timeline, refill=refill, task_extras=extras, widths=prepared.widths,
        )
        try:
            with signals_interrupt() as stop_request, sampler:
                outcome = scheduler.run(check_stop=stop_request.check)
        except KeyboardInterrupt as stop:  # Ctrl-C, SIGTERM, SIGHUP: the scheduler's finally has stopped the workers
            returned = store.recover_interrupted(run_id)  # in-flight trials go back to pending
            store.end_run(run_id, "interrupted")
            counts = store.counts().total
            name, code = from_exception(stop)
            log.info("run %d interrupted by %s: %d in flight returned to pending", run_id, name, returned)
            raise RunInterrupted(name, code, returned, counts["done"], counts["pending"]) from None
        except BaseException:
            # In-flight trials go back to pending; when the store cannot be written (a full disk) the
            # next run does it instead (it retries the trials a stopped run left running).
            with contextlib.suppress(sqlite3.Error, OSError):
                store.recover_interrupted(run_id)
                store.end_run(run_id, "interrupted")
            raise
        if search is not None:
            message = (f"search: {search.proposed} of {self.spec.search.trials} configurations proposed in {len(search.rounds)} rounds"
                       + (" (the space holds no other)" if search.exhausted else ""))
            store.event("run", message, run_id=run_id)
            log.info(message)
        if self.spec.ensemble is not None:  # combined and scored from what is finished, kept beside the trials
            from gpufill.campaign.results.ensembles import declared_meta

            store.set_meta(declared_meta(store, self.spec))
        store.end_run(run_id, "failed" if outcome.failed else "incomplete" if outcome.waiting else "done")
        log.info("run %d ended: %d done, %d failed, %d retried, %d environment failures (not counted), %d left waiting, %d worker crashes in %.1f s",
                 run_id, outcome.done, outcome.failed, outcome.retried, outcome.environment, outcome.waiting, outcome.crashed, outcome.elapsed_s)
        return outcome

    def _search(self, store: Store, prepared: Prepared, lane_of: dict[str, str], extras: dict[str, Any]) -> tuple[Any, Callable[[], bool] | None]:
        """A search campaign's proposals so far (replayed from the store) listed in `prepared`, and the scheduler's
        refill that proposes the next round when one is trained; (None, None) for a grid. `extras`: what every task
        carries, kept current here (a pruner's earlier rounds)."""
        if self.spec.search is None:
            return None, None
        from gpufill.campaign.trials.search import Search

        search = Search(self.spec, prepared.fingerprints, max_attempts=self.spec.resources.retries + 1)
        projects = list(prepared.fingerprints)

        def listed() -> list[Trial]:
            trials = search.trials()
            prepared.bases.update({t.base_id: id_base(self.spec, t.kind, projects) for t in {t.kind: t for t in trials}.values()})
            return trials

        def pruning() -> None:
            found = search.pruning(store)
            if found is not None:
                extras["pruning"] = found

        search.advance(store)
        prepared.trials.extend(listed())
        pruning()

        def refill() -> bool:
            if not search.advance(store):
                return False
            store.sync_trials(listed(), lane_of, prepared.bases)  # the file's trials: every round's so far
            pruning()
            return True

        return search, refill

    def delete_store(self) -> list[str]:
        """--fresh: the store and its run logs, nothing else (campaign/store/workdir.py); the names deleted."""
        return delete_run_files(self.workdir)

    # -- reading ------------------------------------------------------------------------
    def status(self) -> Counts:
        return read_status(self.workdir)

    def results(self) -> pd.DataFrame:
        return read_results(self.workdir)


def tracking_uri(spec: CampaignSpec, override: str | None, workdir: Path) -> str | None:
    """The MLflow URI a run copies its trials to (--mlflow, else tracking.mlflow), checked before anything runs, its
    local path made absolute against the working directory (gpufill/mlflow_uri.py); never the workdir's own store."""
    uri = override or (spec.tracking.mlflow if spec.tracking else None)
    if uri is None:
        return None
    from gpufill.mlflow_uri import resolve_tracking_uri

    field = "--mlflow" if override else "tracking.mlflow"
    uri = resolve_tracking_uri(uri, field=field, stores=[workdir / DB_NAME])
    if importlib.util.find_spec("mlflow") is None:
        raise InputError("tracking to MLflow needs the mlflow package", where=uri, field=field, fix="pip install 'gpufill[mlflow]'")
    return uri


def describe_timeout(resources: Any) -> str:
    """The time limits of the plan, in words (printed when a run starts)."""
    from gpufill.campaign.run.scheduler import AUTO_TIMEOUT_FACTOR, AUTO_TIMEOUT_FLOOR_S

    if resources.trial_timeout == "auto":
        limit = (f"auto: {AUTO_TIMEOUT_FACTOR:g}x the slowest finished trial of the same shape, at least {AUTO_TIMEOUT_FLOOR_S:g} s "
                 "(none until a trial of the shape finishes)")
    else:
        limit = f"{resources.trial_timeout:g} s per trial (resources.trial_timeout)"
    return f"{limit}; a worker silent for {resources.heartbeat_timeout:g} s is stopped (resources.heartbeat_timeout); either is retried under retries"


def describe_lanes(lanes: Sequence[Lane]) -> list[dict[str, Any]]:
    return [{"lane": lane.name, "slots": lane.slots, "threads": lane.threads, "device": lane.device, "runs": list(lane.kinds), "reason": lane.reason} for lane in lanes]


def demo_campaign_path() -> Path:
    """examples/demo.yaml of the source checkout gpufill runs from."""
    path = Path(__file__).resolve().parents[4] / "examples" / "demo.yaml"
    if not path.exists():
        raise InputError("the demo campaign file is not next to this installation", where=str(path), field="demo", fix="run from a source checkout (pip install -e .) or pass a campaign to `gpufill run`")
    return path


LEFT_OUT_LISTED = 5
"""Left-out projects named one warning each; more are one summary warning (20,000 tiny projects: one line, not 20,000)."""


def _left_out_notes(too_short: dict[tuple[str, int], str], trials: Counter[str]) -> list[str]:
    """The warnings for the (project, lookback) pairs too short to run, in time linear in their number."""
    lookbacks: dict[str, list[int]] = {}
    for project, lookback in too_short:
        lookbacks.setdefault(project, []).append(lookback)
    names = sorted(lookbacks)

    def one(name: str) -> str:
        shown = sorted(lookbacks[name])
        count = f"{trials[name]} trial" + ("s" if trials[name] != 1 else "")
        return f"project {name} left out at lookback {', '.join(map(str, shown))} ({count}): {too_short[(name, shown[0])]}"

    if len(names) <= LEFT_OUT_LISTED:
        return [one(name) for name in names]
    return [f"{len(names):,} projects left out at one or more lookbacks ({sum(trials.values()):,} trials), too short for them; "
            f"the first {LEFT_OUT_LISTED}: " + "; ".join(one(name) for name in names[:LEFT_OUT_LISTED])]


def _too_short(projects: dict[str, Any], spec: Any) -> tuple[dict[tuple[str, int], str], list[str]]:
    """(project, lookback) pairs whose series cannot hold a training window and the splits, with the reason,
    and a note per project that global mode pads. Local mode leaves too-short pairs out; in global mode
    (which pads short series) a project too short even for that, and any other data problem, is raised."""
    task = spec.task
    found: dict[tuple[str, int], str] = {}
    padded: dict[str, list[int]] = {}
    unvalidated: set[str] = set()
    for project in projects.values():
        for lookback in sorted(spec.every_lookback, reverse=True):
            try:
                layout = spec.window_layout(project, lookback)
            except InputError as error:
                if task.mode != "local" or error.field != "length":
                    raise
                found[(project.name, lookback)] = error.problem
            else:
                if layout.shift:
                    padded.setdefault(project.name, []).append(lookback)
                    if task.split.val and len(layout.val_t) == 0:
                        unvalidated.add(project.name)
                    continue
                break  # a shorter lookback fits too
    return found, _padded_notes(projects, padded, unvalidated)


def _padded_notes(projects: dict[str, Any], padded: dict[str, list[int]], unvalidated: set[str]) -> list[str]:
    """One note for the padded projects, however many (a data set of short series padded 52 three-line warnings
    before the run): the count, the shortest series and how many also train without validation."""
    if not padded:
        return []
    if len(padded) == 1:
        (name, lookbacks), = padded.items()
        return [f"project {name} (length {projects[name].length}) is left-padded at lookback {', '.join(map(str, sorted(lookbacks)))}: "
                "shorter than a full lookback before its first training target; its padded inputs are 0 after scaling and its targets are all real"
                + ("; too short for the validation split as well, it trains on its whole history (the other projects validate)" if unvalidated else "")]
    shortest = min(padded, key=lambda name: (projects[name].length, name))
    lookbacks = sorted({lookback for found in padded.values() for lookback in found})
    return [f"{len(padded):,} projects are left-padded at lookback {', '.join(map(str, lookbacks))} (the shortest: {shortest}, length "
            f"{projects[shortest].length}): shorter than a full lookback before their first training target; padded inputs are 0 after scaling "
            "and targets are all real"
            + (f"; {len(unvalidated):,} of them are too short for the validation split as well and train on their whole history (the other "
               "projects validate)" if unvalidated else "")]
