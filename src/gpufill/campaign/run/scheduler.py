"""The scheduler: the one process that decides what runs next, where, and writes the store.

Per idle worker it picks the next runnable trial of that worker's lane, preferring the
shape the worker just ran, and for neural trials adds same-shape trials to make a fused
pack: of the size the worker measured for that shape, or, for a shape not sized yet, up
to `policy.PROBE_PACK` so the worker can measure (one worker per shape; the size is kept in the
store for the rest of the campaign). The GPU lane admits tasks of any shapes while their
measured peak memory and the workers' CUDA contexts fit its budget; a shape not measured
yet runs alone first (policy/admission.py). Failures and worker crashes are retried up to the limit; everything else goes on.
Failures of the environment (data missing or changed, a full disk, a worker killed from outside) use no
attempt: the trial waits for the environment (policy/environment.py).
How tasks run (processes, Ray actors, Slurm jobs) is the executor's business
(executors/base.py); the scheduler is the store's only writer, whichever executor runs.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from gpufill.campaign.executors.base import Crashed, Executor, Finished, Worker
from gpufill.campaign.policy.admission import META_KEY, Running, ShapeBook
from gpufill.campaign.policy import environment
from gpufill.campaign.policy.lanes import Lane
from gpufill.campaign.policy.messages import Outcome, PackOrder, Task
from gpufill.campaign.policy.policy import DispatchPolicy
from gpufill.campaign.run import progress
from gpufill.campaign.run.progress import LaneProgress, RunOutcome, Snapshot
from gpufill.campaign.policy.queue import Queued, ShapeQueue
from gpufill.campaign.run.startup import Timeline
from gpufill.campaign.store.store import Store
from gpufill.monitor.alerts import AlertWatch

__all__ = ["LaneProgress", "RunOutcome", "Scheduler", "Snapshot"]  # the progress types live in progress.py; importable from here too

log = logging.getLogger("gpufill.scheduler")

# Alerts look back this far, every so often (an episode is reported once).
ALERT_WINDOW_S = 600.0
ALERT_EVERY_S = 30.0

# trial_timeout "auto": this many times the slowest finished trial of the shape, and never less
# than the floor (a fresh worker's start-up and a cold cache fit under it).
AUTO_TIMEOUT_FACTOR = 10.0
AUTO_TIMEOUT_FLOOR_S = 60.0


class Scheduler:
    def __init__(
        self,
        store: Store,
        executor: Executor,
        lanes: list[Lane],
        *,
        retries: int,
        run_id: int,
        pack_size: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        on_update: Callable[[Snapshot], None] | None = None,
        update_every_s: float = 0.5,
        samples: Callable[[], list[dict[str, Any]]] | None = None,
        trial_timeout: float | str = "auto",
        heartbeat_timeout: float = 120.0,
        timeline: Timeline | None = None,
        refill: Callable[[], bool] | None = None,
        task_extras: dict[str, Any] | None = None,
        widths: Mapping[str, int] | None = None,
    ):
        self.store, self.executor, self.lanes = store, executor, lanes
        self.max_attempts = retries + 1
        self.run_id = run_id
        self.clock, self.wall_clock = clock, wall_clock
        self.on_update = on_update
        self.update_every_s = update_every_s
        self.queue_of_kind = {kind: lane.queue for lane in lanes for kind in lane.kinds}
        # One queue per lane, except that every per-GPU lane takes from the shared "gpu" queue.
        self.widths = dict(widths or {})
        """project -> its networks' input width: only trials of one width fuse (the queue keeps them apart)."""
        self.queue: dict[str, ShapeQueue] = {lane.queue: ShapeQueue(widths=self.widths) for lane in lanes}
        # shape -> measured pack size; a fixed resources.pack_size (1 = no fusion) presets every shape.
        self.book = ShapeBook.from_json(store.meta(META_KEY), fixed_pack_size=pack_size)
        self.policy = DispatchPolicy(self.book)
        self.tracked: dict[str, Queued] = {}
        """This run's trials in flight (sent, not yet recorded) by id, with their attempts; a waiting trial is only an id in its queue."""
        self.started_at: dict[str, float] = {}
        self.finished_this_run: dict[str, int] = {lane.name: 0 for lane in lanes}
        self.outcome = RunOutcome(done=0, failed=0, retried=0, crashed=0, elapsed_s=0.0)
        # Monitoring: rows a Sampler queued (drained here, the store's one writer) and alerts over them.
        self.drain_samples = samples
        self.alerts = AlertWatch(window_s=ALERT_WINDOW_S, every_s=ALERT_EVERY_S)
        self.job_states: dict[str, tuple[str, str]] = {}
        """Batch job id -> (state, detail) as last written to the store."""
        self.trial_timeout = trial_timeout
        self.heartbeat_timeout = heartbeat_timeout
        self.timeline = timeline or Timeline()
        self.shape_seconds: dict[str, float] = {}
        """Slowest finished trial per shape: what an "auto" time limit is derived from."""
        self.refill = refill
        """Called when nothing is queued or running (a search's next round): True when it added runnable trials to the store."""
        self.task_extras = task_extras if task_extras is not None else {}
        """Sent with every task as they are when it is sent (a pruned search's earlier rounds: `refill` updates them)."""
        self.environment = environment.EnvironmentWait(clock=clock, patience_s=environment.PATIENCE_S, trial_limit=environment.TRIAL_LIMIT)

    # -- the loop -----------------------------------------------------------------------
    def run(self, check_stop: Callable[[], None] = lambda: None) -> RunOutcome:
        """Runs every runnable trial; `check_stop` raises (a signal's Interrupted) at the top of an iteration."""
        start = self.clock()
        self._queue_runnable()
        # A search's later rounds may need any lane: all of them start.
        self.executor.start([lane for lane in self.lanes if self.queue[lane.queue] or self.refill is not None])
        self.timeline.mark("workers started")
        if any(worker.ready for lane in self.lanes for worker in self.executor.idle(lane)):  # inline: ready as they start
            self.timeline.mark("first worker ready")
        last_update = -float("inf")
        try:
            while any(self.queue.values()) or self.executor.busy() or self._refilled():
                check_stop()
                if self.environment.exhausted() and any(self.queue.values()):
                    self._stop_waiting()
                self._dispatch()
                for outcome in self.executor.poll(timeout=0.1):
                    self._record(outcome)
                    self.timeline.mark("first task done")
                for worker in self.executor.busy():
                    if worker.ready:
                        self.timeline.mark("first worker ready")
                    self._learn_measured(worker, worker.task)
                self._watch()
                self._sync_jobs()
                self._monitor()
                if self.on_update is not None and self.clock() - last_update >= self.update_every_s:
                    self.on_update(self.snapshot(self.clock() - start))
                    last_update = self.clock()
        finally:
            self.timeline.mark("last task done")
            self.executor.shutdown()
            self._sync_jobs()  # jobs cancelled by the shutdown
            self.timeline.mark("workers stopped")
        self._monitor(final=True)
        self.outcome.elapsed_s = self.clock() - start
        if self.on_update is not None:
            self.on_update(self.snapshot(self.outcome.elapsed_s))
        return self.outcome

    def _queue_runnable(self) -> None:
        for waiting in self.store.runnable(self.max_attempts):
            self.queue[self.queue_of_kind[waiting.kind]].append(waiting)

    def _refilled(self) -> bool:
        """Nothing queued or running: whether `refill` added trials (then they are queued)."""
        if self.refill is None or self.environment.exhausted() or not self.refill():
            return False
        self._queue_runnable()
        return any(self.queue.values())

    def _dispatch(self) -> None:
        if self.environment.paused():  # the environment failed a trial just now: give it a moment
            return
        for lane in self.lanes:
            for worker in self.executor.idle(lane):
                task = self._next_task(lane, worker)
                if task is None:
                    break
                trials, order = task
                self.store.mark_running([q.trial_id for q in trials], lane=lane.name, worker=worker.name, run_id=self.run_id)
                for queued in trials:
                    queued.attempts += 1
                    self.tracked[queued.trial_id] = queued
                    self.started_at[queued.trial_id] = self.clock()
                worker.clock = self.clock  # its heartbeats and time limits are on the scheduler's clock
                if order.size is None:
                    self.book.measuring.add((lane.name, trials[0].shape))
                self.executor.submit(worker, Task(tuple(q.trial for q in trials), order, self.task_extras.get("pruning")))

    def _next_task(self, lane: Lane, worker: Worker) -> tuple[list[Queued], PackOrder] | None:
        """Trials for `worker` (one, or a fused pack of one shape and input width) and how they train: what the policy
        picks, given what the lane runs now."""
        busy = [w for w in self.executor.busy() if w.lane is lane and w.task is not None]
        running = [Running(w.task.shape, w.training if w.started else self.policy.running_size(lane, w.task.shape, len(w.task.trials)))
                   for w in busy if w.task is not None]
        # Every worker process of the lane holds its CUDA context, busy or idle.
        contexts = [w.context_bytes for w in [*busy, *self.executor.idle(lane)]] if lane.memory_budget_bytes is not None else []
        pick = self.policy.next_task(lane, self.queue[lane.queue], worker.last_shape, running, contexts)
        return None if pick is None else (self.store.queued(self.queue[lane.queue].take(pick.shape, pick.count)), pick.order)

    def _learn_measured(self, worker: Worker, task: Task | None) -> None:
        """A pack size (and its peak memory per K) the worker measured, taken as soon as it reports it."""
        if worker.measured_pack is None or task is None:
            return
        pack, worker.measured_pack = worker.measured_pack, None
        self._learn_pack(worker.lane, task.shape, pack)

    def _learn_pack(self, lane: Lane, shape: str, pack: dict[str, Any]) -> None:
        known = self.book.pack_size(lane.name, shape) is not None and (lane.name, shape) not in self.book.measuring
        self.book.learn_pack(lane.name, shape, pack)
        self.store.set_meta({META_KEY: self.book.to_json()})
        if not known:
            self.store.event("pack_size", f"{shape}: {pack['reason']}", run_id=self.run_id)
            log.info("pack size for %s: %s", shape, pack["reason"])

    def _record(self, outcome: Finished | Crashed) -> None:
        if outcome.task is None:
            return
        self._learn_measured(outcome.worker, outcome.task)  # reported mid-task, in the same poll as the end
        trials = {t.trial_id: self.tracked.pop(t.trial_id) for t in outcome.task.trials}  # each is recorded or queued again below
        if isinstance(outcome, Crashed):
            self._crashed(outcome, trials)
            return
        pack = outcome.message.pack
        shape = outcome.task.shape
        if pack is not None and (outcome.worker.lane.name, shape) in self.book.measuring:  # not reported mid-task (Ray, Slurm)
            self._learn_pack(outcome.worker.lane, shape, pack)
        self.book.measuring.discard((outcome.worker.lane.name, shape))
        self._requeue_unstarted([trials[trial_id] for trial_id in outcome.message.returned], outcome.worker.lane)
        # Outcomes the worker sent as each trial ended, and those in its task's end (the same trial at most once).
        outcomes = {o.trial_id: o for o in [*outcome.worker.reported, *outcome.message.outcomes]}
        self._record_outcomes(trials, outcomes.values(), outcome.worker.lane.name)

    def _requeue_unstarted(self, unstarted: list[Queued], lane: Lane) -> None:
        """Trials handed back (or never begun) by their worker: queued again, no attempt counted."""
        if not unstarted:
            return
        self.store.release([q.trial_id for q in unstarted])
        for trial in unstarted:
            trial.attempts -= 1
            self.started_at.pop(trial.trial_id, None)
            self.queue[lane.queue].append(trial.waiting())

    def _crashed(self, outcome: Crashed, trials: dict[str, Queued]) -> None:
        """The worker died with the task: the trials that finished are kept, the one(s) training fail
        (an attempt each), the ones not begun go back to the queue without using a retry."""
        worker, lane_name = outcome.worker, outcome.worker.lane.name
        finished = {o.trial_id: o for o in worker.reported}
        self._record_outcomes(trials, finished.values(), lane_name)
        if worker.reports_progress:
            started = set(worker.started) - set(finished)
            if not started and not finished:  # it died before any trial began (loading data, measuring packs): charge the first
                started = {next(iter(trials))}
        else:  # a Ray call or a Slurm job says nothing until it ends: every trial counts
            started = set(trials) - set(finished)
        unstarted = [t for trial_id, t in trials.items() if trial_id not in started and trial_id not in finished]
        shape = outcome.task.shape if outcome.task else ""
        measuring = (worker.lane.name, shape) in self.book.measuring
        self.book.measuring.discard((worker.lane.name, shape))
        if measuring and len(trials) > 1 and not finished:
            # It died while measuring packs: this shape trains unfused from now on.
            self._learn_pack(worker.lane, shape, {"size": 1, "reason": "unfused: the worker died while measuring fused packs"})
        self.store.event("worker_crashed", f"{worker.name}: {outcome.reason}", run_id=self.run_id, trial_id=next(iter(started), None))
        log.warning("%s: %s; %d trial(s) were training, %d not begun went back to the queue", worker.name, outcome.reason, len(started), len(unstarted))
        self._requeue_unstarted(unstarted, worker.lane)
        for trial_id in started:
            self.outcome.crashed += 1
            seconds = self.clock() - self.started_at.pop(trial_id, self.clock())
            if outcome.environment:  # killed from outside: not the trial's failure
                self._environment_failed(trials[trial_id], outcome.reason, "", seconds)
            else:
                self._failed(trials[trial_id], lane_name, outcome.reason, "", seconds)

    def _record_outcomes(self, trials: dict[str, Queued], outcomes: Iterable[Outcome], lane_name: str) -> None:
        for outcome in outcomes:
            trial = trials[outcome.trial_id]
            self.started_at.pop(trial.trial_id, None)
            # The worker's own clock: excludes its start-up; a pack member's is its share of the pack's training
            # plus its own refit and scoring, as a trial alone counts its whole attempt.
            duration = outcome.seconds
            if not outcome.ok and outcome.environment:
                self._environment_failed(trial, outcome.error, outcome.traceback, duration)
                continue
            if not outcome.ok:
                self._failed(trial, lane_name, outcome.error, outcome.traceback, duration)
                continue
            self.environment.succeeded()
            result = outcome.result
            assert result is not None
            timings = result.timings
            if timings.get("peak_memory_bytes"):  # what this trial's task (a pack: all of it) held at its peak
                self.book.learn_peak(lane_name, trial.shape, int(timings.get("pack_size", 1)), int(timings["peak_memory_bytes"]))
            if duration > self.shape_seconds.get(trial.shape, 0.0):
                self._slowest(trial.shape, duration)
            if result.status == "pruned":
                if self.store.record_pruned(trial.trial_id, result, duration_s=duration):
                    log.debug("pruned %s %s %s in %.2f s: %s", trial.trial_id, trial.trial.family, trial.trial.project, duration, result.events[-1:])
                    self.outcome.pruned += 1
                    self.finished_this_run[lane_name] += 1
                continue
            if self.store.record_done(trial.trial_id, result, duration_s=duration):
                log.debug("done %s %s %s in %.2f s: test mae %.4g", trial.trial_id, trial.trial.family, trial.trial.project, duration, result.metrics["test"]["mae"])
                self.outcome.done += 1
                self.finished_this_run[lane_name] += 1

    # -- hung and overlong trials ---------------------------------------------------------
    def _slowest(self, shape: str, seconds: float) -> None:
        first = shape not in self.shape_seconds
        self.shape_seconds[shape] = seconds
        if first and self.trial_timeout == "auto":
            self.store.event("trial_timeout", f"{shape}: {self._limit(shape, 1)[1]}", run_id=self.run_id)

    def _limit(self, shape: str, trials: int) -> tuple[float | None, str]:
        """Seconds the trials training now (a pack: `trials` of them) may take, and why."""
        if self.trial_timeout != "auto":
            return float(self.trial_timeout) * trials, f"resources.trial_timeout {float(self.trial_timeout):g} s per trial"
        slowest = self.shape_seconds.get(shape)
        if slowest is None:
            return None, "no limit yet: no trial of this shape has finished"
        per_trial = max(AUTO_TIMEOUT_FLOOR_S, AUTO_TIMEOUT_FACTOR * slowest)
        return per_trial * trials, f"auto: {AUTO_TIMEOUT_FACTOR:g}x the slowest finished trial of its shape ({slowest:.1f} s), at least {AUTO_TIMEOUT_FLOOR_S:g} s"

    def _watch(self) -> None:
        """Stop a worker whose trial ran past its limit, or that stopped sending heartbeats; the crash
        that follows fails its trial (retried under `retries`)."""
        now = self.clock()  # a worker's last_seen and clock_from are on it too (set in _dispatch)
        for worker in self.executor.busy():
            if worker.task is None or worker.stop_reason is not None:
                continue
            silent = now - worker.last_seen
            limit, why = self._limit(worker.task.shape, worker.training)
            if worker.reports_progress and worker.ready and silent > self.heartbeat_timeout:
                reason = f"worker stopped answering: no heartbeat for {silent:.0f} s (resources.heartbeat_timeout {self.heartbeat_timeout:g} s)"
            elif limit is not None and now - worker.clock_from > limit:
                reason = f"timed out after {now - worker.clock_from:.0f} s (limit {limit:.0f} s; {why})"
            else:
                continue
            self.store.event("alert_hung", f"{worker.name}: {reason}; stopped, its trial will be retried if attempts remain", run_id=self.run_id,
                             trial_id=next(iter(worker.started), worker.task.trials[0].trial_id))
            log.warning("%s: %s", worker.name, reason)
            self.executor.stop(worker, reason)

    def _failed(self, queued: Queued, lane_name: str, error: str, trace: str, duration: float) -> None:
        trial = queued.trial
        retry = queued.attempts < self.max_attempts
        self.store.record_failed(trial.trial_id, error, trace, duration_s=duration, retry=retry)
        self.store.event("trial_failed", f"attempt {queued.attempts}/{self.max_attempts}: {error}", run_id=self.run_id, trial_id=trial.trial_id)
        log.warning("trial %s (%s %s) failed, attempt %d/%d: %s", trial.trial_id, trial.family, trial.project, queued.attempts, self.max_attempts, error)
        if retry:
            self.outcome.retried += 1
            self.queue[self.queue_of_kind[trial.kind]].append(queued.waiting())
        else:
            self.outcome.failed += 1
            self.finished_this_run[lane_name] += 1

    def _environment_failed(self, queued: Queued, error: str, trace: str, duration: float) -> None:
        """Back to pending, its attempt not counted; queued again after a pause, or left for a re-run."""
        trial = queued.trial
        self.store.record_environment(trial.trial_id, error, trace, duration_s=duration)
        queued.attempts -= 1
        self.outcome.environment += 1
        pause = self.environment.failed(trial.trial_id, error)
        if pause is None:
            self.outcome.waiting += 1
            self.outcome.waiting_reason = error
            said = f"left pending after {self.environment.trial_limit} environment failures in this run (not counted as attempts)"
        else:
            self.queue[self.queue_of_kind[trial.kind]].append(queued.waiting())
            said = f"not counted as an attempt; retried after a {pause:g} s pause"
        self.store.event("environment", f"{said}: {error}", run_id=self.run_id, trial_id=trial.trial_id)
        log.warning("trial %s (%s %s): %s: %s", trial.trial_id, trial.family, trial.project, said, error)

    def _stop_waiting(self) -> None:
        """The environment kept failing for longer than the patience: every queued trial stays pending for a re-run."""
        left = sum(len(queue) for queue in self.queue.values())
        self.queue = {name: ShapeQueue(widths=self.widths) for name in self.queue}
        self.outcome.waiting += left
        self.outcome.waiting_reason = self.environment.last_error
        message = self.environment.why_stopped(left)
        self.store.event("environment", message, run_id=self.run_id)
        log.warning("%s", message)

    def _sync_jobs(self) -> None:
        """Write batch jobs whose state changed (Slurm), for `gpufill status`."""
        changed = [job for job in self.executor.jobs() if self.job_states.get(job.job_id) != (job.state, job.detail)]
        if changed:
            self.store.record_jobs(self.run_id, [dataclasses.asdict(job) for job in changed])
            self.job_states.update({job.job_id: (job.state, job.detail) for job in changed})

    # -- monitoring ---------------------------------------------------------------------
    def _monitor(self, final: bool = False) -> None:
        """Samples a Sampler queued go to the store (its one writer); alerts over the last minutes become events."""
        if self.drain_samples is None:
            return
        rows = self.drain_samples()
        if rows:
            self.store.add_samples(rows)
        now = self.wall_clock()  # the samples' timestamps are wall-clock times
        self.alerts.add(rows, [(now, lane.name, sum(1 for w in self.executor.busy() if w.lane is lane), len(self.queue[lane.queue]))
                               for lane in self.lanes])
        if not final and not self.alerts.due(now):
            return
        for alert in self.alerts.check(now):
            self.store.event(f"alert_{alert.kind}", alert.message, run_id=self.run_id)
            log.warning("alert: %s", alert.message)

    # -- progress -----------------------------------------------------------------------
    def snapshot(self, elapsed_s: float) -> Snapshot:
        busy = [w for w in self.executor.busy() if w.task is not None]
        return progress.snapshot(self.store.counts(), self.lanes, self.finished_this_run, busy, self.started_at, self.clock(), elapsed_s)
