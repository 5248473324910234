"""Detection with a fake at the single GPU boundary (the probe); everything else is real."""

from __future__ import annotations

import pytest

from cudaload.capability import detect_uncached
from cudaload.capability.cpu import parse_cpuinfo, parse_meminfo
from cudaload.capability.gpus import ProbeFailed, probe_gpus
from cudaload.capability.launch import read_launch
from cudaload.capability.visible import RawDevice, RawMigSlice, parse_visible_devices
from cudaload.facts.machine import GiB

A100 = dict(
    name="NVIDIA A100-SXM4-80GB", capability=(8, 0), total_memory=80 * GiB, free_memory=79 * GiB, multiprocessors=108
)
T4 = dict(name="Tesla T4", capability=(7, 5), total_memory=15 * GiB, free_memory=14 * GiB, multiprocessors=40)


def node(*kinds: dict) -> list[RawDevice]:
    return [
        RawDevice(nvml_index=i, uuid=f"GPU-{i}aaa{i}-0000", pci_bus_id=f"00000000:{i + 1:02X}:00.0", **kind)
        for i, kind in enumerate(kinds)
    ]


class FakeProbe:
    name = "nvml"

    def __init__(self, devices: list[RawDevice]) -> None:
        self._devices = devices

    def devices(self) -> list[RawDevice]:
        return self._devices

    def driver_version(self) -> str | None:
        return "575.51"

    def __enter__(self) -> FakeProbe:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def probe(devices: list[RawDevice], **env: str):
    return probe_gpus(env, [lambda: FakeProbe(devices)])


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        ("", []),
        ("  ", []),
        ("0,1", [0, 1]),
        ("1,0", [1, 0]),
        ("1gpu,2", [1, 2]),  # parsed like strtoul
        ("0,-1,1", [0]),  # an invalid entry ends the list
        ("0,x,1", [0]),
        ("0,0", []),  # a repeated device empties it
        ("GPU-1a,GPU-0a", ["GPU-1a", "GPU-0a"]),
        ("GPU-1a,1", ["GPU-1a"]),
        ("MIG-abc", ["MIG-abc"]),
    ],
)
def test_parse_visible_devices(value: str | None, expected: list | None) -> None:
    assert parse_visible_devices(value) == expected


@pytest.mark.parametrize(
    ("visible", "names", "physical"),
    [
        (None, ["NVIDIA A100-SXM4-80GB"] * 4, [0, 1, 2, 3]),
        ("", [], []),
        ("2,0", ["NVIDIA A100-SXM4-80GB"] * 2, [2, 0]),
        ("3,7,1", ["NVIDIA A100-SXM4-80GB"], [3]),  # ordinal 7 does not exist: the list ends there
        ("GPU-2", ["NVIDIA A100-SXM4-80GB"], [2]),  # UUID prefix
        ("GPU-1aaa1,GPU-3", ["NVIDIA A100-SXM4-80GB"] * 2, [1, 3]),
        ("GPU-", [], []),  # ambiguous prefix matches nothing
        ("GPU-9", [], []),
    ],
)
def test_visible_devices_select_and_reorder(visible: str | None, names: list[str], physical: list[int]) -> None:
    env = {} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}
    report = probe(node(A100, A100, A100, A100), **env)
    assert [g.name for g in report.gpus] == names
    assert [g.physical_index for g in report.gpus] == physical
    assert [g.index for g in report.gpus] == list(range(len(names)))


def test_an_unmatched_entry_is_reported() -> None:
    report = probe(node(A100, A100), CUDA_VISIBLE_DEVICES="1,5")
    assert len(report.gpus) == 1
    assert any("entry 2 matches no GPU" in w for w in report.warnings)


def test_mixed_gpus_follow_cuda_device_order_and_warn() -> None:
    devices = node(T4, A100)  # the T4 sits first on the PCI bus
    fastest = probe(devices)
    assert [g.name for g in fastest.gpus] == ["NVIDIA A100-SXM4-80GB", "Tesla T4"]
    assert any("CUDA_DEVICE_ORDER" in w for w in fastest.warnings)
    pci = probe(devices, CUDA_DEVICE_ORDER="PCI_BUS_ID")
    assert [g.name for g in pci.gpus] == ["Tesla T4", "NVIDIA A100-SXM4-80GB"]
    assert not any("CUDA_DEVICE_ORDER" in w for w in pci.warnings)
    # CUDA_VISIBLE_DEVICES ordinals index CUDA's order, not nvidia-smi's.
    assert probe(devices, CUDA_VISIBLE_DEVICES="0").gpus[0].name == "NVIDIA A100-SXM4-80GB"
    assert probe(devices, CUDA_VISIBLE_DEVICES="0", CUDA_DEVICE_ORDER="PCI_BUS_ID").gpus[0].name == "Tesla T4"


