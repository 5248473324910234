"""The links between GPUs and between nodes, and what a GPU computes per second: the facts a parallelism
plan's step-time estimate divides by. Plain data, each figure with its source.

Bandwidths are per direction, at line rate. A collective reaches less (NCCL's bus bandwidth is
typically 80-90 % of line rate in nccl-tests), so the estimate multiplies by `LINK_EFFICIENCY`.

A node's NICs work in parallel: NCCL builds its rings and trees per rail (one channel per NIC, GPU n of each node
on NIC n), so what crosses between nodes is carried by all of a node's NICs at once. `--interconnect` names the
link and, after a colon, the NICs a node has: "infiniband-ndr" (one NIC per GPU, as DGX nodes are built),
"infiniband-ndr:4", "ethernet-100g:2".
"""

from __future__ import annotations

from dataclasses import replace

from ..errors import SettingError
from ..frozen import frozen

__all__ = [
    "DEFAULT_INTERCONNECT",
    "INTERCONNECTS",
    "LINK_EFFICIENCY",
    "MAX_NICS",
    "Interconnect",
    "ParallelLayout",
    "gpu_link",
    "gpu_tflops",
    "interconnect",
]

LINK_EFFICIENCY = 0.8
"""Share of line rate a ring collective reaches (nccl-tests bus bandwidth: ~80-90 %)."""

_DGX_H100 = "https://docs.nvidia.com/dgx/dgxh100-user-guide/introduction-to-dgxh100.html (8x ConnectX-7, 400 Gb/s)"
_DGX_A100 = "https://docs.nvidia.com/dgx/dgxa100-user-guide/introduction-to-dgxa100.html (8x ConnectX-6, 200 Gb/s HDR)"
_NVLINK = "https://www.nvidia.com/en-us/data-center/nvlink/ (NVLink 4: 900 GB/s per GPU, both directions)"
_H100 = "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet"
_A100 = "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"
_B200 = "https://resources.nvidia.com/en-us-blackwell-architecture/datasheet"
_H200 = "https://www.nvidia.com/en-us/data-center/h200/ (H200 NVL: 2- or 4-way NVLink bridge, 900 GB/s)"
_GH200 = "https://resources.nvidia.com/en-us-grace-cpu/grace-hopper-superchip (NVLink 4, 900 GB/s; H100 SXM compute)"
_H20 = "NVIDIA HGX H20 product brief (NVLink 900 GB/s; FP16/BF16 tensor 148 TFLOPS dense)"
_H800 = "https://www.nvidia.cn/data-center/h800/ (NVLink 400 GB/s; H100 compute)"
_MI300 = (
    "https://www.amd.com/content/dam/amd/en/documents/instinct-tech-docs/data-sheets/amd-instinct-mi300x-data-sheet.pdf"
    " (7 x16 Infinity Fabric links, 128 GB/s each both directions, 896 GB/s peer-to-peer; 1307.4 dense BF16 TFLOPS;"
    " MI325X: the same links and compute)"
)


@frozen
class Interconnect:
    """The network between nodes (`--interconnect`).

    Attributes:
        name: What you pass (`--interconnect`, `interconnect=`).
        gbit_per_port: Line rate of one port in Gb/s.
        ports_per_node: Ports a node has; None: one per GPU (a rail-optimised fabric, as DGX nodes are built).
        label: How plans and docs name it.
        source: Where the figures come from.
    """

    name: str
    gbit_per_port: float
    ports_per_node: int | None
    label: str
    source: str

    def node_bytes_per_s(self, gpus_per_node: int) -> float:
        """What one node sends per second, per direction, at line rate."""
        return self.gbit_per_port * 1e9 / 8 * (self.ports_per_node or gpus_per_node)

    def per_gpu_bytes_per_s(self, gpus_per_node: int) -> float:
        """Each GPU's share of the node's NICs when all of them talk across nodes at once: its own rail where a
        node has a NIC per GPU, a share of a NIC where it has fewer."""
        return self.node_bytes_per_s(gpus_per_node) / max(gpus_per_node, 1)


