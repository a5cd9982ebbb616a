"""The campaign file's `train:` section: every neural trial's training settings, their defaults (FitConfig's,
but for a forecaster's length) and one trial's FitConfig."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, StrictBool, ValidationError, field_validator

from gpufill.campaign.spec.grid_checks import TRAIN_KEYS
from gpufill.campaign.spec.spec_errors import dotted, explain
from gpufill.campaign.spec.spec_types import Count, Float, Spec, digits
from gpufill.errors import InputError
from gpufill.forecasting.training import DEFAULTS, FORECAST_EPOCHS, FORECAST_PATIENCE, REGRESSION_LOSSES, SCHEDULES, FitConfig, check_patience


def _patience(value: Any) -> Any:
    return check_patience(digits(value), none="null")  # fit's one check: 0 or null is off, a negative is refused


class EarlyStoppingSpec(Spec):
    patience: Annotated[int | None, BeforeValidator(_patience)] = FORECAST_PATIENCE
    """Validations without improvement before a training stops; 0 or null turns early stopping off (as
    `early_stopping: null` does, and as in fit and `gpufill train --patience 0`)."""
    min_delta: Annotated[Float, Field(ge=0)] = 0.0
    """Smallest drop in validation loss that counts as an improvement."""


class TrainSpec(Spec):
    """Training settings for every neural trial (a family's grid may override TRAIN_KEYS)."""

    # Defaults are FitConfig's (engine/config.py), the one home of training defaults, but for the length:
    # a forecaster's (forecasting/training.py: an upper bound that early stopping ends).
    epochs: Count = FORECAST_EPOCHS
    max_steps: Count | None = DEFAULTS.max_steps
    """A budget of optimizer steps: a training ends at this many if its epochs have not ended it (a schedule decays over
    it), so a data set of many windows trains no longer than one of few, as neuralforecast's max_steps; a refit trains
    at most as many. null: the epochs decide."""
    batch_size: Count | Literal["auto"] = DEFAULTS.batch_size
    """Effective batch; "auto": the plan picks it for throughput."""
    precision: Literal["auto", "bf16", "fp16", "fp32"] = DEFAULTS.precision
    compile: StrictBool | Literal["auto"] = DEFAULTS.compile
    cuda_graph: StrictBool | Literal["auto"] = DEFAULTS.cuda_graph
    """Fused packs on a GPU: replay each step as one captured CUDA graph (auto: when measured faster; cached per shape)."""
    batch_search: StrictBool | Literal["auto"] = DEFAULTS.batch_search
    """Measure micro-batch sizes and keep the fastest (auto: on GPUs for long trainings); cached per shape in the workdir."""
    optimizer: Literal["adamw", "adam", "sgd"] = DEFAULTS.optimizer  # type: ignore[assignment]  # the default is the string "adamw"
    """As `gpufill.fit` builds it: adamw (decay on weight matrices only), adam (L2 on every parameter) or sgd (momentum
    0.9); packs step each as itself."""
    lr: Annotated[Float, Field(gt=0)] = DEFAULTS.lr
    weight_decay: Annotated[Float, Field(ge=0)] = DEFAULTS.weight_decay
    early_stopping: EarlyStoppingSpec | None = EarlyStoppingSpec()
    """null turns early stopping off (on by default in campaigns: thousands of trainings should not run past their best)."""
    validate_every: Count = DEFAULTS.validate_every
    loss: Literal[("auto", *REGRESSION_LOSSES)] = "auto"  # type: ignore[valid-type]  # engine/config.py names them
    """auto: the family's recipe (forecasting.recipes): MAE for the built-in networks."""
    schedule: Literal[("auto", *SCHEDULES)] = "auto"  # type: ignore[valid-type]
    """Learning-rate schedule; auto: the family's recipe (constant, with early stopping deciding the length)."""
    refit: StrictBool = False
    """Once validation has chosen a network's length (its best epoch, where early stopping stopped it or not), train it
    again from its initial weights on training + validation for that many epochs and forecast the test from it, as the
    classical families are refit; its validation scores (what choices read) stay the first training's. Twice a training's cost, for a model that has
    learned the most recent history: the test window follows it."""

    @field_validator("early_stopping", mode="before")
    @classmethod
    def _no_false(cls, value: Any) -> Any:
        if isinstance(value, bool):
            raise InputError(
                f"early_stopping: {str(value).lower()} is not a setting",
                fix="write early_stopping: null to turn it off, or a mapping such as {patience: 5}",
            )
        return value

    @field_validator("early_stopping")
    @classmethod
    def _patience_off(cls, value: EarlyStoppingSpec | None) -> EarlyStoppingSpec | None:
        # patience 0 or null is early stopping off: stored as `early_stopping: null`, so the three spellings are one
        # setting (the same trial ids, the same FitConfig).
        return None if value is not None and value.patience is None else value

    def fit_config(self, overrides: Mapping[str, Any], seed: int) -> FitConfig:
        """The FitConfig of one trial: these settings, the trial's overrides, its seed."""
        unknown = sorted(set(overrides) - TRAIN_KEYS)
        if unknown:
            raise InputError(f"{', '.join(map(repr, unknown))} is not a training setting",
                             fix=f"override only {', '.join(sorted(TRAIN_KEYS))}", field="train")
        merged = self
        if overrides:
            try:
                merged = TrainSpec.model_validate({**self.model_dump(), **overrides})
            except ValidationError as exc:
                first = exc.errors()[0]
                field = dotted(("train", *first["loc"][:1]))
                problem, fix = explain([err for err in exc.errors() if err["loc"][:1] == first["loc"][:1]], field)
                raise InputError(problem, fix=fix, field=field) from None
        stop = merged.early_stopping
        return FitConfig(
            epochs=merged.epochs,
            max_steps=merged.max_steps,
            lr=merged.lr,
            optimizer=merged.optimizer,
            weight_decay=merged.weight_decay,
            batch_size=merged.batch_size,
            precision=merged.precision,
            compile=merged.compile,
            cuda_graph=merged.cuda_graph,
            batch_search=merged.batch_search,
            validate_every=merged.validate_every,
            patience=stop.patience if stop else None,
            min_delta=stop.min_delta if stop else 0.0,
            seed=seed,
            verbose=False,  # a campaign's progress is its live table, not a line per trial's epoch
        )
