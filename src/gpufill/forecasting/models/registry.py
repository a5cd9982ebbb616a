"""Model families by name: the built-in ones and the user's own ``package.module:factory``.

A family is a factory ``(n_features, lookback, horizon, *, **params)`` plus the keyword
parameters (and defaults) read from its signature. The built-in families are listed in ``builtin.py``: until
the first :func:`build` of one imports that list (torch, the fused kernels), :func:`resolve` answers from their
description (``catalog.py``), so a process that only reads a campaign file never imports torch. A user's family is
registered with :func:`register` (it takes precedence over a built-in of the same name) or named by a
``package.module:factory`` path, imported on demand by :func:`resolve`.
A variant ``family@tag`` (``nbeats@mean``, forecasting/family_names.py) resolves to the built-in family.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import sys
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal, TypeVar, get_args

from gpufill import user_code
from gpufill.errors import InputError
from gpufill.forecasting.family_names import VARIANT, base_name, valid_tag
from gpufill.forecasting.models.catalog import BUILT_IN

__all__ = ["Family", "ModelKind", "build", "check_params", "families", "register", "resolve"]

ModelKind = Literal["neural", "classical"]
F = TypeVar("F", bound=Callable[..., Any])

_KINDS: tuple[str, ...] = get_args(ModelKind)
# Given by the task, not by the model's parameter grid: every factory receives them from build().
_SHAPE_ARGS = ("n_features", "lookback", "horizon")
_PATH_FORM = "'package.module:factory'"


@dataclass(frozen=True)
class Family:
    """One model family: how to build it and which parameters it accepts."""

    name: str
    """Registered name (``lstm``) or the ``package.module:factory`` path it was resolved from."""
    kind: ModelKind
    """``neural`` runs on the GPU lane, ``classical`` on the CPU lane."""
    factory: Callable[..., Any]
    """Called as ``factory(n_features=..., lookback=..., horizon=..., **params)``."""
    defaults: Mapping[str, Any] = field(hash=False)
    """Keyword parameters and their defaults (read-only), shape arguments excluded."""
    accepts_any: bool = field(default=False, compare=False)
    """True when the factory takes ``**kwargs``: any extra parameter name is passed through."""
    fits_series: bool = field(default=False, compare=False)
    """A statistical family fits the series itself, not windows (forecasting.models.classical.statistical): no window
    scaling, loss or schedule applies to it. Read from the factory: it has a callable ``fit_series``."""
    deterministic: bool = field(default=False, compare=False)
    """The factory says its forecasts draw no random number (``deterministic = True``: the built-in statistical
    references): every seed gives the same result, so a campaign runs it with one seed."""


_FAMILIES: dict[str, Family] = {}
"""name -> each family registered with `register` in this process."""
_LOADED: dict[str, Family] = {}
"""name -> each built-in family, once `load_built_in` has imported them."""
_BUILT_IN_MODULE = "gpufill.forecasting.models.builtin"


def register(name: str, *, kind: ModelKind = "neural") -> Callable[[F], F]:
    """Decorator registering a factory (class or function) as model family ``name``.

    Re-registering a name replaces the earlier family; a registered name hides the built-in family of that name.
    """
    if not isinstance(name, str) or not name or ":" in name or name != name.strip():
        raise InputError(f"family name must be a non-empty string without ':' or surrounding spaces, got {name!r}",
                         fix="register the factory under a plain name such as 'my_lstm'", field="model")
    _check_kind(kind)

    def decorate(factory: F) -> F:
        _FAMILIES[name] = _family(name, kind, factory)
        return factory

    return decorate


def resolve(name: str) -> Family:
    """The family registered as ``name``, or the factory at ``package.module:factory``.

    An imported factory is ``neural`` unless it carries ``gpufill_kind = "classical"``.
    """
    if not isinstance(name, str):
        raise InputError(f"model family must be a string, got {type(name).__name__}",
                         fix=f"give a family name such as 'lstm' or {_PATH_FORM}", field="model")
    if name in _FAMILIES:
        return _FAMILIES[name]
    if name in _REMEMBERED:
        return _REMEMBERED[name]
    if name in BUILT_IN:
        return _built_in(name)
    if base_name(name) != name:
        return _variant(name)
    if ":" not in name:
        raise InputError(f"unknown model family {name!r}{_suggestion(name)}; known: {', '.join(families()) or 'none'}",
                         fix=f"use a known family or point to your own factory as {_PATH_FORM}", field="model")
    return _import_family(name)


def families(kind: ModelKind | None = None) -> list[str]:
    """Registered family names, sorted; only those of ``kind`` when given."""
    if kind is not None:
        _check_kind(kind)
    kinds = {**{name: entry["kind"] for name, entry in BUILT_IN.items()}, **{name: family.kind for name, family in _FAMILIES.items()}}
    return sorted(name for name, its_kind in kinds.items() if kind is None or its_kind == kind)


def describe(family: Family) -> dict[str, Any]:
    """What `catalog.py` keeps of a family: everything but the factory itself, which is named by its import path."""
    factory = family.factory
    return {"kind": family.kind, "factory": f"{factory.__module__}:{factory.__qualname__}", "defaults": dict(family.defaults),
            "accepts_any": family.accepts_any, "fits_series": family.fits_series, "deterministic": family.deterministic}


def describe_built_in() -> dict[str, dict[str, Any]]:
    """name -> `describe` of each built-in family, read from its factory (the catalogue's source: tools/family_catalog.py)."""
    loaded = load_built_in()
    return {name: describe(loaded[name]) for name in sorted(loaded)}


def load_built_in() -> Mapping[str, Family]:
    """name -> every built-in family, its module imported (`builtin.py`: torch and the fused kernels come with it)."""
    if not _LOADED:
        builtin = importlib.import_module(_BUILT_IN_MODULE)
        _LOADED.update({name: _family(name, kind, factory) for kind, factories in builtin.FAMILIES.items()
                        for name, factory in factories.items()})
    return MappingProxyType(_LOADED)


def check_params(name: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """The family's defaults updated with ``params``; an unknown parameter is an error.

    Values are not checked here: the factory checks them when the model is built.
    """
    family = resolve(name)
    if not isinstance(params, Mapping):
        raise InputError(f"parameters must be a mapping of name to value, got {type(params).__name__}",
                         fix="give the parameters as a dict, e.g. {hidden_size: 64}", field=family.name)
    unknown = sorted(str(key) for key in params if key not in family.defaults)
    if unknown and not family.accepts_any:
        accepted = ", ".join(family.defaults) or "none"
        raise InputError(f"unknown parameter(s) {', '.join(unknown)} for model family {family.name!r}; accepted: {accepted}",
                         fix="remove or rename the parameter (training settings such as lr belong to train:)", field=f"{family.name}.{unknown[0]}")
    return {**family.defaults, **params}


def build(
    name: str,
    *,
    n_features: int,
    lookback: int,
    horizon: int,
    params: Mapping[str, Any] | None = None,
    outputs_per_step: int = 1,
) -> Any:
    """Build model family ``name`` for the given shapes with ``params`` over its defaults. `outputs_per_step`: a loss's
    outputs per forecast step (engine/losses.outputs_per_target: `quantile`'s 5), so the model gives horizon x that many;
    refused for a model whose forecast is a basis over the horizon's steps (`horizon_basis`: N-BEATS' interpretable
    stacks), which would stretch it over that many more steps."""
    merged = check_params(name, {} if params is None else params)
    family = _import_family(name) if name in _REMEMBERED else resolve(name)  # building runs the user's code: here, never a stand-in
    model = family.factory(n_features=n_features, lookback=lookback, horizon=horizon * outputs_per_step, **merged)
    _check_fresh(name, model)
    if outputs_per_step > 1 and getattr(model, "horizon_basis", False):
        raise InputError(f"{name}'s forecast is a basis over the horizon's steps, which a loss of {outputs_per_step} outputs per step would "
                         f"stretch over {horizon * outputs_per_step} steps", field="loss",
                         fix=f"use a loss of one output per step (mae, mse, ...) for {name} with these settings, or other model settings "
                             "(N-BEATS: stacks: generic)")
    return model


_HANDED_OUT: dict[int, weakref.ref[Any]] = {}
"""id -> the parameter itself (weakly), for every parameter of a model build() returned in this process."""


def _check_fresh(name: str, model: Any) -> None:
    """Refuse a model that holds a parameter an earlier build() returned: a factory that caches its modules would start
    each later trial from the weights an earlier one trained, and a trial's metrics would depend on what its worker
    ran before. By identity, not by value (a tensor's == compares elements)."""
    parameters = getattr(model, "parameters", None)
    if not callable(parameters):
        return  # a classical family's estimator: fitted from scratch by its fit()
    tensors = [t for t in parameters() if t.requires_grad]  # a frozen part shared on purpose (a pretrained encoder) never trains
    if any((held := _HANDED_OUT.get(id(t))) is not None and held() is t for t in tensors):
        raise InputError("the factory returned a module (or a part of one) it had returned before, so this trial would start "
                         "from the weights an earlier trial trained", field=name,
                         fix="build a new module inside the factory on every call (cache data or settings, never modules)")
    for t in tensors:
        _HANDED_OUT[id(t)] = weakref.ref(t, lambda _, key=id(t): _HANDED_OUT.pop(key, None))


_REMEMBERED: dict[str, Family] = {}
"""`module:factory` families described by a child process (campaign/spec/user_models.py): resolved without importing them here."""


def remember(family: Family) -> None:
    """Answer `resolve(family.name)` with this description from now on (its module is not imported here)."""
    _REMEMBERED[family.name] = family


def is_remembered(name: str) -> bool:
    return name in _REMEMBERED


# --- internals -------------------------------------------------------------------------------


class _Deferred:
    """A built-in family's factory before its module is imported: the first call imports every built-in family
    (`load_built_in`) and builds with this one's factory."""

    def __init__(self, name: str):
        self.name = name

    def __call__(self, **kwargs: Any) -> Any:
        return load_built_in()[self.name].factory(**kwargs)


def _built_in(name: str) -> Family:
    """A built-in family: read from its factory once its module is imported (by a build, or by whoever imported a
    class of it), from its description before, so that resolving never imports torch."""
    if _LOADED or _BUILT_IN_MODULE in sys.modules:
        return load_built_in()[name]
    return _described(name)


def _described(name: str) -> Family:
    """A built-in family from its catalogue entry, its module not imported."""
    entry = BUILT_IN[name]
    return Family(name, entry["kind"], _Deferred(name), MappingProxyType(dict(entry["defaults"])), entry["accepts_any"],
                  entry["fits_series"], entry["deterministic"])


def _known() -> set[str]:
    return {*_FAMILIES, *BUILT_IN}


def _variant(name: str) -> Family:
    """The built-in family of `family@tag`, or one line naming what is wrong with the name."""
    base, _, tag = name.rpartition(VARIANT)
    if base not in _known():
        raise InputError(f"unknown model family {base!r} in {name!r}{_suggestion(base)}; known: {', '.join(families())}",
                         fix=f"a variant is a built-in family, an '{VARIANT}' and a tag, e.g. nbeats{VARIANT}mean", field="model")
    if not valid_tag(tag):
        raise InputError(f"variant tag {tag!r} in {name!r} may hold only letters, digits, '_', '.' and '-'",
                         fix=f"name the variant e.g. {base}{VARIANT}mean", field="model")
    return resolve(base)


def _check_kind(kind: object) -> None:
    if kind not in _KINDS:
        raise InputError(f"model kind must be one of {', '.join(_KINDS)}, got {kind!r}",
                         fix="use kind='neural' (GPU lane) or kind='classical' (CPU lane)", field="kind")


def _family(name: str, kind: ModelKind, factory: Any) -> Family:
    """Read a factory's parameters from its signature into a Family."""
    if not callable(factory):
        raise InputError(f"model factory {name!r} is a {type(factory).__name__}, not callable",
                         fix="point to a class or function that builds the model", field="model")
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError) as exc:
        raise InputError(f"cannot read the signature of model factory {name!r}: {exc}",
                         fix="wrap it in a plain Python function (n_features, lookback, horizon, *, params...)", field="model") from exc
    parameters = signature.parameters
    accepts_any = any(p.kind is p.VAR_KEYWORD for p in parameters.values())
    missing = [arg for arg in _SHAPE_ARGS if arg not in parameters]
    if missing and not accepts_any:
        raise InputError(f"model factory {name!r} does not take {', '.join(missing)}",
                         fix="give the factory the signature (n_features, lookback, horizon, *, params with defaults)", field="model")
    defaults: dict[str, Any] = {}
    for param in parameters.values():
        if param.name in _SHAPE_ARGS or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if param.kind is param.POSITIONAL_ONLY or param.default is param.empty:
            raise InputError(f"model factory {name!r} parameter {param.name!r} needs a default and a keyword",
                             fix="give every parameter besides n_features, lookback, horizon a default value", field="model")
        defaults[param.name] = param.default
    return Family(name, kind, factory, MappingProxyType(defaults), accepts_any, fits_series=callable(getattr(factory, "fit_series", None)),
                  deterministic=getattr(factory, "deterministic", False) is True)


def _import_family(path: str) -> Family:
    """Import ``package.module:factory`` (the factory may be dotted: ``module:Class.build``)."""
    module_name, _, attr_path = path.partition(":")
    if not module_name or not attr_path or ":" in attr_path:
        raise InputError(f"model path {path!r} is not of the form {_PATH_FORM}",
                         fix="write it as e.g. 'mypkg.models:make_model'", field="model")
    try:
        module = user_code.import_module(module_name)
    except Exception as exc:  # any import-time failure of user code is bad input, reported in one line
        raise InputError(f"cannot import module {module_name!r} for model {path!r}: {type(exc).__name__}: {exc}",
                         fix="check the module path and that its package is installed or on PYTHONPATH", field="model") from exc
    factory: Any = module
    for part in attr_path.split("."):
        if not hasattr(factory, part):
            raise InputError(f"module {module_name!r} has no attribute {attr_path!r} (model {path!r})",
                             fix=f"check the factory name after ':'; the module defines {_public_names(module)}", field="model")
        factory = getattr(factory, part)
    kind = getattr(factory, "gpufill_kind", "neural")
    if kind not in _KINDS:
        raise InputError(f"model factory {path!r} has gpufill_kind={kind!r}",
                         fix="set gpufill_kind to 'neural' or 'classical' (or leave it out for neural)", field="model")
    return _family(path, kind, factory)


def _suggestion(name: str) -> str:
    lowered = {known.lower(): known for known in _known()}
    close = difflib.get_close_matches(name.lower(), list(lowered), n=1)
    return f" (did you mean {lowered[close[0]]!r}?)" if close else ""


def _public_names(module: Any, limit: int = 8) -> str:
    names = sorted(n for n in vars(module) if not n.startswith("_") and callable(getattr(module, n)))
    shown = ", ".join(names[:limit]) + (", ..." if len(names) > limit else "")
    return shown or "no public callables"