def test_mig_enabled_gpu_shows_one_slice() -> None:
    slices = (
        RawMigSlice("MIG-aaaa", "NVIDIA A100-SXM4-80GB MIG 1g.10gb", 10 * GiB, 9 * GiB, 14),
        RawMigSlice("MIG-bbbb", "NVIDIA A100-SXM4-80GB MIG 3g.40gb", 40 * GiB, 39 * GiB, 42),
    )
    devices = [RawDevice(nvml_index=0, uuid="GPU-0", mig_slices=slices, **A100)]
    report = probe(devices)
    (gpu,) = report.gpus
    assert gpu.mig and gpu.total_memory == 10 * GiB and gpu.multiprocessors == 14
    assert any("MIG mode" in w for w in report.warnings)
    chosen = probe(devices, CUDA_VISIBLE_DEVICES="MIG-bbbb").gpus
    assert [g.name for g in chosen] == ["NVIDIA A100-SXM4-80GB MIG 3g.40gb"]


def test_nvml_failure_falls_back_to_the_next_probe() -> None:
    def broken() -> FakeProbe:
        raise ProbeFailed("NVML: Unknown Error")

    class TorchLike(FakeProbe):
        name = "torch"

    report = probe_gpus({}, [broken, lambda: TorchLike(node(T4))])
    assert report.source == "torch"
    assert [g.name for g in report.gpus] == ["Tesla T4"]
    assert report.notes and "Unknown Error" in report.notes[0]


def test_no_driver_stops_probing_without_trying_torch() -> None:
    tried = []

    def no_driver() -> FakeProbe:
        raise ProbeFailed("NVML Shared Library Not Found", no_driver=True)

    def torch_probe() -> FakeProbe:
        tried.append("torch")
        return FakeProbe(node(T4))

    report = probe_gpus({}, [no_driver, torch_probe])
    assert report.gpus == () and report.source == "none"
    assert tried == []


@pytest.mark.parametrize(
    ("platform", "nodes", "absent"),
    [
        ("linux", set(), True),
        ("linux", {"/dev/nvidiactl"}, False),  # a container with the NVIDIA toolkit
        ("linux", {"/proc/driver/nvidia/version"}, False),
        ("linux", {"/dev/dxg"}, False),  # WSL2
        ("win32", set(), False),  # no such nodes off Linux: ask NVML
    ],
)
def test_a_linux_machine_without_driver_nodes_skips_nvml(platform, nodes, absent) -> None:
    from cudaload.capability.gpus import nvidia_driver_absent

    assert nvidia_driver_absent(platform, nodes.__contains__) is absent


def test_without_a_driver_detect_does_not_import_pynvml() -> None:
    import os
    import subprocess
    import sys

    from cudaload.capability.gpus import nvidia_driver_absent

    if not nvidia_driver_absent():
        pytest.skip("this machine has an NVIDIA driver")
    code = "import sys, cudaload; m = cudaload.detect(); print(m.source, 'pynvml' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ))
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["none", "False"]


