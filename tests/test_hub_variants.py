"""Hub-kernel build variants as `kernels` resolves them: cached snapshots laid out as kernels and
huggingface_hub write them, build/ folders named as real kernels builds are (kernels' build-variants
page: `torch212-cxx11-cu130-x86_64-linux`, the noarch `torch-cuda` / `torch-universal`, the stable-ABI
`torch-stable-abi29-cu126-x86_64-linux`, kernels 0.19's `torch-2.13-cuda-12.8-cpython-3.9-abi3-...`),
held against the installed kernels' own parser and resolver."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
import sysconfig
from dataclasses import replace
from pathlib import Path

import pytest

from cudaload.capability.kernel_variants import BuildSystem, resolve_build_variants
from cudaload.capability.software import (
    find_cached_kernel,
    hub_cache_dir,
    hub_offline,
    parse_local_kernels,
    probe_hub,
)
from cudaload.facts.machine import Software
from cudaload.upstream_flash import FLASH_OPTIONS
from cudaload.upstream_kernels import hub_kernel_version

PINNED = BuildSystem(cpu="x86_64", os="linux", cxx11_abi=True, python=(3, 11), kernels="0.17.2")
NEWEST = replace(PINNED, kernels="0.19.1")
BOTH = pytest.mark.parametrize("system", [PINNED, NEWEST], ids=["kernels-0.17", "kernels-0.19"])
REPO = "kernels-community/vllm-flash-attn3"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _cache(root: Path, builds: list[str], *, repo: str = REPO, ref: str = "v1", commit: str = COMMIT) -> Path:
    """A kernels cache entry: refs/<ref> -> snapshots/<commit>/build/<variant>/metadata.json."""
    folder = root / ("kernels--" + repo.replace("/", "--"))
    (folder / "refs").mkdir(parents=True, exist_ok=True)
    (folder / "refs" / ref).write_text(commit)
    (folder / "snapshots" / commit / "build").mkdir(parents=True, exist_ok=True)
    for build in builds:
        (folder / "snapshots" / commit / "build" / build).mkdir()
        (folder / "snapshots" / commit / "build" / build / "metadata.json").write_text("{}")
    return folder


def _find(root: Path, builds: list[str], system: BuildSystem, torch: str = "2.13.0", cuda: str | None = "12.8"):
    _cache(root, builds)
    return find_cached_kernel(root, REPO, 1, torch, cuda, system)


# --- the edges the hand-written matcher got wrong --------------------------------------------------


@BOTH
def test_the_exact_build_is_found(tmp_path, system) -> None:
    kernel = _find(tmp_path, ["torch212-cxx11-cu128-x86_64-linux", "torch213-cxx11-cu128-x86_64-linux"], system)
    assert kernel.cached_variant == "torch213-cxx11-cu128-x86_64-linux"
    assert kernel.detail == "cached variant torch213-cxx11-cu128-x86_64-linux"


@BOTH
def test_a_build_for_a_newer_cuda_minor_is_rejected_with_kernels_reason(tmp_path, system) -> None:
    # The old matcher took any cu12x for CUDA 12.8: cu129 would have been "cached" and failed to load.
    kernel = _find(tmp_path, ["torch213-cxx11-cu129-x86_64-linux"], system)
    assert not kernel.cached
    assert "CUDA version (12.9) is not compatible with system CUDA version (12.8)" in kernel.detail
    assert "no variant for torch213 + CUDA 12.8 on x86_64-linux" in kernel.detail


@BOTH
def test_an_older_cuda_minor_of_the_same_major_is_accepted_and_the_newest_fitting_one_preferred(
    tmp_path, system
) -> None:
    builds = [
        "torch213-cxx11-cu126-x86_64-linux",
        "torch213-cxx11-cu128-x86_64-linux",
        "torch213-cxx11-cu129-x86_64-linux",
        "torch213-cxx11-cu130-x86_64-linux",
    ]
    resolution = resolve_build_variants(builds, "2.13.0", "12.8", system)
    assert resolution.accepted == ("torch213-cxx11-cu128-x86_64-linux", "torch213-cxx11-cu126-x86_64-linux")
    rejected = dict(resolution.rejected)
    assert rejected["torch213-cxx11-cu130-x86_64-linux"].startswith("CUDA version (13.0) is not compatible")
    older = resolve_build_variants(builds[:1], "2.13.0", "12.8", system)
    assert older.best == "torch213-cxx11-cu126-x86_64-linux"


@BOTH
def test_noarch_and_universal_builds_are_accepted_after_arch_builds(tmp_path, system) -> None:
    builds = ["torch-cpu", "torch-cuda", "torch-universal", "torch213-cxx11-cu128-x86_64-linux"]
    resolution = resolve_build_variants(builds, "2.13.0", "12.8", system)
    assert resolution.accepted == ("torch213-cxx11-cu128-x86_64-linux", "torch-cuda", "torch-universal")
    assert dict(resolution.rejected)["torch-cpu"] == (
        "backend (cpu) does not match system backend (cuda) and is not universal"
    )
    # A noarch build alone is found whatever the torch and arch (the old matcher ignored it).
    kernel = _find(tmp_path, ["torch-universal"], replace(system, cpu="aarch64"), torch="2.11.0")
    assert kernel.cached_variant == "torch-universal"
    # A CPU torch takes the CPU noarch build, not the CUDA one.
    cpu = resolve_build_variants(builds, "2.13.0+cpu", None, system)
    assert cpu.accepted == ("torch-cpu", "torch-universal")


@BOTH
def test_stable_abi_builds_serve_later_torch_releases_and_come_first(tmp_path, system) -> None:
    builds = [
        "torch-stable-abi29-cu126-x86_64-linux",
        "torch-stable-abi214-cu128-x86_64-linux",
        "torch213-cxx11-cu128-x86_64-linux",
    ]
    resolution = resolve_build_variants(builds, "2.13.0", "12.8", system)
    assert resolution.accepted == ("torch-stable-abi29-cu126-x86_64-linux", "torch213-cxx11-cu128-x86_64-linux")
    assert dict(resolution.rejected)["torch-stable-abi214-cu128-x86_64-linux"] == (
        "Torch stable ABI version (2.14) is too new for environment Torch version (2.13)"
    )
    assert _find(tmp_path, builds[:1], system).cached_variant == builds[0]


@BOTH
def test_a_build_for_another_torch_is_rejected(tmp_path, system) -> None:
    kernel = _find(tmp_path, ["torch212-cxx11-cu128-x86_64-linux", "torch214-cxx11-cu128-x86_64-linux"], system)
    assert not kernel.cached
    assert "Torch version (2.12) does not match environment Torch version (2.13)" in kernel.detail
    assert "Torch version (2.14) does not match environment Torch version (2.13)" in kernel.detail


@BOTH
def test_a_build_for_another_arch_os_or_cxx_abi_is_rejected(tmp_path, system) -> None:
    builds = [
        "torch213-cxx11-cu128-aarch64-linux",
        "torch213-metal-aarch64-darwin",
        "torch213-cxx98-cu128-x86_64-linux",
    ]
    kernel = _find(tmp_path, builds, system)
    assert not kernel.cached
    rejected = dict(resolve_build_variants(builds, "2.13.0", "12.8", system).rejected)
    assert rejected[builds[0]] == "CPU (aarch64) does not match system CPU (x86_64)"
    assert rejected[builds[1]] == "CPU (aarch64) does not match system CPU (x86_64)"
    assert rejected[builds[2]] == "Torch CXX11 ABI (False) does not match environment Torch CXX11 ABI (True)"
    arm_mac = replace(system, cpu="aarch64", os="darwin", cxx11_abi=None)
    assert dict(resolve_build_variants(builds[:1], "2.13.0", "12.8", arm_mac).rejected)[builds[0]] == (
        "OS (linux) does not match system OS (darwin)"
    )
    # The same arch build on an aarch64 Linux machine is the one that loads.
    assert (
        find_cached_kernel(tmp_path, REPO, 1, "2.13.0", "12.8", replace(system, cpu="aarch64")).cached_variant
        == (builds[0])
    )


def test_kernels_019_names_are_read_by_019_rules_only() -> None:
    new = "torch-2.13-cuda-12.8-cpython-3.9-abi3-x86_64-linux"
    assert resolve_build_variants([new], "2.13.0", "12.8", NEWEST).best == new
    # kernels 0.17 parses `torch-...` as a noarch build for backend "2.13-cuda-12.8-...": never loaded.
    old = resolve_build_variants([new], "2.13.0", "12.8", PINNED)
    assert old.best is None and "is not universal" in dict(old.rejected)[new]
    too_new = "torch-2.13-cuda-12.8-cpython-3.13-abi3-x86_64-linux"
    assert dict(resolve_build_variants([too_new], "2.13.0", "12.8", NEWEST).rejected)[too_new] == (
        "Python 3.13 or later is required, system Python version is 3.11"
    )
    # Free-threaded Python: 0.19 takes abi3t builds only, 0.17 no arch build at all.
    free = replace(NEWEST, python=(3, 15), free_threaded=True)
    abi3t = "torch-2.13-cuda-12.8-cpython-3.15-abi3t-x86_64-linux"
    assert resolve_build_variants([new, abi3t], "2.13.0", "12.8", free).accepted == (abi3t,)
    legacy = ["torch213-cxx11-cu128-x86_64-linux"]
    assert (
        resolve_build_variants(legacy, "2.13.0", "12.8", replace(free, python=(3, 13), kernels="0.17.2")).best is None
    )
    assert resolve_build_variants(legacy, "2.13.0", "12.8", replace(free, kernels="0.17.2")).best == legacy[0]


def test_unparseable_folders_are_reported_not_dropped() -> None:
    resolution = resolve_build_variants(["build-tmp", "torch213-cxx11-cu12x-x86_64-linux"], "2.13.0", "12.8", PINNED)
    assert resolution.best is None
    assert all("not a build variant name kernels parses" in reason for _, reason in resolution.rejected)
    assert {name for name, _ in resolution.rejected} == {"build-tmp", "torch213-cxx11-cu12x-x86_64-linux"}


@pytest.mark.parametrize(
    ("torch", "variant"), [("2.13.0+cu128", "torch213"), ("2.13.0rc1", "torch213"), ("2.9.1", "torch29")]
)
def test_torch_versions_with_local_tags_and_prereleases_match_their_minor(torch, variant) -> None:
    builds = ["torch213-cxx11-cu128-x86_64-linux", "torch29-cxx11-cu128-x86_64-linux"]
    assert resolve_build_variants(builds, torch, "12.8", PINNED).best == f"{variant}-cxx11-cu128-x86_64-linux"


def test_the_hub_kernel_branch_reads_prereleases_and_local_tags() -> None:
    assert hub_kernel_version("kernels-community/flash-attn4", "2.13.0+cpu", "5.25.0rc1") == 1
    assert hub_kernel_version("kernels-community/flash-attn4", "2.13.0+cpu", "5.24.2") == 0
    assert hub_kernel_version("kernels-community/flash-attn2", "2.13.0+cpu") == 4
    assert hub_kernel_version("kernels-community/flash-attn2", "2.9.0+cu126") == 3


# --- the cache around the variants -----------------------------------------------------------------


def test_the_version_branch_and_the_snapshot_must_be_cached(tmp_path) -> None:
    _cache(tmp_path, ["torch213-cxx11-cu128-x86_64-linux"], ref="v0")
    kernel = find_cached_kernel(tmp_path, REPO, 1, "2.13.0", "12.8", PINNED)
    assert not kernel.cached and kernel.detail == "cached, but not version v1 (cached: v0)"
    folder = _cache(tmp_path, [], ref="v1", commit="f" * 40)
    (folder / "snapshots" / ("f" * 40) / "build").rmdir()
    (folder / "snapshots" / ("f" * 40)).rmdir()
    kernel = find_cached_kernel(tmp_path, REPO, 1, "2.13.0", "12.8", PINNED)
    assert not kernel.cached and "which is not cached" in kernel.detail


def test_an_incomplete_snapshot_does_not_load_offline_with_kernels_017(tmp_path) -> None:
    """kernels 0.17 asks huggingface_hub for the whole snapshot offline; with the tree listing a
    download writes (every file of every variant), one downloaded variant is "incomplete" and
    kernels raises "Cannot find a local snapshot" (checked by hand against 0.17.2 + hub 2.4.0)."""
    build = "torch213-cxx11-cu128-x86_64-linux"
    folder = _cache(tmp_path, [build])
    (folder / "trees").mkdir()
    files = {
        f"build/{v}/metadata.json": {"size": 2, "blob_id": "0" * 40}
        for v in (build, "torch212-cxx11-cu128-x86_64-linux")
    }
    (folder / "trees" / f"{COMMIT}.json").write_text(json.dumps({"format_version": 1, "files": files}))
    offline = find_cached_kernel(tmp_path, REPO, 1, "2.13.0", "12.8", PINNED, offline=True)
    assert not offline.cached and "huggingface_hub's tree listing shows it incomplete" in offline.detail
    online = find_cached_kernel(tmp_path, REPO, 1, "2.13.0", "12.8", PINNED, offline=False)
    assert online.cached_variant == build and "online only" in online.detail
    assert find_cached_kernel(tmp_path, REPO, 1, "2.13.0", "12.8", NEWEST).cached_variant == build


# --- LOCAL_KERNELS ---------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["kernels-community/flash-attn2", "kernels-community/flash-attn2=/opt/fa2:", ""])
def test_a_malformed_local_kernels_is_reported_on_every_hub_kernel(tmp_path, value) -> None:
    overrides, error = parse_local_kernels({"LOCAL_KERNELS": value})
    assert overrides == {} and error is not None and "LOCAL_KERNELS entry" in error
    software = Software(packages=(("torch", "2.13.0"),), torch_cuda="12.8")
    _cache(tmp_path, ["torch-cuda"])  # even a usable cached kernel: kernels raises before it looks
    hub = probe_hub({"KERNELS_CACHE": str(tmp_path), "LOCAL_KERNELS": value}, software, PINNED)
    assert len(hub.kernels) == len(FLASH_OPTIONS)
    assert all(not k.cached and "raises ValueError" in k.detail for k in hub.kernels)


def test_local_kernels_follows_kernels_parsing_and_resolution(tmp_path) -> None:
    assert parse_local_kernels({}) == ({}, None)
    overrides, error = parse_local_kernels({"LOCAL_KERNELS": "a/b=/x=y:c/d=/first:c/d=/second"})
    assert error is None and overrides == {"a/b": Path("/x=y"), "c/d": Path("/second")}
    software = Software(packages=(("torch", "2.13.0"),), torch_cuda="12.8")
    local = tmp_path / "fa3"
    (local / "build" / "torch213-cxx11-cu129-x86_64-linux").mkdir(parents=True)
    env = {"KERNELS_CACHE": str(tmp_path), "LOCAL_KERNELS": f"{REPO}={local}"}
    _cache(tmp_path, ["torch213-cxx11-cu128-x86_64-linux"])  # cached, but the override wins
    kernel = probe_hub(env, software, PINNED).kernel(REPO)
    assert kernel is not None and not kernel.cached and "CUDA version (12.9) is not compatible" in kernel.detail
    (local / "build" / "torch213-cxx11-cu126-x86_64-linux").mkdir()
    kernel = probe_hub(env, software, PINNED).kernel(REPO)
    assert (
        kernel is not None and kernel.cached_variant == f"local:{local / 'build' / 'torch213-cxx11-cu126-x86_64-linux'}"
    )


# --- the cache folder and offline mode, held against huggingface_hub.constants ---------------------

ENVS = [
    {"HOME": "/h"},
    {"HOME": "/h/", "XDG_CACHE_HOME": "/xdg"},
    {"HOME": "/h", "HF_HOME": "~/hf"},
    {"HOME": "/h", "HF_HOME": "/hf", "HUGGINGFACE_HUB_CACHE": "/legacy"},
    {"HOME": "/h", "HUGGINGFACE_HUB_CACHE": "/legacy", "HF_HUB_CACHE": "$ROOT/hub-${ROOT}/$NOPE"},
    {"HOME": "/h", "ROOT": "/r", "HF_HUB_CACHE": "$ROOT/hub-${ROOT}/$NOPE", "HF_HUB_OFFLINE": "ON"},
    {"HOME": "/h", "TRANSFORMERS_OFFLINE": "yes"},
    {"HOME": "/h", "HF_HUB_OFFLINE": "0", "TRANSFORMERS_OFFLINE": "1"},
    {"HOME": "/h", "HF_HUB_OFFLINE": "", "TRANSFORMERS_OFFLINE": "true"},
]


def test_cache_dir_and_offline_mode_match_huggingface_hub_constants() -> None:
    """huggingface_hub reads these once, at import: each env is imported fresh in one subprocess."""
    code = (
        "import importlib, json, os, sys\n"
        "from huggingface_hub import constants\n"
        "out = []\n"
        "for env in json.loads(sys.argv[1]):\n"
        "    os.environ.clear(); os.environ.update(env)\n"
        "    importlib.reload(constants)\n"
        "    out.append([constants.HF_HUB_CACHE, constants.HF_HUB_OFFLINE])\n"
        "print(json.dumps(out))\n"
    )
    result = subprocess.run([sys.executable, "-c", code, json.dumps(ENVS)], capture_output=True, text=True, check=True)
    for env, (cache, offline) in zip(ENVS, json.loads(result.stdout), strict=True):
        assert hub_cache_dir(env) == Path(cache), env
        assert hub_offline(env) is offline, env
    assert hub_cache_dir({**ENVS[0], "KERNELS_CACHE": "/k"}) == Path("/k")  # kernels' own override first


# --- held against the installed kernels ------------------------------------------------------------

GRID = [
    "torch213-cxx11-cu126-x86_64-linux",
    "torch213-cxx11-cu128-x86_64-linux",
    "torch213-cxx11-cu129-x86_64-linux",
    "torch213-cxx11-cu130-x86_64-linux",
    "torch213-cxx98-cu128-x86_64-linux",
    "torch213-cu128-x86_64-linux",
    "torch213-cxx11-cpu-x86_64-linux",
    "torch213-cxx11-rocm72-x86_64-linux",
    "torch213-cxx11-cu128-aarch64-linux",
    "torch213-metal-aarch64-darwin",
    "torch212-cxx11-cu128-x86_64-linux",
    "torch29-cxx11-cu128-x86_64-linux",
    "torch-stable-abi29-cu126-x86_64-linux",
    "torch-stable-abi211-cu128-x86_64-linux",
    "torch-stable-abi214-cu128-x86_64-linux",
    "tvm-ffi01-cu128-x86_64-linux",
    "torch-cuda",
    "torch-cpu",
    "torch-universal",
    "torch-2.13-cuda-12.8-cpython-3.9-abi3-x86_64-linux",
    "torch-2.13-cxx11-cuda-12.6-cpython-3.11-abi3-x86_64-linux",
    "torch-2.13-cuda-12.8-cpython-3.14-abi3-x86_64-linux",
    "torch-stable-abi-2.10-cuda-12.8-cpython-3.9-abi3-x86_64-linux",
    "mlx-metal",
    "sdk",
    "sdk-cuda",
    "sdk-cuda-12.8-cpython-3.9-abi3-x86_64-linux",
    "not-a-variant",
    "torch213-cxx11-cu128-x86_64",
]


def _kernels_resolver():
    kernels = pytest.importorskip("kernels")
    try:  # kernels 0.19 moved its modules under kernels._internals
        from kernels._internals import backends, variants  # type: ignore[import-not-found]
    except ImportError:
        from kernels import backends, variants  # type: ignore[no-redef]
    return kernels.__version__, backends, variants


@pytest.mark.parametrize(
    ("torch", "cuda", "cpu", "cxx11"),
    [
        ("2.13.0", "12.8", "x86_64", True),
        ("2.13.1+cu126", "12.6", "x86_64", True),
        ("2.13.0", "12.9", "aarch64", True),
        ("2.13.0", "13.0", "x86_64", True),
        ("2.13.0", None, "x86_64", True),
        ("2.12.0", "12.8", "x86_64", False),
        ("2.9.0", "12.8", "x86_64", True),
    ],
)
def test_resolution_matches_the_installed_kernels(torch, cuda, cpu, cxx11) -> None:
    """The same names, system and order given to kernels' own `parse_variant` and
    `_resolve_variant_for_system` (its fact-taking resolver): the same variants accepted in the same
    order, the same reasons, and the names kernels cannot parse are exactly the ones reported so."""
    from packaging.version import Version

    version, backends, variants = _kernels_resolver()
    system = BuildSystem(
        cpu=cpu,
        os="linux",
        cxx11_abi=cxx11,
        python=(sys.version_info.major, sys.version_info.minor),
        free_threaded=bool(sysconfig.get_config_var("Py_GIL_DISABLED")),
        kernels=version,
    )
    parsed, unparsed = [], set()
    for name in sorted(GRID):
        try:
            parsed.append(variants.parse_variant(name))
        except ValueError:
            unparsed.add(name)
    torch_minor = Version(".".join(torch.split("+")[0].split(".")[:2]))
    facts = {
        "variants": parsed,
        "selected_backend": backends.CUDA(version=Version(cuda)) if cuda else backends.CPU(),
        "cpu": cpu,
        "os": "linux",
        "torch_version": torch_minor,
        "torch_cxx11_abi": cxx11,
        "tvm_ffi_version": None,
        "python_version": Version(f"{sys.version_info.major}.{sys.version_info.minor}"),
        "free_threaded": system.free_threaded,
        "has_mlx": False,
    }
    accepts = inspect.signature(variants._resolve_variant_for_system).parameters
    accepted, trace = variants._resolve_variant_for_system(**{k: v for k, v in facts.items() if k in accepts})
    theirs_rejected = {d.variant.variant_str: d.reason for d in trace if isinstance(d, variants.VariantRejected)}

    ours = resolve_build_variants(GRID, torch, cuda, system)
    assert ours.accepted == tuple(v.variant_str for v in accepted)
    ours_rejected = dict(ours.rejected)
    assert {n: r for n, r in ours_rejected.items() if n not in unparsed} == theirs_rejected
    assert {n for n, r in ours_rejected.items() if "not a build variant name" in r} == unparsed
    assert ours.accepted, "the grid should accept something on every system"
