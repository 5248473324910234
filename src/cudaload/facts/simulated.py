"""What `Machine.simulated()` builds a machine you don't have from: catalog GPUs, the packages it assumes, its
arguments checked. Data only: it reads dist-info folder names (installed.py), nothing else."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from .catalog import CatalogGpu
from .hardware import GiB, Gpu
from .launch import Launch

__all__ = [
    "SIMULATED_DEFAULTS",
    "TRANSFORMERS_5_MIN_TORCH",
    "catalog_gpu",
    "check_gpus_and_launch",
    "check_simulated",
    "simulated_packages",
]


SIMULATED_DEFAULTS = {"torch": "2.13.0", "transformers": "5.22.2", "accelerate": "1.16.0"}
"""What a simulated machine has when neither this machine nor `packages=` says otherwise (the tested set)."""
TESTED_VERSIONS = {**SIMULATED_DEFAULTS, "peft": "0.21.2", "bitsandbytes": "0.50.2", "kernels": "0.17.2"}
"""The tested set (constraints/tested.txt): `cudaload plan`'s `--with PKG==VERSION` advice on a simulated machine."""


def simulated_packages(told: Mapping[str, str | None], installed: bool) -> tuple[dict[str, str], str]:
    """A simulated machine's {distribution: version} and one line saying where it comes from."""
    from . import packages as here  # reads dist-info folder names only: see installed.py

    base = {**SIMULATED_DEFAULTS, **(here.packages_here() if installed else {})}
    origin = (
        "as installed here"
        if installed
        else f"the defaults ({', '.join(f'{k} {v}' for k, v in SIMULATED_DEFAULTS.items())})"
    )
    versions = {k: v for k, v in {**base, **told}.items() if v is not None}
    if "transformers" not in versions or "torch" not in versions:
        from ..errors import SettingError

        raise SettingError(
            f"packages={dict(told)!r} removes torch or transformers: a machine cudaload plans for has both "
            "(give a version instead, e.g. {'transformers': '5.22.2'})."
        )
    _check_torch_for_transformers(versions["torch"], versions["transformers"])
    added = ", ".join(f"{k} {v}" for k, v in sorted(told.items()) if v is not None)
    removed = ", ".join(k for k, v in sorted(told.items()) if v is None)
    return versions, origin + (f", with {added}" if added else "") + (f", without {removed}" if removed else "")


TRANSFORMERS_5_MIN_TORCH = "2.6.0"
"""The oldest torch transformers 5 runs on: below it transformers 5.22-5.25 `utils/import_utils.is_torch_available`
logs "Disabling PyTorch because PyTorch >= 2.6 is required" and loads no model."""


def _check_torch_for_transformers(torch: str, transformers: str) -> None:
    """A simulated torch transformers would disable is no machine to plan for (torch 1.0 has no SDPA at all)."""
    from packaging.version import Version

    if Version(transformers).major >= 5 and Version(torch) < Version(TRANSFORMERS_5_MIN_TORCH):
        from ..errors import SettingError

        raise SettingError(
            f"packages: torch {torch} with transformers {transformers}: transformers 5 disables a torch older than "
            f"{TRANSFORMERS_5_MIN_TORCH} (utils/import_utils.is_torch_available) and loads no model there. Give "
            f"torch {TRANSFORMERS_5_MIN_TORCH} or newer (e.g. {{'torch': '2.13.0'}})."
        )


def catalog_gpu(entry: CatalogGpu, index: int) -> Gpu:
    """A catalog GPU as a simulated machine's GPU `index`: all of its memory free, as far as anyone knows."""
    return Gpu(
        index=index,
        name=entry.name,
        capability=entry.capability,
        total_memory=int(entry.memory_gib * GiB),
        free_memory=None,
        physical_index=index,
        multiprocessors=entry.multiprocessors,
        vendor=entry.vendor,
        arch_name=entry.arch,
    )


