"""`gpufill export mlflow`: a campaign's finished trials copied to an MLflow tracking server (gpufill/tracking/mlflow_export.py)."""

from __future__ import annotations

from pathlib import Path

import typer

from gpufill.cli.app import app
from gpufill.errors import InputError

export_app = typer.Typer(help="Copy a campaign's results to where a team already tracks runs.", no_args_is_help=True)
app.add_typer(export_app, name="export")

EXPORT_ENV = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10", "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true"}
"""An export a person waits on: a request gives up after 10 s and one retry, so a server that does not answer is said
in about 20 s, not MLflow's several minutes (a user's own values of these variables win); and one line at the end,
not MLflow's "View run" line per trial."""


@export_app.command("mlflow")
def export_mlflow(
    workdir: Path | None = typer.Option(None, "--workdir", help="The campaign's workdir (default: the one here)."),
    uri: str = typer.Option(..., "--uri", help="MLflow tracking URI: http://HOST:PORT, sqlite:///path/mlflow.db, ..."),
    experiment: str | None = typer.Option(None, "--experiment", help="MLflow experiment (default: the file's tracking.experiment, else the campaign's name)."),
    follow: bool = typer.Option(False, "--follow", hidden=True, help="Export every few seconds until stdin closes (what a tracked run starts)."),
) -> None:
    """One MLflow run per finished trial (params, metrics, epoch curves, status), the report on a campaign run; run it
    again at any time: only what is missing or trained again since is sent."""
    from gpufill.tracking import mlflow_export as tracking
    from gpufill.campaign.results.reading import find_workdir
    from gpufill.campaign.store.store import DB_NAME
    from gpufill.mlflow_uri import client_defaults, resolve_tracking_uri

    if follow:  # started by a run as it begins (its URI resolved there): its workdir may not exist until the run says "go"
        raise typer.Exit(tracking.follow(workdir or Path.cwd(), uri, experiment=experiment))
    folder = find_workdir(workdir)
    uri = resolve_tracking_uri(uri, field="--uri", stores=[folder / DB_NAME])  # relative parts against here; never the store
    tracking.client_for(uri)  # the extra, checked before the store is read
    try:
        with client_defaults(EXPORT_ENV):
            outcome = tracking.export_mlflow(folder, uri, experiment=experiment)
    except InputError:
        raise
    except Exception as error:  # noqa: BLE001 - a server down or refusing: one line, nothing lost (the store is untouched)
        raise InputError(tracking.unreachable(error, uri), where=str(folder), field="--uri",
                         fix="start the server (or check the URI) and run this again: it sends only what is missing") from None
    print(outcome.line())
