"""Hardware descriptions of devices we do not have, for plan tests."""

from __future__ import annotations

from gpufill.engine.hardware import Hardware, peak_for


def gpu(name: str, capability: tuple[int, int], memory_gib: float = 80, cpus: int = 16) -> Hardware:
    entry = peak_for(name)
    return Hardware(
        device="cuda:0",
        device_type="cuda",
        name=name,
        total_memory_bytes=int(memory_gib * 2**30),
        compute_capability=capability,
        sm_count=132,
        bf16_supported=capability >= (8, 0),
        tf32_supported=capability >= (8, 0),
        cpu_count=cpus,
        peak_name=entry[0] if entry else None,
        peak=entry[1] if entry else None,
    )


H100 = gpu("NVIDIA H100 80GB HBM3", (9, 0))
T4 = gpu("Tesla T4", (7, 5), memory_gib=16)
CPU = Hardware(
    device="cpu",
    device_type="cpu",
    name="AMD EPYC",
    total_memory_bytes=24 * 2**30,
    compute_capability=None,
    sm_count=None,
    bf16_supported=False,
    tf32_supported=False,
    cpu_count=2,
    peak_name=None,
    peak=None,
)


class FakeExecutor:
    """An executor without processes for scheduler tests: workers are plain Worker records;
    subclasses say what `submit` and `poll` do."""

    def __init__(self) -> None:
        self.workers: list = []

    def make_worker(self, name: str, lane):  # noqa: ANN001, ANN201 - a Worker
        from gpufill.campaign.executors.base import Worker

        return Worker(name=name, lane=lane)

    def hand_data(self, projects) -> None:  # noqa: ANN001
        return None

    def warm(self, lanes, check=None) -> None:  # noqa: ANN001
        return None

    def start(self, lanes) -> None:  # noqa: ANN001
        for lane in lanes:
            self.workers += [self.make_worker(f"{lane.name}-{i}", lane) for i in range(lane.slots)]

    def idle(self, lane):  # noqa: ANN001, ANN201
        return [w for w in self.workers if w.lane is lane and w.task is None]

    def busy(self):  # noqa: ANN201
        return [w for w in self.workers if w.task is not None]

    def stop(self, worker, reason: str) -> None:  # noqa: ANN001
        pass

    def jobs(self) -> list:
        return []

    def cancel_jobs(self, job_ids) -> None:  # noqa: ANN001
        pass

    def pids(self) -> list[int]:
        return []

    def shutdown(self) -> None:
        self.workers.clear()


def done_result(timings: dict):  # noqa: ANN201 - a TrialResult
    """A finished trial's result as a worker reports it, with constant metrics."""
    from gpufill.forecasting.trial import TrialResult

    metrics = ("mae", "rmse", "smape", "mase")
    return TrialResult(project="p", family="f", params={}, status="completed", plan={}, timings=timings,
                       metrics={"test": dict.fromkeys(metrics, 1.0), "naive": dict.fromkeys(metrics, 2.0)})