def check_simulated(gpu: object, count: object, packages: object, more: Mapping[str, object] | None = None) -> None:
    """Machine.simulated's arguments, checked before any is used (a str for packages or cpu_flags would
    be iterated letter by letter, a float count would multiply a list, "no" is a true offline)."""
    from ..errors import SettingError

    for name, value in (more or {}).items():
        if name == "offline" and not isinstance(value, bool):
            raise SettingError(f"offline={value!r}: pass True or False.")
        if name in ("cpu_flags", "cached_kernels") and (
            isinstance(value, (str, bytes))
            or not isinstance(value, Iterable)
            or not all(isinstance(item, str) for item in value)
        ):
            example = "['avx2', 'amx_bf16']" if name == "cpu_flags" else "['kernels-community/flash-attn2']"
            raise SettingError(f"{name}={value!r}: pass a list of names, e.g. {example}, not one string.")
        if name == "cpu_memory_gib" and (
            isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf")
        ):
            raise SettingError(f"cpu_memory_gib={value!r}: pass the machine's RAM in GiB, a number above 0 (e.g. 64).")

    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise SettingError(f"count={count!r}: pass a whole number of GPUs, 1 or more (e.g. count=8).")
    if (
        gpu is not None
        and not isinstance(gpu, str)
        and (not isinstance(gpu, Sequence) or not all(isinstance(name, str) for name in gpu))
    ):
        raise SettingError(f"gpu={gpu!r}: pass a GPU name ('H100'), a list of names (['A100', 'T4']) or None.")
    if packages is not None and (
        not isinstance(packages, Mapping)
        or not all(isinstance(k, str) and isinstance(v, (str, type(None))) for k, v in packages.items())
    ):
        raise SettingError(
            f"packages={packages!r}: pass a dict of distribution -> version, e.g. {{'flash-attn': '2.8.3'}} "
            "(not 'flash-attn==2.8.3')."
        )
    from packaging.version import InvalidVersion, Version

    for name, version in (packages or {}).items():
        try:
            Version(version) if version is not None else None
        except InvalidVersion:
            raise SettingError(
                f"packages={{{name!r}: {version!r}}}: {version!r} is not a version; give one as pip shows it "
                "(e.g. '2.8.3'), or None to remove the package."
            ) from None


def check_gpus_and_launch(gpu: object, count: int, entries: Sequence[CatalogGpu], launch: object) -> None:
    """The GPUs asked for agree with each other and with the launch: one vendor (one torch build drives one
    vendor's GPUs: a CUDA torch sees no AMD GPU and a ROCm torch no NVIDIA one, so a machine with both plans
    nothing real), a count only for a single name, a launch that is a `Launch` with no more local ranks than
    the GPUs a count or a list names (a single name with a launch is the GPU kind each rank has)."""
    from ..errors import SettingError

    if launch is not None and not isinstance(launch, Launch):
        raise SettingError(
            f"launch={launch!r}: pass a cudaload.Launch, e.g. Launch(launcher='torchrun', world_size=2, "
            "local_world_size=2, strategy='ddp'), or None for a single process."
        )
    if count != 1 and isinstance(gpu, Sequence) and not isinstance(gpu, str):
        first = gpu[0] if gpu else "A100"
        raise SettingError(
            f"count={count} with the GPU list gpu={list(gpu)!r}: a list names every GPU, count repeats a single "
            f"name (pass gpu={first!r}, count={count}, or repeat the name in the list)."
        )
    vendors: dict[str, list[str]] = {}
    for entry in entries:
        vendors.setdefault(entry.vendor, []).append(entry.name)
    if len(vendors) > 1:
        listed = "; ".join(f"{vendor}: {', '.join(dict.fromkeys(names))}" for vendor, names in vendors.items())
        raise SettingError(
            f"gpu={gpu!r} mixes GPU vendors ({listed}): one torch build drives one vendor's GPUs (a CUDA torch sees "
            "no AMD GPU, a ROCm torch no NVIDIA one), so no process could use them all. Simulate each vendor's "
            "machine on its own (e.g. gpu='H100' and gpu='MI300X') and compare the plans."
        )
    named = len(entries) if count > 1 or (gpu is not None and not isinstance(gpu, str)) else 0
    if isinstance(launch, Launch) and named and launch.local_world_size > named:
        raise SettingError(
            f"launch has {launch.local_world_size} ranks on this node (local_world_size) but the machine has "
            f"{named} GPU(s): a launch runs one process per GPU, so {launch.local_world_size - named} would have "
            f"none. Pass count={launch.local_world_size} (or a launch with local_world_size={named})."
        )
