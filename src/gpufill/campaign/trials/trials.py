"""Trial expansion: a CampaignSpec and its project names -> the campaign's trials (forecasting.trial.Trial), in a fixed order.

A trial's id is a hash of everything that changes its result, and nothing else, so a
re-run, a larger grid, more seeds or more projects keep every existing id (and result):
project, family, model params, training overrides, seed, lookback, the data spec without
``projects``, the project's data fingerprint (`Project.fingerprint`: of its cells as read, or
of the synthetic generator's version and arguments, never of computed floats, so the same on
every machine; an edited file re-runs exactly the trials of the projects it changed), the task spec without the lookback list and
``metric`` (which only ranks), and, for neural families, the global train spec. Resources
never enter it. A global-mode trial trains on every project at once, so its id holds every
project's name and fingerprint: adding or changing a project re-runs it (while a local trial
of an untouched project keeps its id). `config_id` is the same hash without the seed: the
configuration a summary averages seeds over.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from gpufill.errors import InputError
from gpufill.forecasting.trial import GLOBAL_PROJECT, Trial

if TYPE_CHECKING:  # trials stay light (the store imports them); the spec imports torch
    from gpufill.campaign.spec.spec import CampaignSpec

__all__ = ["GLOBAL_PROJECT", "Trial", "data_digest", "canonical", "expand", "expand_points", "id_base", "trial_id"]


def expand(spec: CampaignSpec, projects: Sequence[str] | Mapping[str, str]) -> list[Trial]:
    """Every trial of the campaign, ordered by project (by name), family (file order), lookback, grid point, seed
    (a statistical reference: one seed, `CampaignSpec.seeds_of`).

    `projects`: names, or names -> data fingerprint (`Project.fingerprint()`), which then
    enters each trial's identity. Grid points are the cartesian product of each family's axes
    in file key order (the last key varies fastest). In global mode each (family, grid point,
    lookback, seed) is one trial over all projects, with project "*".
    """
    families = []
    for family, axes in spec.models.items():
        points = [dict(zip(axes, combo)) for combo in itertools.product(*axes.values())]
        families.append((family, points, spec.lookbacks(family)))
    return expand_points(spec, projects, families)


def expand_points(spec: CampaignSpec, projects: Sequence[str] | Mapping[str, str],
                  families: Sequence[tuple[str, Sequence[Mapping[str, Any]], Sequence[int]]]) -> list[Trial]:
    """The trials of given grid points: (family, its points, the lookbacks each runs at) in that order, every
    seed of the family, on every project (global mode: one trial over all). `expand` gives every point of the
    grids; a search (campaign/trials/search.py) the configurations its sampler proposed. The ids are the same either way."""
    names = _check_projects(projects if isinstance(projects, str) else list(projects))
    prints = {name: str(projects[name]) for name in names} if isinstance(projects, Mapping) else dict.fromkeys(names, "")
    if spec.task.mode == "global":
        targets = [GLOBAL_PROJECT]
        prints[GLOBAL_PROJECT] = data_digest(prints) if any(prints.values()) else ""
    else:
        targets = sorted(names)
    base = {kind: _id_base(spec, kind, names) for kind in ("neural", "classical")}
    base_ids = {kind: _digest(value) for kind, value in base.items()}
    listed = [(family, spec.kind(family), [spec.split_point(family, point) for point in points], lookbacks, spec.seeds_of(family))
              for family, points, lookbacks in families]
    trials = []
    for project in targets:
        for family, kind, points, lookbacks, seeds in listed:
            for lookback in lookbacks:
                for params, train in points:
                    shape = _shape(spec, family, kind, params, train, lookback)
                    config_id = _hash(base[kind], project, family, params, train, None, lookback, prints[project])
                    for seed in seeds:
                        tid = _hash(base[kind], project, family, params, train, seed, lookback, prints[project])
                        trials.append(Trial(tid, project, family, kind, params, train, seed, lookback, shape, prints[project], config_id, base_ids[kind]))
    return trials


def data_digest(prints: Mapping[str, str]) -> str:
    """A global-mode trial's data fingerprint: of every project's name and fingerprint (what a worker checks its data against)."""
    return _digest(sorted(prints.items()))


def id_base(spec: CampaignSpec, kind: str, projects: Sequence[str] = ()) -> dict[str, Any]:
    """What every trial of `kind` shares (stored once per base_id; the rest of a row's configuration is in its columns)."""
    return _id_base(spec, kind, projects)


def trial_id(
    *,
    project: str,
    family: str,
    params: Mapping[str, Any],
    train: Mapping[str, Any],
    seed: int,
    lookback: int,
    spec: CampaignSpec,
    projects: Sequence[str] | None = None,
    data_fingerprint: str = "",
) -> str:
    """The id :func:`expand` gives this trial of ``spec``; a global-mode trial needs all ``projects``.

    `data_fingerprint`: the one expand gave the trial (the project's; global mode: all projects')."""
    if spec.task.mode == "global" and projects is None:
        raise InputError("a global-mode trial id depends on all the campaign's projects", fix="pass projects=[...] (the names given to expand)", field="projects")
    base = _id_base(spec, spec.kind(family), _check_projects(projects) if projects is not None else [])
    return _hash(base, project, family, dict(params), dict(train), seed, lookback, data_fingerprint)


# --- internals ---------------------------------------------------------------------------------


def _check_projects(projects: Sequence[str]) -> list[str]:
    if isinstance(projects, str):
        raise InputError("projects must be a list of names, not one string", fix="pass e.g. ['p000', 'p001']", field="projects")
    names = [str(name) for name in projects]
    if not names:
        raise InputError("no projects to run trials on", fix="check data.projects and the data source", field="data.projects")
    if GLOBAL_PROJECT in names:
        raise InputError(f"project name {GLOBAL_PROJECT!r} is reserved for global-mode trials", fix="rename that project", field="data.projects")
    if len(set(names)) != len(names):
        twice = sorted({name for name in names if names.count(name) > 1})
        raise InputError(f"project(s) {', '.join(map(repr, twice))} given twice", fix="give each project once", field="data.projects")
    return names


def _id_base(spec: CampaignSpec, kind: str, projects: Sequence[str]) -> dict[str, Any]:
    """The parts of a trial's identity that every trial of ``kind`` in ``spec`` shares."""
    task = spec.task.model_dump(mode="json", exclude={"lookback", "metric"})
    base: dict[str, Any] = {"data": spec.data.model_dump(mode="json", exclude={"projects"}), "task": task}
    if spec.task.mode == "global":  # one model over all projects: which ones changes its result
        base["projects"] = sorted(projects)
    if kind == "neural":  # classical models have no epochs, lr or batch: train: never moves their results
        # batch_search (how a step is split into micro-batches) and cuda_graph (how a pack's step is
        # launched) change results by float rounding at most, so they are not part of the identity:
        # turning them on must not re-run a finished campaign.
        base["train_spec"] = spec.train.model_dump(mode="json", exclude={"batch_search", "cuda_graph"})
        if base["train_spec"].get("optimizer") == "adamw":  # the optimizer before the setting existed: those files keep their ids
            del base["train_spec"]["optimizer"]
        if base["train_spec"].get("refit") is False:  # as before the setting existed
            del base["train_spec"]["refit"]
        if base["train_spec"].get("max_steps", 0) is None:  # as before the setting existed
            del base["train_spec"]["max_steps"]
    return base


def _hash(base: Mapping[str, Any], project: str, family: str, params: dict[str, Any], train: dict[str, Any], seed: int | None, lookback: int,
          fingerprint: str) -> str:
    task = {**base["task"], "lookback": lookback}
    payload = {**base, "task": task, "project": project, "family": family, "params": params, "train": train}
    if seed is not None:  # None: the configuration's id (seeds averaged over)
        payload["seed"] = seed
    if fingerprint:
        payload["data_fingerprint"] = fingerprint
    return _digest(payload)


def _digest(value: Any) -> str:
    return hashlib.sha256(canonical(value).encode()).hexdigest()[:16]


def canonical(value: Any) -> str:
    # default=str: a YAML date in a grid still hashes the same way in every process
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str)


def _shape(spec: CampaignSpec, family: str, kind: str, params: dict[str, Any], train: dict[str, Any], lookback: int) -> str:
    """Readable group key: lstm[lookback=30 batch_size=auto epochs=50 | hidden_size=128 num_layers=1]."""
    if kind == "classical":
        return f"{family}[lookback={lookback}]"
    batch = train.get("batch_size", spec.train.batch_size)
    epochs = train.get("epochs", spec.train.epochs)
    steps = train.get("max_steps", spec.train.max_steps)
    budget = f" max_steps={steps}" if steps is not None else ""  # a pack's members share one length
    model = " ".join(f"{key}={canonical(value)}" for key, value in params.items())
    # A pack's members share one loss, schedule and optimizer (lr and scaling are each member's own).
    shared = "".join(f" {key}={train[key]}" for key in ("loss", "schedule", "optimizer") if key in train)
    return f"{family}[lookback={lookback} batch_size={batch} epochs={epochs}{budget}{shared} | {model}]"
