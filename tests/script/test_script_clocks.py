"""The doctor's GPU clock on constructed event times (the arithmetic; tests/script/test_doctor_script.py's
gpu-marked tests run it on a device): phases read off the GPU's timeline, so a host that waits for
data while queued work keeps the GPU busy is not an input-bound step, and marks are read only once
the GPU has passed them."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import pytest

from gpufill.script.clocks import BACKWARD, COPY, DATA, CudaClock
from gpufill.script.recorder import PHASES, Recorder


class FakeEvent:
    """A CUDA event whose GPU time the test sets: `elapsed_time` in ms as torch's."""

    def __init__(self, at_s: float):
        self.at_s, self.done = at_s, True

    def record(self, stream=None) -> None:
        pass

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.done = True

    def elapsed_time(self, end: FakeEvent) -> float:
        return (end.at_s - self.at_s) * 1e3


def gpu_recorder(tmp_path, times: list[float], capturing: list[bool] | None = None) -> Recorder:
    """A doctor's recorder on a CUDA clock whose events complete at `times` (seconds on the GPU), in order;
    `capturing` says, per mark asked for, whether a CUDA graph is being captured then."""
    pending, capture = iter(times), iter(capturing or [])
    cuda = SimpleNamespace(Event=lambda enable_timing: FakeEvent(next(pending)), is_current_stream_capturing=lambda: next(capture, False))
    recorder = Recorder(tmp_path, steps=100, warmup=1)
    recorder._time_on_the_gpu(CudaClock(SimpleNamespace(cuda=cuda)))
    return recorder


def one_step(recorder: Recorder) -> None:
    """What the wrappers and hooks do in one step, in a script's order: next(loader), .to('cuda'), backward, step."""
    for kind in (DATA, COPY, BACKWARD):
        start = recorder.now()
        recorder.add(kind, start)
    recorder.pre_at = recorder.now()
    recorder.post_step(None)


def test_phases_are_read_off_the_gpu_timeline(tmp_path):
    # GPU times per step: data (start, end), copy, backward, optimizer start, step end.
    step_1 = [0.000, 0.000, 0.000, 0.001, 0.001, 0.005, 0.005, 0.006]  # warm-up: its end is the first mark
    # The GPU was still busy when the host asked for data: the data events complete together (no idle).
    step_2 = [0.009, 0.009, 0.009, 0.010, 0.012, 0.020, 0.020, 0.022]
    # The GPU ran dry and idled 5 ms until the batch arrived: that is the data wait.
    step_3 = [0.022, 0.027, 0.027, 0.028, 0.030, 0.038, 0.038, 0.040]
    recorder = gpu_recorder(tmp_path, step_1 + step_2 + step_3)
    for _ in range(3):
        one_step(recorder)
    recorder._digest(final=True)
    records = [dict(zip(PHASES, record, strict=True)) for record in recorder.records]
    assert recorder.measured == 2 and len(records) == 2  # step 1 is the warm-up
    assert records[0] == pytest.approx({"step_s": 0.016, "data_s": 0.0, "copy_s": 0.001, "backward_s": 0.008, "optimizer_s": 0.002,
                                        "forward_s": 0.005})
    assert records[1] == pytest.approx({"step_s": 0.018, "data_s": 0.005, "copy_s": 0.001, "backward_s": 0.008, "optimizer_s": 0.002,
                                        "forward_s": 0.002})
    assert recorder.clock.timeline == "gpu"


def test_marks_the_gpu_has_not_passed_are_read_later_and_waited_for_only_at_the_end(tmp_path):
    recorder = gpu_recorder(tmp_path, [0.001 * i for i in range(24)])
    for _ in range(3):
        one_step(recorder)
    recorder.marks[-1][0].done = False  # the last step's end is still queued on the GPU
    recorder._digest()
    assert recorder.records == [] and len(recorder.marks) == 3  # nothing read, nothing lost
    recorder._digest(final=True)  # the end of the run waits for it
    assert recorder.measured == 2 and recorder.records[0][0] == pytest.approx(0.008)


def test_steps_touching_a_cuda_graph_capture_are_not_timed(tmp_path):
    # Step 2 is captured (whole-network capture: its backward and optimizer step too): no event may be recorded,
    # so neither it nor step 3 (which starts at its end) has a time; step 4 has.
    capturing = [False] * 8 + [True] * 8 + [False] * 16
    recorder = gpu_recorder(tmp_path, [0.001 * i for i in range(24)], capturing)
    for _ in range(4):
        one_step(recorder)
    recorder._digest(final=True)
    assert recorder.measured == 1 and recorder.records[0][0] == pytest.approx(0.008)


def test_a_span_begun_on_the_host_clock_is_dropped_after_the_switch(tmp_path):
    # The optimizer stepped from a gradient hook, inside backward: the backward began on the host's clock.
    recorder = gpu_recorder(tmp_path, [0.001 * i for i in range(24)])
    recorder.add(BACKWARD, 12.5)  # a perf_counter reading
    assert recorder.spans == []
    for _ in range(3):
        one_step(recorder)
    recorder._digest(final=True)
    assert recorder.measured == 2 and recorder.error is None


def test_a_digest_that_fails_stops_the_timing_never_the_training(tmp_path):
    recorder = gpu_recorder(tmp_path, [0.001 * i for i in range(24)])
    for _ in range(2):
        one_step(recorder)
    recorder.marks[-1][2].append((DATA, object(), recorder.marks[-1][0]))  # a mark that cannot be read
    recorder.next_digest = 0.0
    one_step(recorder)  # post_step digests: the error is recorded, not raised
    assert "step timing stopped after 0 measured steps" in recorder.error
    assert recorder.marks == [] and recorder.now() is None
    one_step(recorder)  # and the training goes on, untimed
    assert recorder.step_count == 4


def test_the_census_counts_bytes_of_dense_tensors_and_gives_up_on_sparse_ones():
    import torch

    from gpufill.script.census import StepCensus

    dtypes: Counter[str] = Counter()
    a, b, sparse = torch.ones(4, 8), torch.ones(8, 2), torch.eye(4).to_sparse()
    with StepCensus(dtypes) as census:
        torch.mm(a, b)
    assert census.ops == 1 and census.bytes == 4 * (32 + 16 + 8) and dtypes == {"float32": 1}
    with StepCensus(dtypes) as census:
        torch.sparse.mm(sparse, b[:4])  # nbytes would raise on a sparse tensor
    assert census.ops >= 1 and census.bytes is None
