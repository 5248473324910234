"""Which GPUs a plan may use, and whether a device_map the user gave names devices that exist.

Pure: every fact comes from the Machine. A GPU that NVML sees but this torch cannot drive (a
CPU-only torch build, or a CUDA build newer than the driver supports: `Machine.gpus_unusable`,
found by capability/usable_gpus.py) is planned around, loudly.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import PlacementError
from ..facts.machine import Machine

__all__ = ["check_device_map", "check_max_memory", "cuda_index", "gpu_indices", "usable_machine"]

INSTALL_CUDA_TORCH = (
    "install a CUDA build of torch that this driver supports (https://pytorch.org/get-started/locally/, e.g. "
    "pip install torch --index-url https://download.pytorch.org/whl/cu128)"
)


def usable_machine(machine: Machine) -> tuple[Machine, tuple[str, ...]]:
    """`machine` as the plan may use it: without GPUs torch cannot drive (plus the warning why). Which ones
    torch can drive is a fact `detect()` found once (`Machine.gpus_unusable`, capability/usable_gpus.py)."""
    why = machine.gpus_unusable if machine.gpus else None
    if why is None:
        return machine, ()
    warning = f"{why}: planned for the CPU. To use the GPU, {INSTALL_CUDA_TORCH}."
    return machine.usable(), (warning,)


GPU_DEVICE_TYPES = ("cuda", "xpu", "mps")
"""torch's device types for GPUs (facts/platform.py `Platform.device_type`): "cuda" on NVIDIA and on ROCm."""


def device_type_of(value: Any) -> str | None:
    """The GPU device type a device_map value names ("cuda" for an int), None for "cpu", "disk", "meta"."""
    if isinstance(value, int) and not isinstance(value, bool):
        return "cuda"
    kind = str(value).partition(":")[0]
    return kind if kind in GPU_DEVICE_TYPES else None


def cuda_index(value: Any, where: str) -> int | None:
    """The GPU ordinal a device_map value names ("cuda:1", "xpu:1", 1; "mps" is 0); None for a non-GPU place
    ("cpu", "disk").
    `where` names the value in an error (e.g. "device_map", "device_map['lm_head']")."""
    if isinstance(value, bool):
        raise PlacementError(f"{where}={value!r}: a device is 'cpu', 'disk', 'cuda:N' or an int N.")
    if isinstance(value, int):
        if value < 0:
            raise PlacementError(f"{where}={value}: a GPU index is 0 or more.")
        return value
    text = str(value)  # also a torch.device
    if text in ("cpu", "disk", "meta"):
        return None
    kind, _, number = text.partition(":")
    if kind in GPU_DEVICE_TYPES and (number.isdigit() or (not number and ":" not in text)):
        return int(number) if number else 0
    hint = " (torch has no 'gpu' device: the first GPU is 'cuda:0', or 0)" if text.lower().startswith("gpu") else ""
    raise PlacementError(
        f"{where}={value!r} is not a device{hint}: use 'cpu', 'disk', 'cuda:N' or an int N "
        "(or 'auto' / 'balanced' / 'sequential' for the whole map)."
    )


STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")


def check_device_map(machine: Machine, device_map: Any) -> None:
    """Refuse a device_map that names a GPU this process does not see, or is not a device map."""
    if isinstance(device_map, str) and device_map in STRATEGIES:
        return
    if isinstance(device_map, dict):
        if not device_map:
            raise PlacementError("device_map={} places nothing: leave it unset, or map modules to devices.")
    elif not (isinstance(device_map, (str, int)) or type(device_map).__name__ == "device"):
        raise PlacementError(
            f"device_map={device_map!r} ({type(device_map).__name__}) is not a device map: pass 'auto', a device "
            "('cpu', 'cuda:0', 0) or a dict of module name -> device."
        )
    places = _devices(device_map)
    for where, value in places:
        _cuda_index_checked(machine, value, where)
        if str(value) == "meta":
            raise PlacementError(
                f"{where}='meta' loads no weights: the model is built empty on the meta device and its first "
                "forward fails. To see the settings without loading, use cudaload.plan(); for an empty model, "
                "build it under accelerate's init_empty_weights(). To load, pass 'auto', 'cpu' or 'cuda:N'."
            )
    if all(str(value) == "disk" for _, value in places):
        raise PlacementError(
            f"device_map={device_map!r} puts every weight on disk and leaves nothing to compute on: "
            "transformers needs the GPU or the CPU for each forward. Pass device_map='auto' (with max_memory "
            "and offload_folder= to spill what does not fit to disk), or 'cpu'."
        )


