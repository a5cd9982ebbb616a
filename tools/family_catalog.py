"""Write src/gpufill/forecasting/models/catalog.py from the built-in families (models/builtin.py's list).

    python tools/family_catalog.py [--check]

The catalogue is what a campaign file needs to know of each built-in family (kind, parameters, defaults) without
importing it: the scheduler, `gpufill check` and `status` read it and never import torch. Run this after adding a
family or changing a factory's parameters; tests/forecasting/test_family_catalog.py fails until it is run.
`--check`: exit 1 when the file differs from what would be written.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

CATALOG = Path(__file__).resolve().parents[1] / "src" / "gpufill" / "forecasting" / "models" / "catalog.py"
HEADER = '''"""The built-in model families as data: what a campaign needs to know of each (its kind, parameters and defaults,
whether it fits the series itself, whether its forecasts draw random numbers) without importing it, so a process
that only reads a campaign file (the scheduler, `gpufill check`, `status`) never imports torch.

Written by `python tools/family_catalog.py` from the built-in families (models/builtin.py); do not edit by hand
(tests/forecasting/test_family_catalog.py holds it equal to them).
"""

from __future__ import annotations

from typing import Any

'''


def described() -> dict[str, dict[str, object]]:
    """name -> the description of every built-in family, read from its factory."""
    from gpufill.forecasting.models import registry

    return registry.describe_built_in()


def literal(value: object) -> str:
    """`value` as Python source, strings in double quotes (as the rest of the tree writes them)."""
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{literal(key)}: {literal(item)}" for key, item in value.items()) + "}"
    if value is None or isinstance(value, bool | int | float):
        return repr(value)
    raise SystemExit(f"a default of {value!r} ({type(value).__name__}) is not a literal the catalogue can hold")


def text() -> str:
    lines = [f"    {literal(name)}: {{\n" + "".join(f"        {literal(key)}: {literal(value)},\n" for key, value in entry.items()) + "    },"
             for name, entry in described().items()]
    return HEADER + "BUILT_IN: dict[str, dict[str, Any]] = {\n" + "\n".join(lines) + "\n}\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the catalogue is out of date")
    args = parser.parse_args()
    wanted = text()
    if args.check:
        same = CATALOG.exists() and CATALOG.read_text() == wanted
        print("catalogue up to date" if same else f"{CATALOG} is out of date: run python tools/family_catalog.py")
        return 0 if same else 1
    CATALOG.write_text(wanted)
    print(f"wrote {CATALOG} ({len(described())} families)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
