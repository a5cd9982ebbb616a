"""Several GPUs on one machine: one lane per GPU, workers pinned to theirs, one shared queue."""

from gpufill.campaign.policy.messages import Outcome, TaskEnded
from gpufill.campaign.executors.base import Finished, gpu_env
from gpufill.campaign.policy.lanes import plan_lanes, visible_gpu
from gpufill.campaign.run.scheduler import Scheduler
from gpufill.campaign.store.store import Store
from gpufill.campaign.trials.trials import Trial
from tests.fakes import FakeExecutor, done_result

GIB = 2**30


def two_gpu_lanes(cores=16, gpu_slots="auto"):
    lanes, _ = plan_lanes(kinds={"neural", "classical"}, cores=cores, gpu_memory_bytes=[80 * GIB, 40 * GIB], gpu_slots=gpu_slots, cpu_slots="auto")
    return lanes


def test_each_gpu_gets_its_own_lane_with_its_own_memory_budget():
    lanes = {lane.name: lane for lane in two_gpu_lanes(cores=16)}
    assert list(lanes) == ["gpu0", "gpu1", "cpu"]
    assert (lanes["gpu0"].gpu_index, lanes["gpu1"].gpu_index) == (0, 1)
    assert lanes["gpu0"].queue == lanes["gpu1"].queue == "gpu" and lanes["cpu"].queue == "cpu"
    assert lanes["gpu0"].memory_budget_bytes == int(0.85 * 80 * GIB) and lanes["gpu1"].memory_budget_bytes == int(0.85 * 40 * GIB)
    assert lanes["gpu0"].slots == lanes["gpu1"].slots == 4  # 16 cores / (2 x 2 GPUs)
    # The cores stay within budget: 8 GPU workers + the CPU lane's slots x threads.
    assert 8 + lanes["cpu"].slots * lanes["cpu"].threads <= 16
    one = {lane.name: lane for lane in plan_lanes(kinds={"neural"}, cores=16, gpu_memory_bytes=80 * GIB, gpu_slots="auto", cpu_slots="auto")[0]}
    assert list(one) == ["gpu"] and one["gpu"].gpu_index is None  # one GPU: as before, not pinned


def test_workers_are_pinned_with_cuda_visible_devices(monkeypatch):
    gpu0, gpu1, cpu = two_gpu_lanes()
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert gpu_env(gpu1) == {"CUDA_VISIBLE_DEVICES": "1"} and gpu_env(cpu) == {}
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")  # the user's own selection is respected
    assert gpu_env(gpu0) == {"CUDA_VISIBLE_DEVICES": "2"} and gpu_env(gpu1) == {"CUDA_VISIBLE_DEVICES": "3"}
    assert visible_gpu(5, "2,3") == "5" and gpu0.device == gpu1.device == "cuda:0"


class InstantExecutor(FakeExecutor):
    """Runs every task at the next poll; remembers which lane ran which trials."""

    def __init__(self):
        super().__init__()
        self.ran: dict[str, list[str]] = {}

    def submit(self, worker, task):
        worker.task = task

    def poll(self, timeout):
        out = []
        for worker in self.busy():
            task, worker.task = worker.task, None
            self.ran.setdefault(worker.lane.name, []).extend(t.trial_id for t in task.trials)
            result = done_result({"peak_memory_bytes": GIB})
            outcomes = tuple(Outcome(trial_id=t.trial_id, ok=True, result=result, seconds=0.1) for t in task.trials)
            out.append(Finished(worker, task, TaskEnded(outcomes, pack={"size": 1, "reason": "test"})))
        return out


def test_trials_of_the_shared_queue_spread_across_both_gpus(tmp_path):
    lanes = [lane for lane in two_gpu_lanes(cores=4) if lane.queue == "gpu"]  # 1 slot per GPU
    trials = [Trial(trial_id=f"t{i:02d}", project=f"p{i}", family="lstm", kind="neural", params={}, train={}, seed=0, lookback=12, shape=f"s{i % 3}")
              for i in range(12)]
    store = Store.create(tmp_path)
    store.sync_trials(trials, {"neural": "gpu"})
    executor = InstantExecutor()
    outcome = Scheduler(store, executor, lanes, retries=0, run_id=store.begin_run("test")).run()
    assert outcome.done == 12
    assert set(executor.ran) == {"gpu0", "gpu1"} and all(executor.ran.values())
    assert sorted(executor.ran["gpu0"] + executor.ran["gpu1"]) == [t.trial_id for t in trials]  # each once
    counts = store.counts()
    assert counts.lanes["gpu0"]["done"] + counts.lanes["gpu1"]["done"] == 12
