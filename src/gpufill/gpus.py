"""The GPUs this process's workers may use and each one's memory, read without importing torch.

A campaign's scheduler plans its lanes from these facts and never imports torch (its workers do): NVML
(nvidia-ml-py) gives each device's memory, `CUDA_VISIBLE_DEVICES` which of them CUDA shows and in what order, and the
installed torch's `version.py` whether it was built with CUDA at all (a CPU build sees no GPU, NVML or not).
Where NVML cannot answer exactly as CUDA would (no NVML, MIG instances, devices of different sizes in CUDA's own
order), the answer is None and the caller asks torch.
"""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["torch_has_cuda", "visible_gpu_memory"]

_CUDA_LINE = re.compile(r"^cuda(?:\s*:\s*[^=]+)?\s*=\s*(?P<value>.+)$", re.MULTILINE)


def torch_has_cuda() -> bool | None:
    """Whether the installed torch was built with CUDA (its `version.py` says `cuda = '12.4'`, not None); None when
    that cannot be read (no torch, a layout not recognised)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    try:
        text = (Path(next(iter(spec.submodule_search_locations))) / "version.py").read_text()
    except OSError:
        return None
    found = _CUDA_LINE.search(text)
    return None if found is None else found["value"].strip() != "None"


def visible_gpu_memory(environ: Mapping[str, str] = os.environ, nvml: Any = None) -> list[int] | None:
    """Total memory of each GPU CUDA would show this process, in CUDA's order ([] for none); None when only torch
    can say. `nvml`: the pynvml module (a fake in tests)."""
    cuda = torch_has_cuda()
    if cuda is False:
        return []
    if cuda is None:
        return None
    try:
        if nvml is None:
            import pynvml as nvml  # noqa: PLC0415 - nvidia-ml-py: a dependency, loaded only here
        nvml.nvmlInit()
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(int(nvml.nvmlDeviceGetCount()))]
        memories = [int(nvml.nvmlDeviceGetMemoryInfo(h).total) for h in handles]
        uuids = [_text(nvml.nvmlDeviceGetUUID(h)) for h in handles]
    except Exception:  # noqa: BLE001 - no driver, no NVML library, a restricted container: torch answers instead
        return None
    visible = _visible(environ.get("CUDA_VISIBLE_DEVICES"), uuids)
    if visible is None:
        return None
    chosen = [memories[i] for i in visible]
    # NVML counts in PCI bus order, CUDA (by default) fastest first: the same only where every device is alike.
    if len(set(chosen)) > 1 and environ.get("CUDA_DEVICE_ORDER") != "PCI_BUS_ID":
        return None
    return chosen


def _visible(setting: str | None, uuids: list[str]) -> list[int] | None:
    """NVML indices of the devices `CUDA_VISIBLE_DEVICES` shows, in its order (CUDA stops at the first entry it cannot
    use); None for a form only CUDA itself resolves (MIG instances)."""
    if setting is None:
        return list(range(len(uuids)))
    chosen: list[int] = []
    for entry in (part.strip() for part in setting.split(",")):
        if entry.startswith("MIG-"):
            return None
        if entry.isdigit() and int(entry) < len(uuids):
            index = int(entry)
        else:
            matches = [i for i, uuid in enumerate(uuids) if entry.startswith("GPU-") and uuid.startswith(entry)]
            if len(matches) != 1:
                break  # "-1", "", an unknown index or an ambiguous prefix: CUDA shows nothing from here on
            index = matches[0]
        if index in chosen:
            break
        chosen.append(index)
    return chosen


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