INTERCONNECTS: dict[str, Interconnect] = {
    link.name: link
    for link in (
        Interconnect("nvlink", 3600, None, "NVLink between nodes (NVLink Switch, 450 GB/s per GPU)", _NVLINK),
        Interconnect("infiniband-ndr", 400, None, "InfiniBand NDR (400 Gb/s per GPU)", _DGX_H100),
        Interconnect("infiniband-hdr", 200, None, "InfiniBand HDR (200 Gb/s per GPU)", _DGX_A100),
        Interconnect("roce", 400, None, "RoCE (400 GbE per GPU)", _DGX_H100 + " (the same NICs in Ethernet mode)"),
        Interconnect("ethernet-100g", 100, 1, "Ethernet 100G (one NIC per node)", "IEEE 802.3ba/bj: 100 Gb/s"),
        Interconnect("ethernet-25g", 25, 1, "Ethernet 25G (one NIC per node)", "IEEE 802.3by: 25 Gb/s"),
    )
}

MAX_NICS = 64
"""The most NICs a node may be said to have (`--interconnect NAME:NICS`): more is a typo."""

DEFAULT_INTERCONNECT = "ethernet-100g"
"""Assumed when you say nothing: one 100 GbE NIC per node. A plan that assumed a fabric you do not have would
pick full sharding across nodes and then run at the network's pace; assuming the slow link costs at most a
less aggressive (hybrid) sharding. Pass `--interconnect` for yours."""


def interconnect(name: str | None) -> Interconnect:
    """The link called `name` (None: the default), "NAME" or "NAME:NICS" (the NICs a node has, each at the link's
    rate); an unknown name or a bad NIC count raises, saying what is accepted."""
    text = DEFAULT_INTERCONNECT if name is None else str(name).strip().lower().replace("_", "-")
    key, colon, count = text.partition(":")
    if key not in INTERCONNECTS:
        raise SettingError(
            f"interconnect={name!r} is not a link cudaload knows. Pass one of {sorted(INTERCONNECTS)}, optionally "
            f"with the NICs a node has after a colon (e.g. 'ethernet-100g:2'), or leave it unset for "
            f"{DEFAULT_INTERCONNECT} (the slow default)."
        )
    link = INTERCONNECTS[key]
    if not colon:
        return link
    if not count.isdigit() or not 1 <= int(count) <= MAX_NICS:
        raise SettingError(
            f"interconnect={name!r}: {count!r} is not a NIC count. After the colon put the NICs each node has, a "
            f"whole number from 1 to {MAX_NICS} (e.g. '{key}:2'), or leave it out for {link.label}."
        )
    nics = int(count)
    rate = f"{link.gbit_per_port:g} Gb/s"
    label = f"{link.label.split(' (')[0]} ({nics} x {rate} NIC{'s' if nics > 1 else ''} a node)"
    return replace(link, name=f"{key}:{nics}", ports_per_node=nics, label=label)


