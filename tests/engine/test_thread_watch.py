"""ThreadWatch on made-up step times: when it re-checks, what it picks, how rarely it tries a stalled count again."""

from __future__ import annotations

from gpufill.engine.measure.thread_watch import COOLDOWN, DRIFT, WINDOW, ThreadWatch


class Machine:
    """Step seconds per thread count, changed by the test; records every count the watch sets."""

    def __init__(self, seconds: dict[int, float]):
        self.seconds = dict(seconds)
        self.threads = 2
        self.set: list[int] = []

    def set_threads(self, threads: int) -> None:
        self.threads = threads
        self.set.append(threads)

    def run(self, watch: ThreadWatch, steps: int) -> list[int]:
        """Run `steps` steps; the thread count each ran at."""
        ran = []
        for _ in range(steps):
            ran.append(self.threads)
            watch.observe(self.seconds[self.threads])
        return ran


def test_a_quiet_machine_is_never_rechecked_and_a_one_off_slow_step_is_noise() -> None:
    machine = Machine({2: 0.010, 1: 0.016})
    watch = ThreadWatch([2, 1], 2, 0.010, set_threads=machine.set_threads)
    assert machine.run(watch, 200) == [2] * 200
    ran = []
    for step in range(200):  # a 3x step every 10th: the window's mean stays under DRIFT
        ran.append(machine.threads)
        watch.observe(0.030 if step % 10 == 0 else 0.010)
    assert ran == [2] * 200 and machine.set == [] and watch.log == []


def test_a_stalled_count_is_left_for_the_faster_one() -> None:
    machine = Machine({2: 0.010, 1: 0.016})
    watch = ThreadWatch([2, 1], 2, 0.010, set_threads=machine.set_threads)
    machine.run(watch, 20)
    machine.seconds[2] = 0.100  # two busy processes took the cores: every-core steps stall
    ran = machine.run(watch, 20)
    # One 10x step in the window is a mean over DRIFT: the next step runs at 1 thread, and the training stays there.
    assert ran[0] == 2 and ran[1:] == [1] * 19
    assert watch.threads == 1 and watch.reference_s == 0.016
    assert len(watch.log) == 1 and "went on at 1" in watch.log[0] and "(1: 16 ms, 2: 32.5 ms)" in watch.log[0]


def test_a_recheck_that_keeps_the_count_waits_twice_as_long_each_time() -> None:
    machine = Machine({2: 0.010, 1: 0.200})  # one thread is slower still: each re-check keeps 2
    watch = ThreadWatch([2, 1], 2, 0.010, set_threads=machine.set_threads)
    machine.seconds[2] = 0.030
    ran = machine.run(watch, 400)
    # The kept count's drifted step becomes the reference: nothing drifts further, so one re-check only.
    assert ran.count(1) == 1 and watch.threads == 2 and watch.reference_s == 0.030
    assert "kept 2" in watch.log[0] and f"after {2 * COOLDOWN} steps" in watch.log[0]


def test_a_load_that_keeps_rising_is_rechecked_more_and_more_rarely() -> None:
    machine = Machine({2: 0.010, 1: 100.0})
    watch = ThreadWatch([2, 1], 2, 0.010, set_threads=machine.set_threads)
    ran: list[int] = []
    for _ in range(6):  # every 40 steps the 2-thread step drifts DRIFT+ times further
        machine.seconds[2] *= DRIFT * 1.5
        ran += machine.run(watch, 40)
    rechecks = [i for i, t in enumerate(ran) if t == 1]
    gaps = [b - a for a, b in zip(rechecks, rechecks[1:], strict=False)]
    assert len(rechecks) >= 3 and all(later > earlier for earlier, later in zip(gaps, gaps[1:], strict=False))
    assert watch.threads == 2 and watch.cooldown == COOLDOWN * 2 ** len(rechecks)


def test_no_reference_takes_the_first_window_and_one_count_is_inactive() -> None:
    machine = Machine({2: 0.010, 1: 0.016})
    watch = ThreadWatch([2, 1], 2, None, set_threads=machine.set_threads)
    machine.run(watch, WINDOW)
    assert watch.reference_s == 0.010
    single = ThreadWatch([2], 2, 0.010, set_threads=machine.set_threads)
    machine.seconds[2] = 1.0
    assert machine.run(single, 50) == [2] * 50 and not single.active and single.log == []
