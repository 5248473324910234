"""Which physical GPUs a process sees, and in what order: CUDA_VISIBLE_DEVICES semantics (which ROCm's
ROCR_VISIBLE_DEVICES and HIP_VISIBLE_DEVICES share: rocm.py applies them in turn with `select_visible`).

Pure functions over raw device records, so tests can pass any machine in. The parsing
follows CUDA (and torch.cuda._parse_visible_devices, which mirrors it):

* unset: every device; empty string: none;
* a comma list of ordinals (parsed like strtoul: "1gpu" is 1), of `GPU-` UUID prefixes
  or of `MIG-` UUID prefixes; the first invalid or unmatched entry ends the list;
  a repeated device makes the whole list empty;
* ordinals index the order given by CUDA_DEVICE_ORDER: PCI_BUS_ID (what nvidia-smi and
  NVML show) or FASTEST_FIRST (CUDA's default, which may differ from nvidia-smi).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..facts.machine import Gpu
from ..frozen import frozen

__all__ = ["RawDevice", "RawMigSlice", "as_visible_gpus", "parse_visible_devices", "select_visible", "visible_gpus"]


@frozen
class RawMigSlice:
    """One MIG slice of a physical GPU, as NVML enumerates it."""

    uuid: str
    name: str
    total_memory: int
    free_memory: int | None
    multiprocessors: int | None


@frozen
class RawDevice:
    """One physical GPU as its vendor's probe enumerates it (NVML, amdsmi: PCI bus order)."""

    nvml_index: int
    name: str
    uuid: str
    capability: tuple[int, int]
    total_memory: int
    free_memory: int | None = None
    multiprocessors: int | None = None
    pci_bus_id: str | None = None
    mig_slices: tuple[RawMigSlice, ...] = ()
    """Non-empty when MIG mode is enabled on this GPU."""
    vendor: str = "nvidia"
    """Whose record (facts/platforms.py) holds its rules."""
    arch: str | None = None
    """The architecture when not a compute capability (AMD's gfx target, "gfx942")."""


def _strtoul(entry: str) -> int:
    """The leading integer of `entry`, or -1 (as CUDA's strtoul-like parse)."""
    digits = ""
    for i, ch in enumerate(entry):
        if ch in "0123456789" or (i == 0 and ch in "+-"):  # C's strtoul: ASCII digits only ("٢" is not 2)
            digits += ch
        else:
            break
    try:
        return int(digits)
    except ValueError:
        return -1


def parse_visible_devices(value: str | None) -> list[int] | list[str] | None:
    """Parse CUDA_VISIBLE_DEVICES: None when unset (all devices), else ordinals or UUID prefixes."""
    if value is None:
        return None
    if not value.strip():
        return []
    if value.startswith(("GPU-", "MIG-")):
        prefix = value[:4]
        ids: list[str] = []
        for entry in value.split(","):
            if entry in ids:
                return []
            if not entry.startswith(prefix):
                break
            ids.append(entry)
        return ids
    ordinals: list[int] = []
    for entry in value.split(","):
        ordinal = _strtoul(entry.strip())
        if ordinal in ordinals:
            return []
        if ordinal < 0:
            break
        ordinals.append(ordinal)
    return ordinals


def _repeated_entry(value: str) -> str | None:
    """The first device CUDA_VISIBLE_DEVICES names twice, as written (None when none is): CUDA then
    sees no GPU at all, so it must be said."""
    seen: set[object] = set()
    uuids = value.startswith(("GPU-", "MIG-"))
    for entry in value.split(","):
        key: object = entry if uuids else _strtoul(entry.strip())
        if not uuids and isinstance(key, int) and key < 0:
            return None  # the list ends at the first invalid entry: nothing after it counts
        if key in seen:
            return entry.strip()
        seen.add(key)
    return None


def _cuda_order(raw: Sequence[RawDevice], order: str | None) -> list[RawDevice]:
    by_pci = sorted(raw, key=lambda d: (d.pci_bus_id or "", d.nvml_index))
    if (order or "FASTEST_FIRST").upper() == "PCI_BUS_ID":
        return by_pci
    # FASTEST_FIRST: CUDA ranks by an undocumented speed heuristic; newer architecture
    # and more SMs first, ties in PCI order, is the best public approximation.
    return sorted(by_pci, key=lambda d: (-d.capability[0], -d.capability[1], -(d.multiprocessors or 0)))


def _as_gpu(index: int, device: RawDevice, mig: RawMigSlice | None = None) -> Gpu:
    if mig is None:
        return Gpu(
            index=index,
            name=device.name,
            capability=device.capability,
            total_memory=device.total_memory,
            free_memory=device.free_memory,
            physical_index=device.nvml_index,
            multiprocessors=device.multiprocessors,
            uuid=device.uuid,
            pci_bus_id=device.pci_bus_id,
            vendor=device.vendor,
            arch_name=device.arch,
        )
    return Gpu(
        index=index,
        name=mig.name,
        capability=device.capability,
        total_memory=mig.total_memory,
        free_memory=mig.free_memory,
        physical_index=device.nvml_index,
        multiprocessors=mig.multiprocessors,
        uuid=mig.uuid,
        pci_bus_id=device.pci_bus_id,
        mig=True,
    )


