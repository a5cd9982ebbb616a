"""`tracking:` where a campaign's trials are copied to as they finish (campaign/run/tracking.py starts it; gpufill/tracking/mlflow_export.py copies them).

    tracking:
      mlflow: http://127.0.0.1:5000   # an MLflow tracking URI: a server, or sqlite:///path/mlflow.db, or file:/path
      experiment: my-study             # left out: the campaign's name

The store stays the record: tracking never decides what runs, never changes a trial id, and a server that is down
never stops or slows the campaign (`gpufill export mlflow` catches up later). `gpufill run --mlflow URI` sets or
overrides `mlflow` for one run.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator

from gpufill.campaign.spec.spec_types import Spec

__all__ = ["TrackingSpec", "check_uri"]

_URI = re.compile(r"^\S+$")


def check_uri(value: str) -> str:
    """A tracking URI: one word of printable characters (MLflow reads the scheme: http, https, sqlite, file, ...)."""
    if not value or not _URI.match(value) or not value.isprintable():
        raise ValueError("an MLflow tracking URI is one word, e.g. http://127.0.0.1:5000 or sqlite:///path/mlflow.db")
    return value


def check_experiment(value: str) -> str:
    if not value.strip() or not value.isprintable():
        raise ValueError("an experiment name has printable characters, not only spaces")
    return value


TrackingUri = Annotated[str, AfterValidator(check_uri)]


class TrackingSpec(Spec):
    mlflow: TrackingUri | None = None
    """The MLflow tracking URI every finished trial is copied to (one run per trial, keyed by its trial id)."""
    experiment: Annotated[str, AfterValidator(check_experiment)] | None = None
    """The MLflow experiment (default: the campaign's name)."""