# Per GPU, per direction: (bytes/s, what). NVLink-connected (SXM) parts by their NVML names, NVLink-bridged (NVL)
# boards at the bridge's rate, AMD's Infinity Fabric mesh by the links' sum; the rest PCIe.
_GPU_LINKS: dict[str, tuple[float, str]] = {
    "NVIDIA H100 80GB HBM3": (450e9, f"NVLink 4, 900 GB/s both directions ({_H100})"),
    "NVIDIA H100 NVL": (300e9, f"NVLink bridge, 600 GB/s both directions ({_H100})"),
    "NVIDIA H100 PCIe": (64e9, f"PCIe Gen5 x16, 128 GB/s both directions ({_H100})"),
    "NVIDIA H800": (200e9, f"NVLink 400 GB/s both directions ({_H800})"),
    "NVIDIA H800 PCIe": (64e9, f"PCIe Gen5 x16, 128 GB/s both directions ({_H800})"),
    "NVIDIA H20": (450e9, f"NVLink 4, 900 GB/s both directions ({_H20})"),
    "NVIDIA GH200 480GB": (450e9, f"NVLink 4, 900 GB/s both directions ({_GH200})"),
    "NVIDIA H200": (450e9, f"NVLink 4, 900 GB/s both directions ({_H100})"),
    "NVIDIA H200 NVL": (450e9, f"NVLink bridge, 900 GB/s both directions ({_H200})"),
    # A fully connected mesh: each GPU has a link to each of the 7 others, and RCCL's rings over 8 GPUs use them
    # all; between 2 GPUs only one link (64 GB/s per direction) carries the traffic.
    "AMD Instinct MI300X": (448e9, f"Infinity Fabric, 7 x 64 GB/s per direction ({_MI300})"),
    "AMD Instinct MI325X": (448e9, f"Infinity Fabric, 7 x 64 GB/s per direction ({_MI300})"),
    "NVIDIA B200": (900e9, f"NVLink 5, 1.8 TB/s both directions ({_B200})"),
    "NVIDIA A100-SXM4-40GB": (300e9, f"NVLink 3, 600 GB/s both directions ({_A100})"),
    "NVIDIA A100-SXM4-80GB": (300e9, f"NVLink 3, 600 GB/s both directions ({_A100})"),
}
_PCIE = (32e9, "PCIe Gen4 x16, 64 GB/s both directions (assumed for a GPU without NVLink in this table)")


def gpu_link(gpu_name: str | None) -> tuple[float, str]:
    """(bytes/s per direction, what) between two GPUs of one node: NVLink where the part has it, else PCIe."""
    return _GPU_LINKS.get(gpu_name or "", _PCIE)


# Dense BF16 matrix throughput (the datasheets quote twice these figures "with sparsity").
_TFLOPS: dict[str, tuple[float, str]] = {
    "NVIDIA H100 80GB HBM3": (989.0, _H100),
    "NVIDIA H100 PCIe": (756.0, _H100),
    "NVIDIA H100 NVL": (835.0, _H100),
    "NVIDIA H200": (989.0, _H100 + " (H200: the H100 SXM's compute)"),
    "NVIDIA H200 NVL": (835.0, _H200 + " (H200 NVL: 1671 with sparsity)"),
    "NVIDIA GH200 480GB": (989.0, _GH200),
    "NVIDIA H800": (989.0, _H800),
    "NVIDIA H800 PCIe": (756.0, _H800 + " (PCIe: the H100 PCIe's compute)"),
    "NVIDIA H20": (148.0, _H20),
    "AMD Instinct MI300X": (1307.4, _MI300),
    "AMD Instinct MI325X": (1307.4, _MI300),
    "NVIDIA B200": (2250.0, _B200),
    "NVIDIA A100-SXM4-40GB": (312.0, _A100),
    "NVIDIA A100-SXM4-80GB": (312.0, _A100),
    "NVIDIA A100-PCIE-40GB": (312.0, _A100),
    "NVIDIA A100 80GB PCIe": (312.0, _A100),
}


def gpu_tflops(gpu_name: str | None) -> float | None:
    """Dense BF16 TFLOPS of the GPU called `gpu_name` (its NVML name); None for one this table lacks."""
    entry = _TFLOPS.get(gpu_name or "")
    return entry[0] if entry is not None else None


@frozen
class ParallelLayout:
    """Where the ranks of a training job run: `nodes` x `ranks_per_node`, and the link between nodes.

    Attributes:
        nodes: Machines in the job.
        ranks_per_node: Processes per machine (one per GPU; on a CPU machine, what you ask).
        interconnect: The link between nodes (`INTERCONNECTS`).
        interconnect_given: You named the link (False: the default was assumed).
    """

    nodes: int
    ranks_per_node: int
    interconnect: Interconnect
    interconnect_given: bool = False

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node