def _match_uuid(prefix: str, candidates: Sequence[str]) -> int:
    """Index of the single candidate starting with `prefix`; -1 if none or ambiguous."""
    matches = [i for i, uuid in enumerate(candidates) if uuid.startswith(prefix)]
    return matches[0] if len(matches) == 1 else -1


Chosen = tuple[RawDevice, "RawMigSlice | None"]


def select_visible(
    ordered: Sequence[RawDevice], visible: str | None, variable: str = "CUDA_VISIBLE_DEVICES", runtime: str = "CUDA"
) -> tuple[list[Chosen], list[str]]:
    """The devices of `ordered` that `visible` (the value of `variable`) selects, in its order, and the
    warnings about the value, each naming `variable` and `runtime` ("CUDA" or "ROCm"). A vendor's runtime may
    apply several variables in turn (ROCm: ROCR_VISIBLE_DEVICES, then HIP_VISIBLE_DEVICES among what it left):
    call this once per step."""
    parsed = parse_visible_devices(visible)
    warnings: list[str] = []
    chosen: list[Chosen] = []
    if parsed is None:
        chosen = [(d, None) for d in ordered]
    elif parsed and isinstance(parsed[0], str) and parsed[0].startswith("MIG-"):
        slices = [(d, s) for d in ordered for s in d.mig_slices]
        for prefix in parsed:
            hit = _match_uuid(str(prefix), [s.uuid for _, s in slices])
            if hit < 0:
                break
            chosen.append(slices[hit])
    elif parsed and isinstance(parsed[0], str):
        for prefix in parsed:
            hit = _match_uuid(str(prefix), [d.uuid for d in ordered])
            if hit < 0:
                break
            chosen.append((ordered[hit], None))
    else:
        for ordinal in parsed:
            if not isinstance(ordinal, int) or ordinal >= len(ordered):
                break
            chosen.append((ordered[ordinal], None))

    nvidia = runtime == "CUDA"
    repeated = _repeated_entry(visible) if visible is not None and not parsed and visible.strip() else None
    if repeated is not None:
        warnings.append(
            f"{variable}={visible!r} names device {repeated} twice: {runtime} refuses a list with a repeated "
            f"device and then shows this process no GPU at all. List each GPU once (e.g. {variable}={repeated})."
        )
    if visible is not None and visible.strip() and not parsed and repeated is None:
        first = visible.split(",")[0].strip()
        tool = "nvidia-smi" if nvidia else "amd-smi"
        warnings.append(
            f"{variable}={visible!r}: its first entry {first!r} is neither a GPU number nor a GPU-"
            f"{'/MIG-' if nvidia else ''} UUID ({runtime} reads those prefixes in upper case only), so {runtime} "
            f"shows this process no GPU. Write the numbers {tool} shows, or the UUIDs as "
            f"{'`nvidia-smi -L`' if nvidia else '`amd-smi list`'} prints them (GPU-...)."
        )
    if visible is not None and parsed and len(chosen) < len(parsed):
        warnings.append(
            f"{variable}={visible!r}: entry {len(chosen) + 1} matches no GPU, so {runtime} ignores it and "
            f"everything after it; {len(chosen)} GPU(s) visible."
        )
    return chosen, warnings


def as_visible_gpus(chosen: Sequence[Chosen]) -> tuple[tuple[Gpu, ...], tuple[str, ...]]:
    """The chosen devices as the GPUs torch numbers 0, 1, ..., and a warning for each MIG GPU (one slice)."""
    gpus: list[Gpu] = []
    warnings: list[str] = []
    for device, mig in chosen:
        if mig is None and device.mig_slices:
            # CUDA enumerates one MIG instance per process for a MIG-enabled GPU.
            mig = device.mig_slices[0]
            warnings.append(
                f"GPU {device.nvml_index} ({device.name}) is in MIG mode: this process sees one slice, "
                f"{mig.name} with {mig.total_memory / 1024**3:.1f} GiB."
            )
        gpus.append(_as_gpu(len(gpus), device, mig))
    return tuple(gpus), tuple(warnings)


def visible_gpus(
    raw: Sequence[RawDevice], visible: str | None, order: str | None
) -> tuple[tuple[Gpu, ...], tuple[str, ...]]:
    """The GPUs this process sees under CUDA_VISIBLE_DEVICES, indexed as torch will index them, plus warnings."""
    chosen, selection_warnings = select_visible(_cuda_order(raw, order), visible)
    gpus, mig_warnings = as_visible_gpus(chosen)
    warnings = list(mig_warnings)
    if len({g.name for g in gpus}) > 1 and (order or "").upper() != "PCI_BUS_ID":
        warnings.append(
            "Visible GPUs differ in model and CUDA_DEVICE_ORDER is not PCI_BUS_ID: CUDA numbers them "
            "fastest first, so cuda:N may not be nvidia-smi's GPU N. Set CUDA_DEVICE_ORDER=PCI_BUS_ID "
            "before CUDA starts to make the two agree."
        )
    return gpus, (*warnings, *selection_warnings)
