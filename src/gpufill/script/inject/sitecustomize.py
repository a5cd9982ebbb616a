"""Loaded at interpreter start by `gpufill doctor|watch|bench -- COMMAND` (this folder is put first
on PYTHONPATH, in the command's environment only): installs gpufill's instrumentation, then runs the environment's own
sitecustomize, if there is one, so nothing of the user's set-up is lost."""

import importlib.util
import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))
try:
    from gpufill.script.instrument import install

    install()
except Exception as error:  # noqa: BLE001 - never stop the user's script
    print(f"gpufill: instrumentation not installed ({type(error).__name__}: {error})", file=sys.stderr)

for entry in sys.path:
    if os.path.abspath(entry or ".") == _here:
        continue
    candidate = os.path.join(entry or ".", "sitecustomize.py")
    if os.path.isfile(candidate):
        spec = importlib.util.spec_from_file_location("_user_sitecustomize", candidate)
        if spec is not None and spec.loader is not None:
            spec.loader.exec_module(importlib.util.module_from_spec(spec))
        break
