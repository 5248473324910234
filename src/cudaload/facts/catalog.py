"""Known GPUs, for planning on a machine you don't have (`cudaload plan --gpu T4`).

Values are the vendor's: compute capability from NVIDIA's CUDA GPUs list, memory as NVML (and so
`nvidia-smi`) reports it rounded to GiB, SM count from the datasheet or architecture whitepaper; for AMD
Instinct GPUs the gfx target, memory and compute units from AMD's datasheets; each
entry cites where its values come from. Lookup is by the name `nvidia-smi` prints (with or without
"NVIDIA "/"Tesla "), or an alias, case and punctuation ignored; a near miss gets a "did you mean".
A GPU not listed is described by its facts instead: "custom:sm90:80GiB", or an AMD GPU by its gfx target,
"custom:gfx942:192GiB" (see `parse_custom_gpu`).
A plan never decides by name, only by the facts here. Plain data: `Machine.simulated()` turns an
entry into a `Gpu`.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import replace

from ..errors import UnknownGpuError
from ..frozen import frozen
from .hardware import gfx_capability

__all__ = [
    "AMD_GPUS",
    "APPLE_GPUS",
    "CATALOGS",
    "CUSTOM_PREFIX",
    "INTEL_GPUS",
    "KNOWN_GPUS",
    "CatalogGpu",
    "all_gpus",
    "gfx_capability",
    "lookup_gpu",
    "parse_custom_gpu",
]

CUDA_GPUS = "https://developer.nvidia.com/cuda-gpus"
"""NVIDIA's list of compute capabilities, the source of every entry's `capability`."""


@frozen
class CatalogGpu:
    """A GPU a simulated machine can have: its name as NVML reports it and its facts.

    Attributes:
        name: The name `nvidia-smi` prints (e.g. "NVIDIA H100 PCIe").
        capability: CUDA compute capability (major, minor).
        memory_gib: Total memory in GiB, as NVML reports it (a little under the marketed GB).
        multiprocessors: Streaming multiprocessor count; None for a custom GPU.
        aliases: Other names people type ("h100-sxm", "a6000").
        source: Where capability and memory come from (URLs).
        vendor: Whose record (facts/platforms.py) holds its rules: "nvidia" (default) or "amd".
        arch: The architecture when it is not a compute capability (AMD's gfx target); None for NVIDIA.
        devices: How many GPUs torch sees per board (an MI250X is two GCDs, each its own `cuda:N`).
    """

    name: str
    capability: tuple[int, int]
    memory_gib: float
    multiprocessors: int | None
    aliases: tuple[str, ...] = ()
    source: str = ""
    vendor: str = "nvidia"
    arch: str | None = None
    devices: int = 1


def _entry(
    name: str, capability: tuple[int, int], memory_gib: int, sms: int, aliases: tuple[str, ...], memory_source: str
) -> CatalogGpu:
    return CatalogGpu(name, capability, memory_gib, sms, aliases, f"capability: {CUDA_GPUS}; memory: {memory_source}")


_V100 = "https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf"
_T4 = "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/tesla-t4/t4-tensor-core-datasheet-951643.pdf"
_A100 = "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"
_A10 = "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a10/pdf/datasheet-new/nvidia-a10-datasheet.pdf"
_A10G = "https://aws.amazon.com/ec2/instance-types/g5/ (NVIDIA A10G, 24 GB)"
_A40 = "https://images.nvidia.com/content/Solutions/data-center/a40/nvidia-a40-datasheet.pdf"
_A6000 = "https://www.nvidia.com/content/dam/en-zz/Solutions/design-visualization/quadro-product-literature/proviz-print-nvidia-rtx-a6000-datasheet-us-nvidia-1454980-r9-web%20(1).pdf"
_L4 = "https://resources.nvidia.com/en-us-data-center-overview/l4-gpu-datasheet"
_L40 = "https://images.nvidia.com/content/Solutions/data-center/vgpu-L40-datasheet.pdf"
_L40S = "https://resources.nvidia.com/en-us-l40s/l40s-datasheet-28413"
_RTX6000ADA = "https://www.nvidia.com/en-us/design-visualization/rtx-6000/"
_H100 = "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet"
_H800 = "https://www.nvidia.cn/data-center/h800/ (80 GB HBM3 SXM, 80 GB HBM2e PCIe)"
_H20 = "NVIDIA HGX H20 product brief (96 GB HBM3, 78 SMs), as reported by NVML: 97871 MiB"
_GH200 = "https://resources.nvidia.com/en-us-grace-cpu/grace-hopper-superchip (96 GB HBM3 per GPU)"
_H200 = "https://www.nvidia.com/en-us/data-center/h200/"
_B200 = "https://resources.nvidia.com/en-us-blackwell-architecture/datasheet (HGX B200: 180 GB per GPU)"
_RTX = "https://www.nvidia.com/en-us/geforce/graphics-cards/ (board memory)"
_RTXPRO = "https://www.nvidia.com/en-us/products/workstations/professional-desktop-gpus/rtx-pro-6000/"
_ORIN = "https://developer.nvidia.com/embedded/jetson-modules (AGX Orin 64GB, memory shared with the CPU)"
_MI300X = "https://www.amd.com/en/products/accelerators/instinct/mi300/mi300x.html (192 GB HBM3, 304 CUs, gfx942)"
_MI325X = "https://www.amd.com/en/products/accelerators/instinct/mi300/mi325x.html (256 GB HBM3E, 304 CUs, gfx942)"
_MI250X = (
    "https://www.amd.com/en/products/accelerators/instinct/mi200/mi250x.html (128 GB HBM2e and 220 CUs over two "
    "GCDs, each its own device: 64 GB, 110 CUs; gfx90a)"
)
_MI210 = "https://www.amd.com/en/products/accelerators/instinct/mi200/mi210.html (64 GB HBM2e, 104 CUs, gfx90a)"
_MI350X = (
    "https://www.amd.com/en/products/accelerators/instinct/mi350/mi350x.html (288 GB HBM3E, 256 CUs, CDNA4: gfx950)"
)
_MI355X = (
    "https://www.amd.com/en/products/accelerators/instinct/mi350/mi355x.html (288 GB HBM3E, 256 CUs, CDNA4: gfx950)"
)
_MI100 = "https://www.amd.com/en/products/accelerators/instinct/mi100.html (32 GB HBM2, 120 CUs, CDNA1: gfx908)"
_RX7900XTX = (
    "https://www.amd.com/en/products/graphics/desktops/radeon/7000-series/amd-radeon-rx-7900xtx.html (24 GB GDDR6, "
    "96 CUs, RDNA3: gfx1100)"
)
_W7900 = (
    "https://www.amd.com/en/products/graphics/workstations/radeon-pro/w7900.html (48 GB GDDR6, 96 CUs, RDNA3: gfx1100)"
)


def _amd(
    name: str, arch: str, capability: tuple[int, int], memory_gib: int, cus: int, aliases: tuple[str, ...], source: str
) -> CatalogGpu:
    """An AMD entry: its gfx target decides; `capability` is what torch reports for it on ROCm
    (`torch.cuda.get_device_capability()`, from the gfx number: gfx942 -> (9, 4))."""
    return CatalogGpu(name, capability, memory_gib, cus, aliases, f"AMD: {source}", vendor="amd", arch=arch)


KNOWN_GPUS: tuple[CatalogGpu, ...] = (
    _entry("Tesla V100-SXM2-32GB", (7, 0), 32, 80, ("v100", "v100-32gb", "v100-sxm2"), _V100),
    _entry("Tesla V100-SXM2-16GB", (7, 0), 16, 80, ("v100-16gb",), _V100),
    _entry("Tesla T4", (7, 5), 15, 40, ("t4",), _T4),
    _entry("NVIDIA A10G", (8, 6), 22, 80, ("a10g",), _A10G),
    _entry("NVIDIA A10", (8, 6), 22, 72, ("a10",), _A10),
    _entry("NVIDIA A40", (8, 6), 45, 84, ("a40",), _A40),
    _entry("NVIDIA RTX A6000", (8, 6), 48, 84, ("a6000", "rtx-a6000"), _A6000),
    _entry("NVIDIA GeForce RTX 3090", (8, 6), 24, 82, ("rtx3090", "3090"), _RTX),
    _entry("NVIDIA A100-SXM4-40GB", (8, 0), 40, 108, ("a100-40gb", "a100-40", "a100-sxm4-40gb"), _A100),
    _entry("NVIDIA A100-SXM4-80GB", (8, 0), 80, 108, ("a100", "a100-80gb", "a100-80", "a100-sxm", "a100-sxm4"), _A100),
    _entry("NVIDIA A100-PCIE-40GB", (8, 0), 40, 108, ("a100-pcie-40gb",), _A100),
    _entry("NVIDIA A100 80GB PCIe", (8, 0), 80, 108, ("a100-pcie", "a100-pcie-80gb"), _A100),
    _entry("NVIDIA L4", (8, 9), 22, 58, ("l4",), _L4),
    _entry("NVIDIA L40", (8, 9), 45, 142, ("l40",), _L40),
    _entry("NVIDIA L40S", (8, 9), 45, 142, ("l40s",), _L40S),
    _entry("NVIDIA RTX 6000 Ada Generation", (8, 9), 48, 142, ("rtx6000-ada", "6000-ada"), _RTX6000ADA),
    _entry("NVIDIA GeForce RTX 4090", (8, 9), 24, 128, ("rtx4090", "4090"), _RTX),
    _entry("NVIDIA H100 80GB HBM3", (9, 0), 80, 132, ("h100", "h100-80gb", "h100-sxm", "h100-sxm5"), _H100),
    _entry("NVIDIA H100 PCIe", (9, 0), 80, 114, ("h100-pcie",), _H100),
    _entry("NVIDIA H100 NVL", (9, 0), 94, 132, ("h100-nvl",), _H100),
    _entry("NVIDIA H800", (9, 0), 80, 132, ("h800", "h800-sxm"), _H800),
    _entry("NVIDIA H800 PCIe", (9, 0), 80, 114, ("h800-pcie",), _H800),
    _entry("NVIDIA H20", (9, 0), 96, 78, ("h20",), _H20),
    _entry("NVIDIA GH200 480GB", (9, 0), 96, 132, ("gh200",), _GH200),
    _entry("NVIDIA H200", (9, 0), 141, 132, ("h200", "h200-sxm"), _H200),
    _entry("NVIDIA H200 NVL", (9, 0), 141, 132, ("h200-nvl",), _H200),
    _entry("NVIDIA B200", (10, 0), 180, 148, ("b200",), _B200),
    _entry("NVIDIA GeForce RTX 5090", (12, 0), 32, 170, ("rtx5090", "5090"), _RTX),
    _entry(
        "NVIDIA RTX PRO 6000 Blackwell Server Edition",
        (12, 0),
        96,
        188,
        ("rtx-pro-6000", "rtx-pro-6000-blackwell"),
        _RTXPRO,
    ),
    _entry("Orin (nvgpu)", (8, 7), 64, 16, ("jetson-orin", "orin", "agx-orin"), _ORIN),
)
"""NVIDIA's GPUs (capability from NVIDIA's CUDA GPUs list)."""

AMD_GPUS: tuple[CatalogGpu, ...] = (
    _amd("AMD Instinct MI300X", "gfx942", (9, 4), 192, 304, ("mi300x", "mi300"), _MI300X),
    _amd("AMD Instinct MI325X", "gfx942", (9, 4), 256, 304, ("mi325x",), _MI325X),
    # Two GCDs per board, each a GPU to torch (64 GB, 110 CUs): "MI250X" simulates the board, two devices.
    replace(_amd("AMD Instinct MI250X", "gfx90a", (9, 0), 64, 110, ("mi250x", "mi250"), _MI250X), devices=2),
    _amd("AMD Instinct MI210", "gfx90a", (9, 0), 64, 104, ("mi210",), _MI210),
    _amd("AMD Instinct MI350X", "gfx950", (9, 5), 288, 256, ("mi350x", "mi350"), _MI350X),
    _amd("AMD Instinct MI355X", "gfx950", (9, 5), 288, 256, ("mi355x", "mi355"), _MI355X),
    _amd("AMD Instinct MI100", "gfx908", (9, 0), 32, 120, ("mi100",), _MI100),
    _amd("AMD Radeon RX 7900 XTX", "gfx1100", (11, 0), 24, 96, ("rx7900xtx", "7900xtx"), _RX7900XTX),
    _amd("AMD Radeon PRO W7900", "gfx1100", (11, 0), 48, 96, ("w7900", "radeon-pro-w7900"), _W7900),
)
"""AMD Instinct and the Radeon parts people fine-tune on (gfx target, memory and compute units from AMD's product
pages; `capability` is what HIP reports for the gfx target, as vLLM's vllm/platforms/rocm.py:
`_capability_from_gcn_arch` derives it: gfx950 -> (9, 5), gfx1100 -> (11, 0))."""

_ARC_A770 = (
    "https://www.intel.com/content/www/us/en/products/sku/229151/intel-arc-a770-graphics-16gb/specifications.html "
    "(16 GB GDDR6, 32 Xe cores, Xe-HPG with XMX engines)"
)
_MAX_1550 = (
    "https://www.intel.com/content/www/us/en/products/sku/232873/intel-data-center-gpu-max-1550/specifications.html "
    "(128 GB HBM2e, 128 Xe cores over two stacks, Xe-HPC); each stack is its own device in Level Zero's default "
    "FLAT hierarchy (ZE_FLAT_DEVICE_HIERARCHY): two devices of 64 GB"
)
_M3_MAX = (
    "https://www.apple.com/macbook-pro/specs/ (M3 Max: 40-core GPU, up to 128 GB unified memory, shared with the "
    "CPU; Metal lets the GPU hold torch.mps.recommended_max_memory() of it)"
)


def _other(
    vendor: str, name: str, arch: str, memory_gib: int, units: int, aliases: tuple[str, ...], source: str
) -> CatalogGpu:
    """An Intel (XPU) or Apple (MPS) entry: its architecture decides; no compute capability ((0, 0))."""
    return CatalogGpu(name, (0, 0), memory_gib, units, aliases, f"{vendor}: {source}", vendor=vendor, arch=arch)


INTEL_GPUS: tuple[CatalogGpu, ...] = (
    _other("intel", "Intel(R) Arc(TM) A770 Graphics", "xe-hpg", 16, 32, ("arc-a770", "a770"), _ARC_A770),
    replace(
        _other("intel", "Intel(R) Data Center GPU Max 1550", "xe-hpc", 64, 64, ("max-1550", "max1550"), _MAX_1550),
        devices=2,
    ),
)
"""Intel GPUs (architecture, memory and Xe cores from Intel's product pages)."""

APPLE_GPUS: tuple[CatalogGpu, ...] = (_other("apple", "Apple M3 Max", "m3", 128, 40, ("m3-max", "m3max"), _M3_MAX),)
"""Apple M-series GPUs (unified memory and GPU cores from Apple's specifications)."""

CATALOGS: dict[str, tuple[CatalogGpu, ...]] = {
    "nvidia": KNOWN_GPUS,
    "amd": AMD_GPUS,
    "intel": INTEL_GPUS,
    "apple": APPLE_GPUS,
}
"""Every vendor's GPUs, by vendor: a new vendor's entries are one more item here."""


def all_gpus() -> tuple[CatalogGpu, ...]:
    """Every catalog GPU of every vendor, in CATALOGS' order."""
    return tuple(gpu for gpus in CATALOGS.values() for gpu in gpus)


CUSTOM_PREFIX = "custom:"
"""A GPU described by its facts instead of its name: "custom:sm90:80GiB"."""

_VENDOR_WORDS = ("nvidia", "tesla", "geforce", "amd", "instinct", "radeon", "intelr", "intel", "apple")


def _normalise(name: str) -> str:
    """Lowercase letters and digits only, without the vendor words nvidia-smi puts in front."""
    text = "".join(ch for ch in name.lower() if ch.isalnum())
    for word in _VENDOR_WORDS:
        text = text.removeprefix(word)
    return text


def _keys() -> dict[str, CatalogGpu]:
    return {_normalise(spelling): gpu for gpu in all_gpus() for spelling in (gpu.name, *gpu.aliases)}


def lookup_gpu(name: str) -> CatalogGpu:
    """Find a catalog GPU by its nvidia-smi name (with or without "NVIDIA "), an alias, or a custom
    description ("custom:sm90:80GiB"); case, spaces and punctuation are ignored.

    Raises:
        UnknownGpuError: the name is in no entry; the message suggests the nearest names.
    """
    if name.strip().lower().startswith(CUSTOM_PREFIX):
        return parse_custom_gpu(name)
    keys = _keys()
    wanted = _normalise(name)
    if wanted in keys:
        return keys[wanted]
    spelled = {_normalise(a): a for gpu in all_gpus() for a in gpu.aliases}
    near = [spelled[k] for k in difflib.get_close_matches(wanted, spelled, n=3, cutoff=0.6)]
    suggestion = f" Did you mean {' or '.join(repr(n) for n in near)}?" if near else ""
    known = ", ".join(g.aliases[0] for g in all_gpus())
    raise UnknownGpuError(
        f"Unknown GPU {name!r} for a simulated machine.{suggestion} Known GPUs: {known} (or the name nvidia-smi "
        f"prints). For another GPU, describe it: '{CUSTOM_PREFIX}sm90:80GiB' (compute capability, memory), or "
        f"'{CUSTOM_PREFIX}gfx942:192GiB' for an AMD GPU (gfx target, memory)."
    )


_CUSTOM = re.compile(
    r"^custom:(?:sm_?(?P<sm>\d{2,3})|(?P<major>\d{1,2})\.(?P<minor>\d)|(?P<gfx>gfx\d{1,2}[0-9a-f]{2}))"
    r":(?P<memory>\d+(?:\.\d+)?)(?P<unit>GiB|GB)(?::(?P<sms>\d+)(?P<sms_unit>sm|cu))?$",
    re.IGNORECASE,
)


def parse_custom_gpu(spec: str) -> CatalogGpu:
    """A GPU described by its facts: "custom:sm90:80GiB" (or "custom:9.0:80GiB"), optionally with its SM
    count, "custom:sm90:80GiB:132sm"; an AMD GPU by its gfx target, "custom:gfx942:192GiB" (optionally
    ":304cu"), which the AMD record's rules for that target decide (a target it has no rule for gets its
    conservative default, and the plan's reasons say so). Memory in GiB, or in GB (10**9 bytes, as
    datasheets say).

    Raises:
        UnknownGpuError: the description does not parse; the message shows the form.

    Examples:
        >>> gpu = parse_custom_gpu("custom:sm89:48GB")
        >>> gpu.name, gpu.capability, round(gpu.memory_gib, 1)
        ('custom sm_89 48GB', (8, 9), 44.7)
        >>> amd = parse_custom_gpu("custom:gfx950:288GiB")
        >>> amd.name, amd.vendor, amd.arch
        ('custom gfx950 288GiB', 'amd', 'gfx950')
    """
    match = _CUSTOM.match(spec.strip().replace(" ", ""))
    if match is None:
        raise UnknownGpuError(
            f"Cannot read the GPU description {spec!r}: write '{CUSTOM_PREFIX}sm<major><minor>:<memory>GiB' "
            f"(e.g. '{CUSTOM_PREFIX}sm90:80GiB', '{CUSTOM_PREFIX}8.6:24GiB', or '{CUSTOM_PREFIX}sm90:80GB:132sm' "
            f"with the SM count), or for an AMD GPU its gfx target (e.g. '{CUSTOM_PREFIX}gfx942:192GiB', as "
            "rocminfo or amd-smi print it)."
        )
    arch = match["gfx"].lower() if match["gfx"] else None
    units = "CUs" if arch else "SMs"
    if match["sms_unit"] and (match["sms_unit"].lower() == "cu") != bool(arch):
        raise UnknownGpuError(
            f"The GPU description {spec!r} counts {'CUs' if arch is None else 'SMs'}, but an "
            f"{'AMD GPU has compute units (:304cu)' if arch else 'NVIDIA GPU has SMs (:132sm)'}: write {units}."
        )
    if arch:
        capability = gfx_capability(arch)
    elif match["sm"]:
        digits = match["sm"]
        capability = (int(digits[:-1]), int(digits[-1]))
    else:
        capability = (int(match["major"]), int(match["minor"]))
    if arch is None and not 3 <= capability[0] <= 15:  # CUDA's compute capabilities run from 3.0 to 12.x today
        raise UnknownGpuError(
            f"The GPU description {spec!r} gives compute capability {capability[0]}.{capability[1]}, which no CUDA "
            "GPU has: write it as nvidia-smi --query-gpu=compute_cap prints it, e.g. sm90 or 8.6."
        )
    if match["sms"] and int(match["sms"]) < 1:
        raise UnknownGpuError(
            f"The GPU description {spec!r} gives 0 {units}: give its count (e.g. "
            f"{':304cu' if arch else ':132sm'}), or leave it out."
        )
    amount = float(match["memory"])
    unit = "GiB" if match["unit"].lower() == "gib" else "GB"
    memory_gib = amount if unit == "GiB" else amount * 1e9 / 1024**3
    if memory_gib <= 0:
        raise UnknownGpuError(f"The GPU description {spec!r} gives no memory: pass its size, e.g. 80GiB.")
    size = f"{match['memory']}{unit}"
    return CatalogGpu(
        name=f"custom {arch} {size}" if arch else f"custom sm_{capability[0]}{capability[1]} {size}",
        capability=capability,
        memory_gib=memory_gib,
        multiprocessors=int(match["sms"]) if match["sms"] else None,
        source="described by the user",
        vendor="amd" if arch else "nvidia",
        arch=arch,
    )