def test_detect_uncached_builds_a_whole_machine() -> None:
    machine = detect_uncached({"CUDA_VISIBLE_DEVICES": "1"}, [lambda: FakeProbe(node(A100, T4))])
    assert machine.source == "nvml"
    assert [g.name for g in machine.gpus] == ["Tesla T4"]  # fastest first: A100 is 0, T4 is 1
    # Everything but the GPUs is this machine's, as the OS and package metadata report it.
    import os
    import platform
    from importlib.metadata import version
    from pathlib import Path

    # Versions without a local label ("2.13.0+cpu" is torch 2.13.0).
    assert machine.software.version("transformers") == version("transformers").split("+")[0]
    assert machine.software.version("torch") == version("torch").split("+")[0]
    cpu = machine.cpu
    assert cpu.cores == len(os.sched_getaffinity(0))
    assert cpu.arch == platform.machine()
    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
    names = [line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")]
    assert cpu.model == (names[0] if names else platform.processor() or platform.machine())
    flag_lines = [
        line.split(":", 1)[1].split() for line in cpuinfo if line.split(":")[0].strip() in ("flags", "Features")
    ]
    # The ISA flags that decide CPU dtypes and matmul paths, written out: the rest of the line is noise.
    kept = {"avx2", "avx512f", "avx512_bf16", "avx512_fp16", "avx512_vnni"}
    kept |= {"amx_bf16", "amx_tile", "amx_int8", "amx_fp16"}
    assert cpu.flags == kept & set(flag_lines[0] if flag_lines else ())
    meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    assert cpu.memory_total == int(meminfo["MemTotal"].split()[0]) * 1024
    assert cpu.memory_available is not None and 0 < cpu.memory_available <= cpu.memory_total


def test_cpuinfo_flags_decide_bf16() -> None:
    amx = "model name\t: Intel Xeon Platinum 8480+\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
    model, flags = parse_cpuinfo(amx)
    assert model == "Intel Xeon Platinum 8480+"
    assert {"amx_bf16", "avx512_bf16", "avx2"} <= flags and "fpu" not in flags
    assert parse_meminfo("MemTotal:       16 kB\nMemAvailable:    8 kB\n") == (16 * 1024, 8 * 1024)


@pytest.mark.parametrize(
    ("env", "launcher", "world", "local_rank", "strategy", "zero"),
    [
        ({}, None, 1, 0, None, None),
        (
            {"TORCHELASTIC_RUN_ID": "x", "RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8"},
            "torchrun",
            8,
            1,
            "ddp",
            None,
        ),
        (
            {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "ACCELERATE_USE_FSDP": "true"},
            "accelerate",
            2,
            0,
            "fsdp",
            None,
        ),
        (
            {
                "RANK": "1",
                "WORLD_SIZE": "2",
                "LOCAL_RANK": "1",
                "ACCELERATE_USE_DEEPSPEED": "true",
                "ACCELERATE_DEEPSPEED_ZERO_STAGE": "3",
            },
            "accelerate",
            2,
            1,
            "deepspeed",
            3,
        ),
        ({"SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_NTASKS": "4"}, "slurm", 4, 1, "ddp", None),
    ],
)
def test_launch(
    env: dict, launcher: str | None, world: int, local_rank: int, strategy: str | None, zero: int | None
) -> None:
    launch = read_launch(env)
    assert (launch.launcher, launch.world_size, launch.local_rank, launch.strategy, launch.zero_stage) == (
        launcher,
        world,
        local_rank,
        strategy,
        zero,
    )


# --- installed packages and the Hub-kernel cache -------------------------------------------------

from cudaload.capability.software import find_cached_kernel, flash_provided, probe_hub  # noqa: E402
from cudaload.facts.machine import Software  # noqa: E402


@pytest.mark.parametrize(
    ("providers", "fa2", "fa4"),
    [
        ({"flash_attn": ["flash_attn"]}, True, False),  # FA2 wheels (which also ship flash_attn/cute)
        ({"flash_attn": ["flash-attn-4"]}, False, True),
        ({"flash_attn": ["flash_attn", "flash-attn-4"]}, True, True),
        ({}, False, False),
    ],
)
def test_flash_attention_is_told_apart_by_distribution(providers, fa2, fa4) -> None:
    def importable(module: str) -> bool:
        return module in providers

    assert flash_provided("flash-attn", "flash_attn", providers, importable) is fa2
    assert flash_provided("flash-attn-4", "flash_attn", providers, importable) is fa4
    assert not flash_provided("flash-attn-3", "flash_attn_interface", providers, importable)


def _cache(root, repo: str, ref: str, builds: list[str]):
    folder = root / ("kernels--" + repo.replace("/", "--"))
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / ref).write_text("abc123")
    for build in builds:
        (folder / "snapshots" / "abc123" / "build" / build).mkdir(parents=True)
    return folder


def test_a_cached_kernel_counts_only_with_a_variant_for_this_torch(tmp_path) -> None:
    repo = "kernels-community/flash-attn2"
    assert not find_cached_kernel(tmp_path, repo, 4, "2.13.0", "12.8").cached
    _cache(tmp_path, repo, "v4", ["torch212-cxx11-cu128-x86_64-linux"])
    stale = find_cached_kernel(tmp_path, repo, 4, "2.13.0", "12.8")
    assert not stale.cached and "no variant for torch213" in stale.detail
    assert not find_cached_kernel(tmp_path, repo, 3, "2.13.0", "12.8").cached  # another version branch
    assert not find_cached_kernel(tmp_path, repo, 4, "2.13.0", None).cached  # CPU torch


