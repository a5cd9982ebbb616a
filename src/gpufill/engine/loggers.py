"""Where a training's numbers go besides its FitResult: TensorBoard and MLflow (`fit(..., loggers=[...])`).

    fit(model, train, val, loggers=["tensorboard:runs/lstm", "mlflow:http://127.0.0.1:5000"])

Each logger is a `FitCallback`: at the start it writes the plan (every choice with its reason), after each epoch the
losses, the loss's other metrics, the learning rate, seconds and samples/s, and at the end the result's metrics,
timings and status. TensorBoard's event files are written by `torch.utils.tensorboard`; MLflow's run through its
client (`MlflowClient`: experiment `MLFLOW_EXPERIMENT_NAME`, else "gpufill"). Both are optional extras, refused in
one line naming the extra when absent. A logger that fails while training (a server gone away, a full disk) is
turned off with one warning: the training goes on, its FitResult holds everything.
"""

from __future__ import annotations

import importlib.util
import math
import os
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gpufill.engine.result import EpochRecord, FitCallback, FitResult
from gpufill.errors import InputError
from gpufill.mlflow_uri import client_defaults, resolve_tracking_uri

__all__ = ["LOGGER_KINDS", "TrainingLogger", "mlflow_experiment", "open_loggers", "parse_loggers"]

LOGGER_KINDS = {"tensorboard": ("tensorboard", "tensorboard"), "mlflow": ("mlflow", "mlflow")}
"""kind -> (the module it needs, the gpufill extra that installs it)."""
DEFAULT_EXPERIMENT = "gpufill"


def parse_loggers(specs: Sequence[str] | str | None) -> list[tuple[str, str]]:
    """(kind, target) of each of `specs` ("tensorboard:DIR", "mlflow:URI"), checked before anything trains: a
    malformed one, or one whose extra is not installed, is one line naming the fix."""
    if specs is None:
        return []
    parsed = []
    for spec in [specs] if isinstance(specs, str) else specs:
        kind, _, target = str(spec).partition(":")
        if kind not in LOGGER_KINDS or not target:
            raise InputError(f"logger {spec!r}", field="loggers", fix="write tensorboard:DIR or mlflow:URI (e.g. mlflow:http://127.0.0.1:5000)")
        module, extra = LOGGER_KINDS[kind]
        if importlib.util.find_spec(module) is None:
            raise InputError(f"the {kind} logger needs the {module} package", field="loggers", fix=f"pip install 'gpufill[{extra}]'")
        if kind == "mlflow":  # its local path absolute, for the database and the artifacts beside it alike
            target = resolve_tracking_uri(target, field="loggers")
        parsed.append((kind, target))
    return parsed


def open_loggers(parsed: Sequence[tuple[str, str]], *, run_name: str | None = None) -> list[TrainingLogger]:
    """The loggers `parse_loggers` checked; `run_name` names the run (fit_many: a variant's)."""
    return [TensorBoardLogger(Path(target), run_name) if kind == "tensorboard" else MlflowLogger(target, run_name) for kind, target in parsed]


class TrainingLogger(FitCallback):
    """Writes a training as it goes; `write_*` are the backend's, each failure turns the logger off once."""

    name = "logger"

    def __init__(self) -> None:
        self.live = True
        self.plan: dict[str, Any] = {}
        """The plan as last written."""

    def on_fit_start(self, plan: Any, epochs: int) -> None:
        self.plan = plan.to_dict()
        self._safely(self.write_plan, self.plan, 0)

    def on_epoch_end(self, record: EpochRecord) -> None:
        values = {"epoch/train_loss": record.train_loss, "epoch/val_loss": record.val_loss, "epoch/lr": record.lr, "epoch/seconds": record.seconds,
                  "epoch/samples_per_s": record.samples / record.seconds if record.samples and record.seconds > 0 else None}
        values.update({f"epoch/train_{k}": v for k, v in record.train_metrics.items()})
        values.update({f"epoch/val_{k}": v for k, v in (record.val_metrics or {}).items()})
        self._safely(self.write_scalars, _finite(values), record.epoch)

    def close(self, result: FitResult | None) -> None:
        """The result's metrics, timings and status (None: the training raised), then the writer closed."""
        if result is not None:
            ran = result.plan.to_dict()
            if ran != self.plan:  # the live trial or the thread watch changed a choice while training: the plan that ran
                self.plan = ran
                self._safely(self.write_plan, ran, len(result.history))
            final = {f"result/{k}": v for k, v in {**result.metrics, **result.timings}.items()}
            self._safely(self.write_scalars, _finite(final), len(result.history))
        self._safely(self.finish, result.status if result is not None else "failed")

    def replay(self, result: FitResult) -> None:
        """A training already finished (a fit_many pack's variant): its plan, epochs and result, as if live."""
        self.on_fit_start(result.plan, len(result.history))
        for record in result.history:
            self.on_epoch_end(record)
        self.close(result)

    def write_plan(self, plan: Mapping[str, Mapping[str, Any]], step: int) -> None:
        """Every choice with its reason, at the start (step 0) and again at the end where a choice changed while training."""
        raise NotImplementedError

    def write_scalars(self, values: Mapping[str, float], step: int) -> None:
        raise NotImplementedError

    def finish(self, status: str) -> None:
        raise NotImplementedError

    def _safely(self, write: Any, *args: Any) -> None:
        if not self.live:
            return
        try:
            write(*args)
        except Exception as error:  # noqa: BLE001 - the training goes on; its FitResult holds every number
            self.live = False
            warnings.warn(f"gpufill: the {self.name} logger stopped ({type(error).__name__}: {str(error)[:200]}); the training goes on, "
                          "its result holds every number", RuntimeWarning, stacklevel=2)


