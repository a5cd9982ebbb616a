"""`module:factory` models, checked in a child process: the scheduler never imports or calls user code.

A campaign's own model factories are code: importing one runs its module, calling it builds a model.
The scheduler needs only what a factory is (neural or classical, which parameters it takes) and
whether every grid point builds. One short-lived child process imports every factory of the file,
checks each grid (the same checks as for the built-in families) and reports back as JSON: a bad
value is still one line at ``file:line`` before anything runs. A child that crashes or hangs
(a segfault at import, a factory that never returns) costs the scheduler nothing: the factory is
taken as neural with any parameters, the run says so, and its trials fail in the workers (each
a fresh process) while the rest of the campaign goes on.

The child is ``python -m gpufill.campaign.spec.user_models_child IN OUT``.

How often a factory is called (each call must return a new model; side effects such as a download, a
log line or a counter happen each time, so keep them idempotent): once per grid point at load (in the
child above); once per trial, in the worker that trains it; and for a neural model whose trials may be
packed, a few more times per model shape in each worker while the pack size is checked and measured
(whether it packs, then a model per candidate size; remembered per shape and device afterwards). The
module itself is imported once in the child and once in each worker process. Measured on a CPU: 30
calls for 8 trials of 2 shapes in 2 workers (2 at load, 8 trained, 20 measuring the pack size).
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from gpufill.forecasting.models import registry

INSPECT_TIMEOUT_S = 300.0
"""A child that takes longer (a factory that hangs at import or while building) is given up on."""

_elsewhere: contextvars.ContextVar[bool] = contextvars.ContextVar("gpufill_user_models_elsewhere", default=False)
notes: dict[str, str] = {}
"""ref -> what went wrong checking it (the run prints it as a warning)."""


@contextlib.contextmanager
def checked_elsewhere() -> Iterator[None]:
    """Within the block, a campaign file's `module:factory` models are imported and built in a child process."""
    token = _elsewhere.set(True)
    try:
        yield
    finally:
        _elsewhere.reset(token)


def is_user_model(family: str) -> bool:
    return ":" in family and family not in registry.families()


def inspect_in_child(grids: Mapping[str, dict[str, Any]], lookback: int | None, horizon: int | None, *, search: bool = False
                     ) -> dict[str, dict[str, Any]]:
    """ref -> what the child found: {"kind", "defaults", "accepts_any", "error": None | {loc, problem, fix}}; each
    ref is also remembered by the registry, so `resolve` answers without importing it here. Only when asked
    (`checked_elsewhere`); otherwise {} and the caller checks in this process. `search`: ranges are axes (a search campaign)."""
    refs = {family: grid for family, grid in grids.items() if is_user_model(family) and not registry.is_remembered(family)}
    if not _elsewhere.get() or not refs:
        return {}
    with tempfile.TemporaryDirectory(prefix="gpufill-models-") as folder:
        request, answer = Path(folder) / "in.json", Path(folder) / "out.json"
        request.write_text(json.dumps({"grids": refs, "lookback": lookback, "horizon": horizon, "search": search}, default=str))
        problem = _run_child(request, answer)
        found = json.loads(answer.read_text()) if problem is None and answer.exists() else {}
    for ref in refs:
        if ref in found:
            info = found[ref]
            if info.get("kind") in ("neural", "classical"):
                registry.remember(registry.Family(ref, info["kind"], _built_in_workers(ref), MappingProxyType(info["defaults"]), info["accepts_any"]))
            continue
        reason = problem or "it reported nothing"
        notes[ref] = (f"checking model {ref} crashed ({reason}): it is taken as a neural model with any parameters; "
                      "its trials will fail in the workers if it is broken, the rest of the campaign runs")
        registry.remember(registry.Family(ref, "neural", _built_in_workers(ref), MappingProxyType({}), True))
        found[ref] = {"kind": "neural", "defaults": {}, "accepts_any": True, "error": None, "crashed": reason}
    return found


def _run_child(request: Path, answer: Path) -> str | None:
    """None when the child answered; else why not, in a few words."""
    try:
        # stdin /dev/null: a module that reads stdin at import gets end-of-file at once instead of waiting on the user's terminal.
        done = subprocess.run([sys.executable, "-m", "gpufill.campaign.spec.user_models_child", str(request), str(answer)], capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, timeout=INSPECT_TIMEOUT_S, start_new_session=True)
    except subprocess.TimeoutExpired:
        return f"no answer in {INSPECT_TIMEOUT_S:.0f} s"
    if done.returncode < 0:
        return f"killed by {signal.Signals(-done.returncode).name}"
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return f"exit code {done.returncode}: {last[:200]}"
    return None


def _built_in_workers(ref: str) -> Any:
    def factory(**_kwargs: Any) -> Any:
        raise RuntimeError(f"{ref} is built in the workers, not the scheduler")

    return factory