def test_a_matching_variant_is_found(tmp_path) -> None:
    import platform

    repo = "kernels-community/vllm-flash-attn3"
    build = f"torch213-cxx11-cu128-{platform.machine()}-linux"
    _cache(tmp_path, repo, "v1", ["torch212-cxx11-cu126-x86_64-linux", build])
    kernel = find_cached_kernel(tmp_path, repo, 1, "2.13.0", "12.8")
    assert kernel.cached and kernel.cached_variant == build


def test_probe_hub_reads_offline_cache_and_local_overrides(tmp_path) -> None:
    software = Software(packages=(("torch", "2.13.0"),), torch_cuda="12.8")
    (tmp_path / "fa4" / "build" / "torch-universal").mkdir(parents=True)  # a noarch build loads anywhere
    env = {
        "HF_HUB_OFFLINE": "1",
        "KERNELS_CACHE": str(tmp_path),
        "LOCAL_KERNELS": f"kernels-community/flash-attn4={tmp_path / 'fa4'}",
    }
    hub = probe_hub(env, software)
    assert hub.offline
    fa4 = hub.kernel("kernels-community/flash-attn4")
    assert fa4 is not None and fa4.cached and "LOCAL_KERNELS" in fa4.detail
    fa2 = hub.kernel("kernels-community/flash-attn2")
    assert fa2 is not None and not fa2.cached and fa2.version == 4
    # kernels resolves an override before the cache and raises FileNotFoundError when the folder has
    # no variant for this system: an override to nothing is not usable.
    missing = probe_hub({**env, "LOCAL_KERNELS": f"kernels-community/flash-attn4={tmp_path / 'none'}"}, software)
    fa4 = missing.kernel("kernels-community/flash-attn4")
    assert fa4 is not None and not fa4.cached and "FileNotFoundError" in fa4.detail


# --- our CUDA_VISIBLE_DEVICES parser against torch's own -----------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.sampled_from(
            ["0", "1", "2", "3", "10", "-1", "x", "1gpu", " 2", "GPU-a", "GPU-1", " GPU-2", "MIG-9", "", " "]
        ),
        min_size=1,
        max_size=5,
    )
)
def test_visible_devices_parse_like_torch(entries: list[str]) -> None:
    import os

    import torch

    value = ",".join(entries)
    old = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = value
    try:
        expected = torch.cuda._parse_visible_devices()
    finally:
        if old is None:
            del os.environ["CUDA_VISIBLE_DEVICES"]
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = old
    ours = parse_visible_devices(value)
    if value.strip() == "":
        assert ours == []  # CUDA: empty means no device (torch's parser yields [-1 -> stop] too)
        assert expected == []
    else:
        assert ours == expected


def test_changing_visibility_after_cuda_started_is_warned() -> None:
    from cudaload.capability.gpus import late_visibility_warning

    assert late_visibility_warning(None, 2) is None  # CUDA not started: the variables still apply
    assert late_visibility_warning(2, 2) is None
    message = late_visibility_warning(4, 1)
    assert message is not None and "initialised in this process with 4" in message and "selects 1" in message


@pytest.mark.parametrize(
    ("cores", "capability", "sms"),
    [
        (6912, (8, 0), 108),
        (16896, (9, 0), 132),
        (2560, (7, 5), 40),
        (5120, (7, 0), 80),
        (16384, (8, 9), 128),
        (None, (9, 0), None),
    ],
)
def test_sm_count_from_nvml_cores(cores, capability, sms) -> None:
    from cudaload.capability.gpus import multiprocessors_from_cores

    assert multiprocessors_from_cores(cores, capability) == sms


def test_hub_reachability_is_reported_not_assumed(monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub.constants

    from cudaload.capability.hub_access import check_hub_reachable

    ok, why = check_hub_reachable("kernels-community/flash-attn2", offline=True)
    assert not ok and "HF_HUB_OFFLINE" in why
    # A closed port on loopback: the request fails at once and the answer says how.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    ok, why = check_hub_reachable(
        "kernels-community/flash-attn2", offline=False, endpoint="http://127.0.0.1:9", timeout=2
    )
    assert not ok and why.startswith(("ConnectError", "ConnectionError")), why