class TensorBoardLogger(TrainingLogger):
    name = "tensorboard"

    def __init__(self, folder: Path, run_name: str | None):
        super().__init__()
        from torch.utils.tensorboard import SummaryWriter

        from gpufill.files import make_folder

        target = folder / run_name if run_name else folder
        self.writer = SummaryWriter(log_dir=str(make_folder(target, field="loggers")))  # never through a link

    def write_plan(self, plan: Mapping[str, Mapping[str, Any]], step: int) -> None:
        rows = ["| choice | value | reason |", "|---|---|---|"]
        rows += [f"| {name} | {_cell(choice['value'])} | {_cell(choice['reason'])} |" for name, choice in plan.items()]
        self.writer.add_text("plan", "\n".join(rows), step)

    def write_scalars(self, values: Mapping[str, float], step: int) -> None:
        for key, value in values.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def finish(self, status: str) -> None:
        self.writer.add_text("status", status, 0)
        self.writer.close()


LOGGER_ENV = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "5", "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true"}
"""A training's MLflow requests give up in 5 s without retries (MLflow's defaults retried for minutes: a server that
was down held `fit` 273 s before it raised); a user's own values of these variables win."""


class MlflowLogger(TrainingLogger):
    name = "mlflow"

    def __init__(self, uri: str, run_name: str | None):
        super().__init__()
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=uri)
        try:
            with client_defaults(LOGGER_ENV):
                experiment = mlflow_experiment(self.client, uri, os.environ.get("MLFLOW_EXPERIMENT_NAME") or DEFAULT_EXPERIMENT)
                self.run_id = self.client.create_run(experiment, run_name=run_name, tags={"gpufill.kind": "fit"}).info.run_id
        except Exception as error:  # noqa: BLE001 - before anything trains: one line, the training not begun
            first = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
            raise InputError(f"MLflow at {uri} did not take the run ({type(error).__name__}: {first})", field="loggers",
                             fix="start the server (or fix the URI), or leave this logger out") from None

    def _safely(self, write: Any, *args: Any) -> None:
        with client_defaults(LOGGER_ENV):
            super()._safely(write, *args)

    def write_plan(self, plan: Mapping[str, Mapping[str, Any]], step: int) -> None:
        """Kept until the run ends: MLflow's params cannot change once written, and the live trial or the thread watch
        may change a choice while training (the plan that ran is written)."""

    def _write_plan_now(self, plan: Mapping[str, Mapping[str, Any]]) -> None:
        from mlflow.entities import Param

        params = [Param(f"plan.{name}", _cell(choice["value"])[:6000]) for name, choice in plan.items()]
        for start in range(0, len(params), 100):
            self.client.log_batch(self.run_id, params=params[start : start + 100])
        reasons = "\n".join(f"{name}: {choice['value']!r} - {choice['reason']}" for name, choice in plan.items())
        self.client.log_text(self.run_id, reasons, "plan.txt")

    def write_scalars(self, values: Mapping[str, float], step: int) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(key.replace("/", "_"), value, now, step) for key, value in values.items()])

    def finish(self, status: str) -> None:
        if self.plan:
            self._write_plan_now(self.plan)
        self.client.set_tag(self.run_id, "gpufill.status", status)
        self.client.set_terminated(self.run_id, status="FAILED" if status == "failed" else "FINISHED")


def mlflow_experiment(client: Any, uri: str, name: str, tags: Mapping[str, str] | None = None) -> str:
    """The id of experiment `name` at `uri`, made (or restored) when needed. A new experiment of a local store
    (sqlite:, file:) keeps its artifacts beside that store, in `mlartifacts/`: MLflow's default is ./mlruns in the
    current directory, a place the user never named."""
    found = client.get_experiment_by_name(name)
    if found is not None:
        if found.lifecycle_stage == "deleted":
            client.restore_experiment(found.experiment_id)
        return found.experiment_id
    scheme, _, rest = uri.partition(":")
    local = rest.lstrip("/") and scheme in ("sqlite", "file")
    artifacts = (Path("/" + rest.lstrip("/")).parent if scheme == "sqlite" else Path("/" + rest.lstrip("/"))) / "mlartifacts" if local else None
    return client.create_experiment(name, artifact_location=artifacts.as_uri() if artifacts else None, tags=dict(tags or {}))


def _finite(values: Mapping[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in values.items() if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)}


def _cell(value: Any) -> str:
    return str(value).replace("|", "/").replace("\n", " ")
