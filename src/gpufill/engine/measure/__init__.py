"""Choices made by measurement: batch size, DataLoader settings, compile.

Each is a small pure decision plus a measurement; the loop runs the measurements on the
real model (state restored afterwards) and puts the outcome into the Plan with the
numbers that decided it.
"""

from gpufill.engine.measure.apply import MeasuredChoices
from gpufill.engine.measure.batch import (
    BatchSearchResult,
    BatchTrial,
    candidate_sizes,
    search_batch,
)
from gpufill.engine.measure.cache import TuneCache, shape_key
from gpufill.engine.measure.compile import CompileMeasurement, decide_compile
from gpufill.engine.measure.loader import loader_candidates, tune_loader
from gpufill.engine.measure.state import preserved

__all__ = [
    "BatchSearchResult",
    "BatchTrial",
    "CompileMeasurement",
    "MeasuredChoices",
    "TuneCache",
    "candidate_sizes",
    "decide_compile",
    "loader_candidates",
    "preserved",
    "search_batch",
    "shape_key",
    "tune_loader",
]
