import pytest

from gpufill.campaign.policy.lanes import MAX_AUTO_THREADS, plan_lanes
from gpufill.errors import InputError

GIB = 2**30


def lanes_by_name(**kwargs):
    defaults = dict(kinds={"neural", "classical"}, cores=2, gpu_memory_bytes=None, gpu_slots="auto", cpu_slots="auto")
    lanes, warnings = plan_lanes(**{**defaults, **kwargs})
    return {lane.name: lane for lane in lanes}, warnings


@pytest.mark.parametrize("cores", [1, 2, 3, 8, 16, 64])
@pytest.mark.parametrize("gpu", [None, 80 * GIB])
@pytest.mark.parametrize("cpu_slots", ["auto", 1])
def test_the_thread_budget_never_exceeds_the_cores(cores, gpu, cpu_slots):
    lanes, _ = lanes_by_name(cores=cores, gpu_memory_bytes=gpu, cpu_slots=cpu_slots)
    used = sum(lane.slots * lane.threads for lane in lanes.values())
    assert used <= max(cores, 1 + (1 if gpu else 0))  # a 1-core machine still gets one slot per lane
    if cores >= 4:
        assert used <= cores


def test_without_a_gpu_the_cpu_lane_runs_everything_one_thread_per_core():
    lanes, warnings = lanes_by_name(cores=2)
    assert list(lanes) == ["cpu"]
    assert (lanes["cpu"].slots, lanes["cpu"].threads, lanes["cpu"].kinds) == (2, 1, ("neural", "classical"))
    assert warnings == []


def test_gpu_slots_without_a_gpu_warn_and_the_cpu_lane_takes_the_trials():
    lanes, warnings = lanes_by_name(cores=2, gpu_slots=4)
    assert list(lanes) == ["cpu"] and "neural" in lanes["cpu"].kinds
    assert len(warnings) == 1 and "no GPU" in warnings[0]


def test_with_a_gpu_both_lanes_run_and_share_the_cores():
    lanes, _ = lanes_by_name(cores=16, gpu_memory_bytes=80 * GIB)
    assert lanes["gpu"].slots == 8 and lanes["gpu"].kinds == ("neural",)
    assert lanes["gpu"].memory_budget_bytes == int(0.85 * 80 * GIB)
    assert lanes["cpu"].slots * lanes["cpu"].threads == 8 and lanes["cpu"].kinds == ("classical",)


def test_explicit_threads_per_trial_sets_the_slot_count():
    lanes, _ = lanes_by_name(cores=8, threads_per_trial=2)
    assert (lanes["cpu"].slots, lanes["cpu"].threads) == (4, 2)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"cpu_slots": 3}, "resources.cpu_slots"),
        ({"threads_per_trial": 4}, "resources.threads_per_trial"),
        ({"cores": 4, "cpu_slots": 2, "threads_per_trial": 3}, "resources.threads_per_trial"),
    ],
)
def test_impossible_resources_are_clear_errors(kwargs, field):
    with pytest.raises(InputError) as error:
        lanes_by_name(**kwargs)
    assert field in str(error.value) and "fix:" in str(error.value)


@pytest.mark.parametrize(("counts", "cores", "expected"), [
    ({"neural": 1}, 2, (1, 2)),  # one trial takes both cores instead of leaving one idle
    ({"neural": 1, "classical": 1}, 2, (2, 1)),
    ({"neural": 3}, 8, (3, 2)),  # 3 x 2 threads, 2 cores left over (cores // trials)
    ({"neural": 3}, 5, (5, 1)),  # cores // trials is 1: one trial per core, as with many trials
    ({"neural": 1}, 64, (1, MAX_AUTO_THREADS)),  # capped: a small trial stalls at every operator's barrier on many threads
    ({"classical": 5}, 4, (4, 1)),  # at least as many trials as cores: one per core
    (None, 4, (4, 1)),  # trials not listed before the run (a search): one per core
])
def test_a_cpu_lane_with_fewer_trials_than_cores_gives_each_trial_more_threads(counts, cores, expected):
    lanes, _ = lanes_by_name(cores=cores, trial_counts=counts)
    assert (lanes["cpu"].slots, lanes["cpu"].threads) == expected
    assert (f"x {expected[1]} threads" in lanes["cpu"].reason) == (expected[1] > 1)


def test_only_the_trials_of_the_cpu_lane_count_and_explicit_settings_win():
    # the neural trials train on the GPU: the CPU lane's 8 cores are for its 2 classical trials
    lanes, _ = lanes_by_name(cores=16, gpu_memory_bytes=80 * GIB, trial_counts={"neural": 40, "classical": 2})
    assert (lanes["cpu"].slots, lanes["cpu"].threads) == (2, 4)
    lanes, _ = lanes_by_name(cores=8, trial_counts={"neural": 1}, threads_per_trial=1, cpu_threads_before=4)
    assert (lanes["cpu"].slots, lanes["cpu"].threads) == (8, 1)
    lanes, _ = lanes_by_name(cores=8, trial_counts={"neural": 1}, cpu_slots=4)
    assert (lanes["cpu"].slots, lanes["cpu"].threads) == (4, 2)


@pytest.mark.parametrize(("before", "cores", "counts", "expected", "said"), [
    (2, 8, {"neural": 40}, (4, 2), "as this workdir's first run chose"),  # more trials now: the first run's count is kept
    (1, 2, {"neural": 1}, (2, 1), "as this workdir's first run chose"),  # fewer trials now: kept as well
    (4, 2, {"neural": 1}, (1, 2), "fewer than the 4 this workdir's first run chose"),  # a smaller machine: what it has
])
def test_the_threads_the_workdir_s_first_run_chose_are_kept(before, cores, counts, expected, said):
    lanes, _ = lanes_by_name(cores=cores, trial_counts=counts, cpu_threads_before=before)
    assert (lanes["cpu"].slots, lanes["cpu"].threads) == expected
    assert said in lanes["cpu"].reason
