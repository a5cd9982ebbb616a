"""`gpufill bench`: the before/after table on this machine, with what each speed-up is worth.

One training (by default a forecaster on gpufill's synthetic series; any model, data and
loss as a `BenchTarget`) run by the guides' starting loop ("before"), by gpufill with its
automatic plan, and by gpufill with each speed-up the plan chose switched off in turn; all
interleaved and repeated from the same initial weights (`compare`). The record has the same
JSON shape as the scripts under bench/.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import platform
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from rich import box
from rich.table import Table

from gpufill.bench.ablation import Ablation, ablations
from gpufill.bench.lightning import available as lightning_available
from gpufill.bench.loops import Comparison, compare
from gpufill.bench.target import BenchTarget
from gpufill.bench.utilisation import UtilisationMeter
from gpufill.engine.inputs import as_source
from gpufill.forecasting.data import Split, load_projects, make_windows
from gpufill.errors import InputError
from gpufill.files import write_atomically
from gpufill.engine.config import FitConfig
from gpufill.engine.hardware import detect, resolve_device
from gpufill.engine.prepare import measured_plan
from gpufill.forecasting.models import registry

# Each family's width parameter, which --hidden-size sets.
WIDTH_PARAM = {"lstm": "hidden_size", "gru": "hidden_size", "tcn": "channels", "transformer": "d_model", "mlp": "hidden_size"}
# The NVML sampler's interval: several readings even in a few-second run.
GPU_SAMPLE_S = 0.2
# On an idle machine one loop's rounds agree within ~20 %; a wider spread means something
# else is using the cores or the GPU, and the summary says the ratios are unreliable.
NOISY_SPREAD = 1.5


def environment(device: str = "auto") -> dict[str, Any]:
    """Where a measurement was taken: device, versions and date (every benchmark record starts with it)."""
    hardware = detect(device)
    return {
        "device": hardware.name,
        "device_type": hardware.device_type,
        "cpu_count": hardware.cpu_count,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }


@dataclasses.dataclass(kw_only=True, slots=True)
class BenchSettings:
    """What `gpufill bench` trains. The defaults take 1-2 minutes for the LSTM on 2 CPU cores."""

    model: str = "lstm"
    """A neural family (forecasting.family_names.built_in("neural")) for the forecaster bench; a BenchTarget replaces it."""
    epochs: int = 8
    """Sized with the defaults below for 1-2 minutes on 2 CPU cores (fit's own default is DEFAULTS.epochs)."""
    repeats: int = 5
    """Interleaved rounds; each row is the median-speed round, each ratio the median of per-round ratios."""
    length: int = 5000
    """Synthetic series length (10 % validation, 20 % test; the rest are training windows)."""
    lookback: int = 30
    hidden_size: int = 64
    """The family's width (hidden_size; channels for tcn; d_model for transformer)."""
    device: str = "auto"
    ablation: bool = True
    """Also run gpufill with each speed-up switched off in turn."""
    hand_loop: bool = True
    """Also run the careful hand-written fp32 loop (resident tensors, fused AdamW, no per-step sync)."""
    hand_tuned: bool = True
    """Also run that loop with the guides' settings switched on by hand (bf16 where fast, TF32, torch.compile)."""
    lightning: bool = True
    """Also run Lightning's Trainer (where Lightning is installed and the data are (inputs, targets) tensors)."""

    def validate(self, *, forecaster: bool = True) -> None:
        if forecaster and self.model not in WIDTH_PARAM:
            raise InputError(
                f"unknown model family {self.model!r} for bench", where="command line", field="--model",
                fix=f"use one of {', '.join(WIDTH_PARAM)} (bench compares neural training loops)",
            )
        for name in ("epochs", "repeats", "length", "lookback", "hidden_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                option = "--" + name.replace("_", "-")
                raise InputError(f"{option} must be a positive integer, got {value!r}", where="command line", field=option, fix=f"pass e.g. {option} {getattr(BenchSettings(), name)}")
        try:
            device = resolve_device(self.device)
        except RuntimeError as error:
            raise InputError(f"unknown device {self.device!r} ({error})", where="command line", field="--device", fix="pass auto, cpu, cuda or cuda:N") from None
        if device.type == "cuda" and not torch.cuda.is_available():
            raise InputError(f"device {self.device!r}: no CUDA device visible to torch", where="command line", field="--device", fix="pass --device cpu or auto")


@dataclasses.dataclass(slots=True)
class BenchReport:
    """One `gpufill bench` run: rows (before, gpufill, each ablation) and the ratios between them."""

    environment: dict[str, Any]
    model: str
    args: dict[str, Any]
    plan: dict[str, dict[str, Any]]
    """gpufill's measured plan for this training (its probe's outcome), every setting with its reason."""
    results: list[dict[str, Any]]
    ratios: dict[str, float]
    """speedup (gpufill / before samples/s), val_loss_ratio (gpufill / before), hand_loop_speedup (hand loop / before),
    gpufill_over_hand_loop, <speed-up>_worth (gpufill / ablated),
    round_spread (max / min samples/s over one loop's rounds, worst loop: above 1.5 the machine was busy)."""

    def to_dict(self) -> dict[str, Any]:
        return {**self.environment, "model": self.model, "args": self.args, "plan": self.plan, "results": self.results, "ratios": self.ratios}

    def write(self, path: str | Path) -> Path:
        """The JSON record, written atomically (a new tmp file + rename; a link at `path` is refused, never followed)."""
        return write_atomically(Path(path), json.dumps(self.to_dict(), indent=2) + "\n", field="--out")


def forecaster_target(settings: BenchSettings) -> BenchTarget:
    """The default training: one family on one synthetic project's windows, batch 128 before, gpufill's automatic batch."""
    project = next(iter(load_projects("synthetic", n_projects=1, length=settings.length, seed=0).values()))
    windows = make_windows(project, settings.lookback, 1, Split(val=0.1, test=0.2))
    params = {WIDTH_PARAM[settings.model]: settings.hidden_size}

    def make_model() -> torch.nn.Module:
        torch.manual_seed(0)  # every loop starts from the same weights
        return registry.build(settings.model, n_features=windows.n_features, lookback=settings.lookback, horizon=1, params=params)

    make_model()  # a bad width (e.g. d_model not divisible by nhead) fails here, before any timing
    return BenchTarget(name=settings.model, make_model=make_model, train=(windows.x_train, windows.y_train), val=(windows.x_val, windows.y_val),
                       epochs=settings.epochs, args={"model": settings.model, **params, "lookback": settings.lookback, "horizon": 1,
                                                     "series_length": settings.length, "train_windows": int(windows.x_train.shape[0])})


def run_bench(settings: BenchSettings | None = None, *, target: BenchTarget | None = None, progress: Callable[[str], None] | None = None,
              meter: UtilisationMeter | None = None) -> BenchReport:
    """Train before, gpufill and each ablation on `target` (default: the forecaster `settings` name); see the module docstring.

    `settings` gives the rounds, device, ablation and hand loop for any target."""
    settings = settings or BenchSettings()
    settings.validate(forecaster=target is None)
    target = target or forecaster_target(settings)
    target.validate()
    device = str(resolve_device(settings.device))
    hand_loop = settings.hand_loop and as_source(target.train, "train").kind == "tensors"  # the hand loop indexes tensors in memory
    config = FitConfig(**{"device": device, "loss": target.loss, "lr": target.lr, "epochs": target.epochs, **target.fit_options})
    if progress is not None:
        progress("measuring gpufill's plan (its probe, once)")
    plan = measured_plan(target.make_model(), target.train, target.val, config=config)
    chosen = ablations(plan) if settings.ablation else []
    own_meter = meter is None
    meter = meter or UtilisationMeter(device, interval=GPU_SAMPLE_S)
    try:
        comparison = compare(
            target.make_model, target.train, target.val, epochs=target.epochs, loss=target.loss, lr=target.lr, batch_size=target.batch_size,
            micro_batch=target.micro_batch, fit_options=target.fit_options, device=device, repeats=settings.repeats,
            variants={a.label: a.overrides() for a in chosen}, meter=meter, progress=progress, minimal=hand_loop,
            hand_tuned=hand_loop and settings.hand_tuned, lightning=settings.lightning and lightning_available() and _pairs(target.train),
        )
    finally:
        if own_meter:
            meter.close()
    args = {**target.record(), "repeats": settings.repeats, "ablation": settings.ablation, "hand_loop": hand_loop}
    return BenchReport(environment(device), target.name, args, plan.to_dict(), _rows(comparison, chosen), _ratios(comparison, chosen))


def _pairs(data: Any) -> bool:
    """(inputs, targets) tensors: what the Lightning row's TensorDataset takes."""
    return isinstance(data, tuple | list) and len(data) == 2 and all(isinstance(t, torch.Tensor) for t in data)


def _rows(comparison: Comparison, chosen: list[Ablation]) -> list[dict[str, Any]]:
    rows = comparison.rows()
    before, gpufill = rows[0], rows[1]
    out = [{**before, "loop": "before", "ablation": None, "setting": None, "worth": None},
           {**gpufill, "ablation": None, "setting": None, "worth": None}]
    if comparison.minimal:  # worth, as for an ablation: gpufill samples/s / this row's
        out.append({**rows[2], "loop": "hand loop", "ablation": None, "setting": None, "worth": round(comparison.gpufill_over_minimal(), 3)})
    first_other = 2 + bool(comparison.minimal)
    for name, row in zip(comparison.others, rows[first_other:], strict=False):
        out.append({**row, "loop": name, "ablation": None, "setting": None, "worth": round(comparison.over(name), 3)})
    for ablation, row in zip(chosen, rows[first_other + len(comparison.others):], strict=True):
        out.append({**row, "ablation": ablation.name, "setting": ablation.describe(), "worth": round(comparison.worth(ablation.label), 3)})
    return out


def _ratios(comparison: Comparison, chosen: list[Ablation]) -> dict[str, float]:
    ratios = {"speedup": comparison.speedup(), "val_loss_ratio": comparison.quality_ratio()}
    if comparison.minimal:
        ratios["hand_loop_speedup"] = comparison.minimal_over_baseline()
        ratios["gpufill_over_hand_loop"] = comparison.gpufill_over_minimal()
    for name in comparison.others:
        ratios[f"gpufill_over_{name.replace(', ', '_').replace(' ', '_')}"] = comparison.over(name)
    ratios.update({f"{ablation.key}_worth": comparison.worth(ablation.label) for ablation in chosen})
    loops = [runs for runs in (comparison.baseline, comparison.gpufill, comparison.minimal, *comparison.others.values(), *comparison.variants.values()) if runs]
    # How far one loop's rounds disagree (max / min samples/s, worst loop): the noise floor of every ratio above.
    ratios["round_spread"] = max(max(m.samples_per_s for m in runs) / min(m.samples_per_s for m in runs) for runs in loops)
    return ratios


def bench_table(report: dict[str, Any]) -> Table:
    """The rows of a BenchReport.to_dict() as a rich table (fits 80 columns; the settings are in summary_lines)."""
    args = report["args"]
    rounds = f"{args['repeats']} round" + ("s" if args["repeats"] != 1 else "")
    table = Table(
        title=f"gpufill bench: {report['model']}, {_samples(args)} x {args['epochs']} epochs, median of {rounds}"
        f" — {report['device']}, torch {report['torch']}, {report['date'][:10]}",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
    )
    for column in ("loop", "samples/s", "epoch s", "GPU %", "peak MiB", "val loss", "worth"):
        table.add_column(column, justify="left" if column == "loop" else "right", no_wrap=True)
    for row in report["results"]:
        table.add_row(
            f"  - {row['ablation']}" if row["ablation"] else row["loop"], f"{row['samples_per_s']:,.0f}", f"{row['epoch_s']:.3g}",
            _maybe(row["gpu_util"], "{:.0f}"), _maybe(row["peak_memory_mib"], "{:,.0f}"), f"{row['val_loss']:.4g}", _maybe(row["worth"], "{:.2f}x"),
            style="bold" if row["loop"] == "gpufill" else None,
        )
    return table


def summary_lines(report: dict[str, Any]) -> list[str]:
    """The speed-up, quality and per-ablation sentences printed under the table."""
    ratios, rounds = report["ratios"], report["args"]["repeats"]
    lines = [
        f"speed-up: gpufill trains {ratios['speedup']:.2f}x the samples/s of the before loop (median of {rounds} paired rounds); "
        + f"validation loss gpufill / before: {ratios['val_loss_ratio']:.3f}"
    ]
    if "gpufill_over_hand_loop" in ratios:
        lines.append(f"hand loop (a careful hand-written fp32 loop: resident tensors, fused AdamW, no per-step sync): "
                     f"{ratios['hand_loop_speedup']:.2f}x the before loop; gpufill / hand loop: {ratios['gpufill_over_hand_loop']:.2f}x")
    if "gpufill_over_hand_loop_tuned" in ratios:
        lines.append(f"hand loop, tuned (the guides' settings by hand: bf16 where fast, TF32, torch.compile): "
                     f"gpufill / it: {ratios['gpufill_over_hand_loop_tuned']:.2f}x")
    if "gpufill_over_lightning" in ratios:
        lines.append(f"Lightning's Trainer (logger, checkpoints, progress bar off): gpufill / it: {ratios['gpufill_over_lightning']:.2f}x")
    ablated = [row for row in report["results"] if row["ablation"]]
    if ablated:
        lines.append("rows \"- X\": gpufill with speed-up X switched off; worth = gpufill samples/s / that row's (above 1: X helps here)")
        lines.extend(f"  {row['ablation']} ({row['setting']}): {row['worth']:.2f}x" for row in ablated)
    spread = ratios.get("round_spread", 1.0)
    if spread > NOISY_SPREAD:
        lines.append(f"warning: the rounds of one loop differ by {spread:.1f}x in samples/s: other processes were competing for this machine, "
                     "so the ratios above are unreliable; re-run when it is idle")
    return lines


def _maybe(value: float | None, form: str) -> str:
    return "-" if value is None else form.format(value)


def _samples(args: dict[str, Any]) -> str:
    if "train_windows" in args:
        return f"{args['train_windows']} windows"
    return f"{args['train_samples']} samples" if args.get("train_samples") else "a stream"
