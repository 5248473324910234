"""Installed packages and Hub-kernel availability, read without importing torch.

FlashAttention variants are told apart by *distribution* name, as transformers does
(`FLASH_ATTENTION_COMPATIBILITY_MATRIX`): `flash-attn` is FA2 (module `flash_attn`),
`flash-attn-3` is FA3 (module `flash_attn_interface`), `flash-attn-4` is FA4 (module
`flash_attn` too). FA2 wheels ship a `flash_attn/cute` folder, so probing modules is wrong.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from ..facts.machine import Hub, HubKernel, Software
from ..upstream import FLASH_DISTRIBUTIONS, FLASH_OPTIONS, hub_kernel_version

__all__ = [
    "check_hub_reachable",
    "find_cached_kernel",
    "flash_provided",
    "hub_cache_dir",
    "probe_hub",
    "probe_software",
]

PACKAGES = (
    "torch",
    "transformers",
    "accelerate",
    "huggingface_hub",
    "peft",
    "bitsandbytes",
    "kernels",
    "nvidia-ml-py",
    *(dist for dist, _ in FLASH_DISTRIBUTIONS.values()),
)

_TRUE = {"1", "true", "yes", "on"}


def _normalise(dist: str) -> str:
    return re.sub(r"[-_.]+", "_", dist).lower()


def installed_versions(paths: Sequence[str] | None = None) -> dict[str, str | None]:
    """{normalised distribution name: version} from the `<name>-<version>.dist-info` (and egg-info)
    folder names on `paths` (default sys.path), the first found winning as in importlib.metadata;
    None where the name carries no version. Reading folder names takes about a millisecond;
    importlib.metadata parses each METADATA file as an e-mail (~4 ms a package, plus ~30 ms to
    import), which alone would double detect()."""
    found: dict[str, str | None] = {}
    for entry in sys.path if paths is None else paths:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for name in names:
            stem, dot, suffix = name.rpartition(".")
            if dot and suffix in ("dist-info", "egg-info"):
                dist, _, rest = stem.partition("-")
                found.setdefault(_normalise(dist), rest.partition("-")[0] or None)
    return found


def _dist_version(dist: str, installed: Mapping[str, str | None]) -> str | None:
    key = _normalise(dist)
    if key not in installed:
        return None
    version = installed[key]
    if version is not None:
        return version
    # A develop-mode egg-info folder has no version in its name: read its metadata.
    import importlib.metadata as metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def flash_provided(
    dist: str, module: str, providers: Mapping[str, list[str]], importable: Callable[[str], bool]
) -> bool:
    """Is FlashAttention distribution `dist` really what provides `module`?

    `providers` is importlib.metadata.packages_distributions() (module -> distributions).
    FA2 and FA4 both ship a top-level `flash_attn`, so the distribution name decides.
    """
    if not importable(module):
        return False
    names = {name.lower().replace("_", "-") for name in providers.get(module, [])}
    return dist in names


def _importable(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _module_source(package: str, *relative: str) -> str | None:
    """The text of a file inside an installed package, found without importing the package
    (`find_spec` of a top-level name runs nothing)."""
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        return None
    try:
        return Path(spec.origin).parent.joinpath(*relative).read_text()
    except OSError:
        return None


def _torch_cuda_version() -> str | None:
    """torch's CUDA build, read from torch/version.py so that torch is not imported."""
    text = _module_source("torch", "version.py")
    match = re.search(r"^cuda(?:\s*:\s*[^=]+)?\s*=\s*['\"]([^'\"]+)['\"]", text or "", re.MULTILINE)
    return match.group(1) if match else None


def _transformers_kernels_range() -> tuple[str, str] | None:
    """The `kernels` versions transformers accepts (it ignores others silently): the
    KERNELS_MIN/MAX_VERSION assignments in transformers/utils/import_utils.py, read as text
    because importing transformers costs about a second (a test holds this against the import)."""
    text = _module_source("transformers", "utils", "import_utils.py") or ""
    found = [
        re.search(rf"^{name}\s*(?::[^=]+)?=\s*['\"]([^'\"]+)['\"]", text, re.MULTILINE)
        for name in ("KERNELS_MIN_VERSION", "KERNELS_MAX_VERSION")
    ]
    low, high = (m.group(1) if m else None for m in found)
    return (low, high) if low and high else None


