"""GPU admission by measured memory, and pack sizes measured once per shape per campaign.

A fake executor stands in for GPU workers: each task measures (for a new shape) and trains for
a few polls, reporting the peak memory a fake memory model gives its shape and pack size. The
scheduler must keep the true sum of running packs plus every worker's CUDA context under the
lane's budget at every moment, run different shapes side by side, run a new shape's first pack
alone until it is measured, and measure each shape once, this run and the next.
"""

from __future__ import annotations

from gpufill.campaign.policy.admission import CONTEXT_BYTES_DEFAULT, META_KEY, Running, ShapeBook, ShapeFact, admits
from gpufill.campaign.executors.base import Finished, Worker
from gpufill.campaign.policy.lanes import Lane
from gpufill.campaign.policy.messages import Outcome, PackMeasured, PackOrder, Started, Task, TaskEnded
from gpufill.campaign.policy.policy import PROBE_PACK
from gpufill.campaign.run.scheduler import Scheduler
from gpufill.campaign.store.store import Store
from gpufill.campaign.trials.trials import Trial
from tests.fakes import FakeExecutor, done_result

GIB = 2**30
CONTEXT = GIB // 2
PACK = 8
PEAK_PER_TRIAL = {"small": GIB // 8, "medium": GIB // 2, "large": 7 * GIB // 8}  # the fake memory model: bytes per trial of a pack
BUDGET = int(0.85 * 12 * GIB)  # memory_margin 0.85 of a 12 GiB device


def gpu_lane(slots: int = 4) -> Lane:
    return Lane(name="gpu", slots=slots, threads=1, device="cuda:0", kinds=("neural",), queue="gpu", memory_budget_bytes=BUDGET, reason="test")


def true_peak(shape: str, k: int) -> int:
    return GIB // 4 + k * PEAK_PER_TRIAL[shape]


class MemoryModelExecutor(FakeExecutor):
    """Tasks take `polls` polls; a task of an unmeasured shape reports its measurement at its first poll."""

    def __init__(self, polls: int = 3):
        super().__init__()
        self.polls = polls
        self.age: dict[str, int] = {}
        self.in_use: list[int] = []
        """True memory in use (contexts + running packs) after every dispatch."""
        self.side_by_side: list[set[str]] = []
        self.measured: list[str] = []
        self.alone_while_unmeasured: list[bool] = []

    def make_worker(self, name, lane):
        return Worker(name=name, lane=lane, ready=True, context_bytes=CONTEXT)

    def submit(self, worker, task):
        worker.begin(task)
        self.age[worker.name] = 0
        shape = task.shape
        if task.pack.size is None:
            self.measured.append(shape)
            self.alone_while_unmeasured.append(len(self.busy()) == 1)
        running = {w.name: w for w in self.busy()}
        self.in_use.append(len(self.workers) * CONTEXT + sum(true_peak(w.task.shape, self._size(w.task)) for w in running.values()))
        self.side_by_side.append({w.task.shape for w in running.values()})

    def _size(self, task) -> int:
        return min(task.pack.size or PACK, len(task.trials))

    def poll(self, timeout):
        out = []
        for worker in self.busy():
            task = worker.task
            shape, size = task.shape, self._size(task)
            if self.age[worker.name] == 0 and task.pack.size is None:
                worker.note(PackMeasured({"size": PACK, "reason": "fake: packs of 8", "peak_bytes": {str(k): true_peak(shape, k) for k in (1, 2, 4, PACK)}}))
                worker.note(Started(tuple(t.trial_id for t in task.trials[:size])))
            self.age[worker.name] += 1
            if self.age[worker.name] < self.polls:
                continue
            worker.task = None
            result = done_result({"peak_memory_bytes": true_peak(shape, size), "pack_size": size})
            message = TaskEnded(tuple(Outcome(trial_id=t.trial_id, ok=True, result=result, seconds=0.1) for t in task.trials[:size]),
                                returned=tuple(t.trial_id for t in task.trials[size:]))
            out.append(Finished(worker, task, message))
        return out


def shape_trials(per_shape: int, prefix: str = "") -> list[Trial]:
    return [Trial(trial_id=f"{prefix}{shape}{i:03d}", project=f"p{i}", family="lstm", kind="neural", params={}, train={}, seed=i, lookback=12, shape=shape)
            for shape in PEAK_PER_TRIAL for i in range(per_shape)]


def run(store: Store, trials: list[Trial]) -> tuple[MemoryModelExecutor, int]:
    store.sync_trials(trials, {"neural": "gpu"})
    executor = MemoryModelExecutor()
    outcome = Scheduler(store, executor, [gpu_lane()], retries=0, run_id=store.begin_run("test")).run()
    return executor, outcome.done


def test_each_new_shape_is_measured_once_alone_and_a_resumed_campaign_reuses_the_sizes(tmp_path):
    store = Store.create(tmp_path)
    first, done = run(store, shape_trials(12))
    assert done == 36
    assert sorted(first.measured) == sorted(PEAK_PER_TRIAL)  # once per shape, though 4 workers were free
    assert first.alone_while_unmeasured == [True, True, True]  # each new shape's first pack ran alone
    assert max(first.in_use) <= BUDGET
    stored = ShapeBook.from_json(store.meta(META_KEY))
    assert {shape: stored.pack_size("gpu", shape) for _, shape in stored.facts} == dict.fromkeys(PEAK_PER_TRIAL, PACK)
    assert stored.peak("gpu", "large", PACK) == true_peak("large", PACK)

    second, done = run(store, shape_trials(40, prefix="again-"))
    assert done == 120 and second.measured == []  # packs of the stored size from the start


def test_measured_shapes_run_side_by_side_and_never_past_the_memory_margin(tmp_path):
    store = Store.create(tmp_path)
    run(store, shape_trials(8))  # measures the three shapes
    executor, done = run(store, shape_trials(40, prefix="again-"))
    assert done == 120
    assert max(executor.in_use) <= BUDGET, [u / GIB for u in executor.in_use]
    assert max(len(shapes) for shapes in executor.side_by_side) >= 2  # different shapes at once
    assert max(executor.in_use) > BUDGET / 2  # the lane was filled, not run one pack at a time
    # A large pack of 8 (7.25 GiB) beside any other pack, with 4 contexts (2 GiB), would pass the 10.2 GiB
    # budget: beside others, large trials went as smaller packs (halved until they fit).
    assert any(shapes == {"large"} for shapes in executor.side_by_side) and any(len(shapes) > 1 and "large" in shapes for shapes in executor.side_by_side)


def test_the_scheduler_probes_with_as_many_trials_as_the_largest_pack_measured():
    from gpufill.engine.packs.size import CANDIDATE_SIZES

    assert PROBE_PACK == max(CANDIDATE_SIZES) == 64


def test_admission_rule_with_a_fake_memory_model():
    lane = gpu_lane(slots=2)
    book = ShapeBook({("gpu", "a"): ShapeFact(8, "", peak_bytes={8: 4 * GIB}), ("gpu", "b"): ShapeFact(8, "", peak_bytes={1: GIB, 8: 5 * GIB})})
    contexts = [CONTEXT, None]  # one worker reported its context; the other counts as the default
    held = CONTEXT + CONTEXT_BYTES_DEFAULT
    assert admits(lane, book, "a", 8, [], contexts)
    assert admits(lane, book, "b", 8, [Running("a", 8)], contexts) == (held + 9 * GIB <= BUDGET)
    assert not admits(lane, book, "a", 8, [Running("b", 8), Running("a", 8)], contexts)  # 13 GiB > 10.2 GiB
    assert admits(lane, book, "new", 8, [], contexts) and not admits(lane, book, "new", 8, [Running("a", 8)], contexts)  # unmeasured: alone
    assert not admits(lane, book, "a", 8, [Running("new", 8)], contexts)  # nothing joins an unmeasured pack
    assert book.peak("gpu", "b", 4) == 5 * GIB and book.peak("gpu", "a", 16) == 8 * GIB  # next larger measured; else linear
    cpu = Lane(name="cpu", slots=2, threads=1, device="cpu", kinds=("neural",), queue="cpu", memory_budget_bytes=None, reason="test")
    assert admits(cpu, book, "new", PROBE_PACK, [Running("new", PROBE_PACK)], [])  # no budget on a CPU lane


def test_memory_margin_reaches_every_trial_and_pack(tmp_path, monkeypatch):
    from gpufill.campaign.run.runner import Campaign
    from gpufill.campaign.trials.trials import expand
    from gpufill.campaign.worker.worker import TrialRunner
    from gpufill.forecasting import packs, run
    from tests.helpers import write_campaign

    path = write_campaign(tmp_path, models="mlp: {hidden_size: 8}", projects=3, epochs=1)
    path.write_text(path.read_text().replace("resources: {retries: 1}", "resources: {retries: 1, memory_margin: 0.6}"))
    campaign = Campaign.from_yaml(path, tmp_path / "work")
    trials = expand(campaign.spec, list(campaign.spec.load_projects()))
    runner = TrialRunner(campaign.spec.model_dump(mode="json"), path.parent, threads=1, device="cpu", tune_cache=str(tmp_path / "tune"))
    seen: list[float] = []
    real_fit_pack, real_fit = packs.fit_pack, run.fit
    monkeypatch.setattr(packs, "fit_pack", lambda models, members, *, config, **kw: seen.append(config.memory_margin) or real_fit_pack(models, members, config=config, **kw))
    monkeypatch.setattr(run, "fit", lambda *args, config, **kw: seen.append(config.memory_margin) or real_fit(*args, config=config, **kw))
    single = runner.run_task(Task(tuple(trials[:1]), PackOrder(1)))
    packed = runner.run_task(Task(tuple(trials), PackOrder(3)))
    assert [o.ok for o in single.outcomes + packed.outcomes] == [True] * 4
    assert seen == [0.6, 0.6]  # one single trial, one pack of three
    assert runner.setup(trials[0]).config.memory_margin == 0.6 and runner.setup(trials[0]).config.tune_cache == str(tmp_path / "tune")


# --- GPU -------------------------------------------------------------------------------------

import pytest  # noqa: E402


@pytest.mark.gpu
def test_on_a_gpu_three_shapes_run_within_the_memory_margin(tmp_path):
    """A real campaign on the GPU lane with three LSTM shapes: the measured facts are stored, and
    the device memory NVML saw while it ran stayed within memory_margin of the device."""
    import sqlite3

    from gpufill.campaign.run.runner import Campaign
    from tests.helpers import write_campaign

    path = write_campaign(tmp_path, models="lstm: {hidden_size: [16, 64, 128]}", projects=12, epochs=2)
    path.write_text(path.read_text().replace("seeds: [0]", "seeds: [0, 1]").replace("resources: {retries: 1}", "resources: {retries: 1, memory_margin: 0.3, gpu_slots: 4}"))
    campaign = Campaign.from_yaml(path, tmp_path / "work")
    outcome = campaign.run()
    assert outcome.done == 72 and outcome.failed == 0
    with sqlite3.connect(tmp_path / "work" / "gpufill.db") as con:
        facts = ShapeBook.from_json(con.execute("SELECT value FROM meta WHERE key = ?", (META_KEY,)).fetchone()[0])
        used = con.execute("SELECT max(mem_used), max(mem_total) FROM samples WHERE source LIKE 'gpu%'").fetchone()
    assert len(facts.facts) == 3 and all(f.peak_bytes for f in facts.facts.values())
    assert used[0] is not None and used[0] <= 0.3 * used[1] + 2**30, used  # + 1 GiB: other processes on a shared GPU
