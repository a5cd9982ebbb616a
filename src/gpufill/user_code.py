"""Loading the user's own objects by name: `package.module:name` or `path/to/file.py:name`.

Command-line options (`--model`, `--loss`, `--data`) and campaign files name factories this
way. The name may be dotted (`module:Class.build`). Anything that goes wrong while importing
user code is bad input, reported in one line that names the option.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

from gpufill.errors import InputError

FORMS = "'package.module:name' or 'path/to/file.py:name'"


def is_reference(text: str) -> bool:
    """True for `something:name` (a registered name such as "lstm" or "mse" is not one)."""
    return isinstance(text, str) and ":" in text and not text.startswith(":")


def load_object(reference: str, *, field: str, where: str | None = None) -> Any:
    """The object `reference` names; a bad path, a failing import or a missing name is one InputError."""
    module_part, _, attr_path = reference.rpartition(":")
    if not module_part or not attr_path:
        raise InputError(f"{reference!r} is not of the form {FORMS}", where=where, field=field, fix="write it as e.g. mypkg.models:make_model")
    module = _import(module_part, reference, field=field, where=where)
    target: Any = module
    for part in attr_path.split("."):
        if not hasattr(target, part):
            raise InputError(f"{module_part!r} has no {attr_path!r}", where=where, field=field,
                             fix=f"check the name after ':' (defined there: {', '.join(sorted(n for n in dir(module) if not n.startswith('_'))[:12])})")
        target = getattr(target, part)
    return target


def _import(module_part: str, reference: str, *, field: str, where: str | None) -> Any:
    try:
        return import_module(module_part)
    except FileNotFoundError:
        raise InputError(f"no file {module_part!r} (from {reference!r})", where=where, field=field, fix="check the path to the .py file") from None
    except Exception as error:  # any import-time failure of user code is bad input, reported in one line
        text = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise InputError(f"cannot import {module_part!r} for {reference!r}: {type(error).__name__}: {text}"[:300], where=where, field=field,
                         fix="check the module path and that its package is installed or on PYTHONPATH") from None


def import_module(module_part: str) -> Any:
    """`package.module` (the working directory importable, as under `python -m`) or `path/to/file.py`;
    raises whatever the import raises (FileNotFoundError for a missing file)."""
    if module_part.endswith(".py") or "/" in module_part:
        path = Path(module_part)
        if not path.is_file():
            raise FileNotFoundError(module_part)
        name = f"_gpufill_user_{abs(hash(str(path.resolve())))}"
        if name in sys.modules:
            return sys.modules[name]
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
        return module
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.append(str(Path.cwd()))
    return importlib.import_module(module_part)