def probe_software(driver: str | None = None) -> Software:
    packages = []
    # Scanning every installed distribution costs ~0.4 s: only done when a FlashAttention
    # distribution is installed and its module has to be attributed.
    providers: Mapping[str, list[str]] | None = None
    installed = installed_versions()
    for dist in PACKAGES:
        version = _dist_version(dist, installed)
        if version is None:
            continue
        flash_module = next((m for d, m in FLASH_DISTRIBUTIONS.values() if d == dist), None)
        if flash_module is not None:
            if providers is None:
                import importlib.metadata as metadata

                providers = metadata.packages_distributions()
            if not flash_provided(dist, flash_module, providers, _importable):
                continue
        packages.append((dist, version.split("+")[0]))
    return Software(
        packages=tuple(sorted(packages)),
        torch_cuda=_torch_cuda_version(),
        driver=driver,
        kernels_range=_transformers_kernels_range(),
    )


def hub_cache_dir(env: Mapping[str, str]) -> Path:
    """Where `kernels` caches Hub kernels (KERNELS_CACHE, else the Hugging Face hub cache)."""
    if env.get("KERNELS_CACHE"):
        return Path(env["KERNELS_CACHE"])
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"])
    home = env.get("HF_HOME") or os.path.join(
        env.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "huggingface"
    )
    return Path(home) / "hub"


def _local_overrides(env: Mapping[str, str]) -> dict[str, str]:
    """LOCAL_KERNELS=repo=path:repo=path, which `kernels` uses instead of the Hub."""
    overrides = {}
    for entry in (env.get("LOCAL_KERNELS") or "").split(":"):
        repo, sep, path = entry.partition("=")
        if sep and repo and path:
            overrides[repo] = path
    return overrides


def find_cached_kernel(
    cache: Path, repo: str, version: int | None, torch_version: str | None, torch_cuda: str | None
) -> HubKernel:
    """Is a build of `repo` (branch v{version}) for this torch and CUDA in the local cache?

    A cached snapshot is not enough: a variant built for another torch
    ("Torch version (2.12) does not match environment Torch version (2.13)") won't load.
    """
    folder = cache / ("kernels--" + repo.replace("/", "--"))
    if not folder.is_dir():
        return HubKernel(repo, version, None, "not in the local cache")
    ref = folder / "refs" / (f"v{version}" if version is not None else "main")
    try:
        snapshot = folder / "snapshots" / ref.read_text().strip()
    except OSError:
        return HubKernel(repo, version, None, f"cached, but not version {ref.name}")
    builds = sorted(p.name for p in (snapshot / "build").glob("*") if p.is_dir())
    if not builds:
        return HubKernel(repo, version, None, "cached snapshot has no build/ variants")
    if torch_version is None or torch_cuda is None:
        return HubKernel(repo, version, None, "cached, but this torch has no CUDA build to match a variant")
    major, minor = torch_version.split(".")[:2]
    cuda_major = torch_cuda.split(".")[0]
    wanted_torch = f"torch{major}{minor}"
    arch = f"{platform.machine()}-linux"
    for build in builds:
        parts = build.split("-")
        if parts[0] == wanted_torch and any(p.startswith(f"cu{cuda_major}") for p in parts) and build.endswith(arch):
            return HubKernel(repo, version, build, f"cached variant {build}")
    return HubKernel(
        repo,
        version,
        None,
        f"cached, but no variant for {wanted_torch} + CUDA {torch_cuda} on {arch} (has: {', '.join(builds)})",
    )


def probe_hub(env: Mapping[str, str], software: Software) -> Hub:
    offline = (env.get("HF_HUB_OFFLINE") or env.get("TRANSFORMERS_OFFLINE") or "").lower() in _TRUE
    cache = hub_cache_dir(env)
    overrides = _local_overrides(env)
    torch_version = software.version("torch")
    kernels = []
    for repo in sorted(o.hub_repo for o in FLASH_OPTIONS.values()):
        version = hub_kernel_version(repo, torch_version, software.version("transformers"))
        if repo in overrides:
            kernels.append(HubKernel(repo, version, f"local:{overrides[repo]}", "LOCAL_KERNELS override"))
        else:
            kernels.append(find_cached_kernel(cache, repo, version, torch_version, software.torch_cuda))
    return Hub(offline=offline, kernels=tuple(kernels))


def check_hub_reachable(
    repo: str, *, offline: bool, timeout: float = 5.0, endpoint: str | None = None
) -> tuple[bool, str]:
    """Can `repo` (a Hub kernel repository) be fetched right now? One metadata request, bounded
    by `timeout`. Only `cudaload doctor --check-hub` calls this: detection itself never touches
    the network."""
    if offline:
        return False, "HF_HUB_OFFLINE is set: nothing is fetched"
    from huggingface_hub import HfApi

    try:
        info = HfApi(endpoint=endpoint).repo_info(repo, repo_type="kernel", timeout=timeout)
    except Exception as exc:  # any failure means "cannot fetch now"; say which
        lines = str(exc).strip().splitlines()
        return False, f"{type(exc).__name__}: {lines[0] if lines else ''}"
    return True, f"reachable (revision {str(getattr(info, 'sha', '') or '')[:12] or 'unknown'})"