def gpu_indices(device_map: Any) -> set[int]:
    """The CUDA indices a device_map puts weights on: {1} for "cuda:1", 1 or {"": 1}; {0, 1} for
    {"model": 0, "lm_head": "cuda:1"}; {0} for "cuda"; the CPU, disk and meta add none.

    Empty for None or a strategy ("auto", "balanced", ...): which GPUs those use is known only after
    loading. A value that is not a device raises `PlacementError`, as `check_device_map` would; this
    does not check that the GPUs exist.

    Examples:
        >>> sorted(gpu_indices({"model": 0, "lm_head": "cuda:1", "rest": "cpu"})), gpu_indices("auto")
        ([0, 1], set())
    """
    if device_map is None or (isinstance(device_map, str) and device_map in STRATEGIES):
        return set()
    return {index for where, value in _devices(device_map) if (index := cuda_index(value, where)) is not None}


def _devices(device_map: Any) -> list[tuple[str, Any]]:
    """(where, device) for each device a map names, `where` as an error quotes it ("device_map['lm_head']")."""
    if isinstance(device_map, Mapping):
        return [(f"device_map[{key!r}]", value) for key, value in device_map.items()]
    return [("device_map", device_map)]


_SIZE = r"^\s*\d+(\.\d+)?\s*(B|KB|MB|GB|TB|KIB|MIB|GIB|TIB)\s*$"


def check_max_memory(machine: Machine, max_memory: Any) -> dict[int | str, Any]:
    """Refuse a max_memory that is not {device: bytes or "<n>GiB"} over devices this process sees;
    return it keyed as accelerate takes it: a GPU as its int index (given as 0, "0" as JSON writes
    it, or "cuda:0"), else "cpu" / "disk"."""
    import re

    if not isinstance(max_memory, Mapping) or not max_memory:
        raise PlacementError(
            f"max_memory={max_memory!r}: pass a dict of device -> size, e.g. {{0: '20GiB', 'cpu': '64GiB'}}."
        )
    normalized: dict[int | str, Any] = {}
    for device, size in max_memory.items():
        key = int(device) if isinstance(device, str) and device.isascii() and device.isdigit() else device
        index = _cuda_index_checked(machine, key, "max_memory key")
        key = str(key) if index is None else index
        if key in normalized:
            raise PlacementError(f"max_memory names {key!r} twice (once as {device!r}): give each device once.")
        normalized[key] = size
        ok = (isinstance(size, int) and not isinstance(size, bool) and size >= 0) or (
            isinstance(size, str) and re.match(_SIZE, size.upper()) is not None
        )
        if not ok:
            raise PlacementError(
                f"max_memory[{device!r}]={size!r}: a size is a number of bytes or a string like '20GiB' or '500MB'."
            )
    return normalized


def _cuda_index_checked(machine: Machine, value: Any, where: str) -> int | None:
    """`cuda_index`, refusing a GPU this process does not see."""
    index = cuda_index(value, where)
    seen = len(machine.gpus)
    kind, has = device_type_of(value), machine.gpus[0].platform.device_type if machine.gpus else "cuda"
    if index is not None and not isinstance(value, int) and kind != has:
        raise PlacementError(
            f"{where}={value!r} is a {kind!r} device, but this machine's GPUs are {has!r} devices"
            f"{f' ({machine.gpus[0].device}, ...)' if machine.gpus else ''}. Name them as torch does "
            f"('{has}:N', or an int N), 'cpu', or leave device_map unset."
        )
    if index is not None and index >= seen:
        found = f"{seen} GPU(s) (cuda:0..cuda:{seen - 1})" if seen else "no CUDA GPU"
        raise PlacementError(
            f"{where}={value!r} names cuda:{index}, but this process sees {found}. Use a visible device, 'cpu', "
            "or leave "
            "it unset (check CUDA_VISIBLE_DEVICES)."
        )
    return index
