"""Choices made by measurement: the probe's candidates (precision, TF32, cudnn.benchmark, the
optimizer kernel, the step graph, compile, CPU threads), the batch size, DataLoader settings,
and their cache.

Each is a small pure decision plus a measurement: `resolver.py` decides from measurements,
`probe.py` measures a single training's real steps and puts everything back, `cache.py` keeps a
shape's measurements for the next training of that shape. Packs measure with the same resolver
from their own folder (`engine/packs/probe.py`, `engine/packs/size.py`): packs use measure, never
the other way round.
"""

from gpufill.engine.measure.batch import BatchSearchResult, BatchTrial, candidate_sizes, search_batch
from gpufill.engine.measure.cache import TuneCache, shape_key
from gpufill.engine.measure.loader import loader_candidates, tune_loader
from gpufill.engine.measure.resolver import Measurement, resolve

__all__ = [
    "BatchSearchResult",
    "BatchTrial",
    "Measurement",
    "TuneCache",
    "candidate_sizes",
    "loader_candidates",
    "resolve",
    "search_batch",
    "shape_key",
    "tune_loader",
]
