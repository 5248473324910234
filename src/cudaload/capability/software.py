"""Installed packages and Hub-kernel availability, read without importing torch.

FlashAttention variants are told apart by *distribution* name, as transformers does
(`FLASH_ATTENTION_COMPATIBILITY_MATRIX`): `flash-attn` is FA2 (module `flash_attn`),
`flash-attn-3` is FA3 (module `flash_attn_interface`), `flash-attn-4` is FA4 (module
`flash_attn` too). FA2 wheels ship a `flash_attn/cute` folder, so probing modules is wrong.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from packaging.version import InvalidVersion

from ..facts.machine import Hub, HubKernel, Software
from ..facts.packages import detected_packages
from ..installed import dist_version as _dist_version
from ..installed import installed_versions
from ..upstream_flash import FLASH_DISTRIBUTIONS, FLASH_OPTIONS
from ..upstream_kernels import hub_kernel_version
from .cache import unreadable
from .module_constants import torch_builds, transformers_kernels_range
from .native_libraries import bitsandbytes_builds, torchao_extensions
from .xpu_mps import torch_mps_built

if TYPE_CHECKING:  # the build variants' rules: imported where a kernel is cached or overridden (most machines: none)
    from .kernel_variants import BuildSystem

__all__ = [
    "find_cached_kernel",
    "find_local_kernel",
    "flash_provided",
    "hub_cache_dir",
    "hub_offline",
    "parse_local_kernels",
    "probe_hub",
    "probe_software",
]


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


def torch_hip_version() -> str | None:
    """torch's ROCm (HIP) build (`torch.version.hip`), without importing torch (module_constants.py)."""
    return torch_builds().hip


def probe_software(driver: str | None = None) -> Software:
    packages = []
    # Scanning every installed distribution costs ~0.4 s: only done when a FlashAttention
    # distribution is installed and its module has to be attributed.
    providers: Mapping[str, list[str]] | None = None
    installed = installed_versions()
    for dist in detected_packages():
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
    builds = torch_builds()  # torch/version.py read once for the three, when torch is not imported
    return Software(
        packages=tuple(sorted(packages)),
        torch_cuda=builds.cuda,
        torch_hip=builds.hip,
        torch_xpu=builds.xpu,
        torch_mps=torch_mps_built(),
        driver=driver,
        kernels_range=transformers_kernels_range(),
        bitsandbytes_builds=bitsandbytes_builds() if any(name == "bitsandbytes" for name, _ in packages) else None,
        torchao_extensions=torchao_extensions() if any(name == "torchao" for name, _ in packages) else None,
    )


# --- the Hub cache and offline mode -------------------------------------------------------------
#
# huggingface_hub.constants reads os.environ once, when it is imported (HF_HOME, HF_HUB_CACHE and
# HF_HUB_OFFLINE are module constants), and importing it would put huggingface_hub in detect()'s
# path (tests/test_overhead.py holds detect() to no huggingface_hub). So the derivation is replicated
# here from the env passed in; tests/test_hub_variants.py holds it against the real constants.

_HF_TRUE = frozenset({"1", "ON", "YES", "TRUE"})
"""huggingface_hub.constants.ENV_VARS_TRUE_VALUES (its `_is_true` upper-cases the value)."""


def _expand(path: str, env: Mapping[str, str]) -> str:
    """os.path.expandvars(os.path.expanduser(path)) with HOME and the variables read from `env`
    (posixpath's rules: `~` or `~/...` only, `$name` / `${name}`, unknown variables left as they are)."""
    if path == "~" or path.startswith("~/"):
        home = env.get("HOME")
        path = os.path.expanduser(path) if home is None else (home.rstrip("/") + path[1:]) or "/"
    elif path.startswith("~"):
        path = os.path.expanduser(path)  # ~user: the password database, as posixpath does
    if "$" not in path:
        return path
    return re.sub(
        r"\$(\w+|\{[^}]*\})",
        lambda m: env.get(m.group(1).strip("{}"), m.group(0)),
        path,
        flags=re.ASCII,
    )


def hub_offline(env: Mapping[str, str]) -> bool:
    """HF_HUB_OFFLINE, else TRANSFORMERS_OFFLINE, as huggingface_hub.constants.HF_HUB_OFFLINE reads
    them (`_is_true(HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE)`: a set-but-false HF_HUB_OFFLINE wins)."""
    return (env.get("HF_HUB_OFFLINE") or env.get("TRANSFORMERS_OFFLINE") or "").upper() in _HF_TRUE


def hub_cache_dir(env: Mapping[str, str]) -> Path:
    """Where `kernels` caches Hub kernels: KERNELS_CACHE (kernels `_versions.py`), else
    huggingface_hub.constants.HF_HUB_CACHE derived from `env` as huggingface_hub derives it:
    HF_HUB_CACHE, else the legacy HUGGINGFACE_HUB_CACHE, else `$HF_HOME/hub`, HF_HOME defaulting to
    `$XDG_CACHE_HOME/huggingface`, XDG_CACHE_HOME to `~/.cache`; `~` and `$VAR` expanded."""
    if env.get("KERNELS_CACHE"):
        return Path(env["KERNELS_CACHE"])
    hf_home = _expand(
        env.get(
            "HF_HOME", os.path.join(env.get("XDG_CACHE_HOME", os.path.join(_expand("~", env), ".cache")), "huggingface")
        ),
        env,
    )
    legacy = env.get("HUGGINGFACE_HUB_CACHE", os.path.join(hf_home, "hub"))
    return Path(_expand(env.get("HF_HUB_CACHE", legacy), env))


def parse_local_kernels(env: Mapping[str, str]) -> tuple[dict[str, Path], str | None]:
    """LOCAL_KERNELS=repo=path:repo=path, which `kernels` resolves before the Hub or its cache.

    Follows kernels `load.py` `_parse_local_kernel_overrides` (0.17.2; `_internals/load.py` in
    0.19.1, unchanged): split on ":", each entry split on its first "=", a later entry for the same
    repo wins. An entry without "=" (an empty LOCAL_KERNELS too: kernels tests `is None`) makes
    kernels raise ValueError on every `get_kernel`, so instead of dropping it this returns
    ({}, the error) and every Hub kernel is reported unusable.
    """
    text = env.get("LOCAL_KERNELS")
    if text is None:
        return {}, None
    overrides: dict[str, Path] = {}
    for entry in text.split(":"):
        if "=" not in entry:
            return {}, (
                f"LOCAL_KERNELS entry {entry!r} has no '=' (expected repo_id_1=path_1:repo_id_2=path_2): "
                "kernels raises ValueError before it loads any Hub kernel"
            )
        repo, path = entry.split("=", 1)
        overrides[repo] = Path(path)
    return overrides, None


def _missing_from_snapshot(folder: Path, commit: str, snapshot: Path) -> list[str]:
    """Files huggingface_hub's cached tree listing (`<repo folder>/trees/<commit>.json`, written by
    a download) names that the snapshot lacks, bytecode excepted (kernels' ignore patterns)."""
    try:
        listing = json.loads((folder / "trees" / f"{commit}.json").read_text(encoding="utf-8"))
        files = list(listing["files"])
    except (OSError, ValueError, KeyError, TypeError):
        return []
    return [
        f
        for f in files
        if isinstance(f, str) and not f.endswith(".pyc") and "__pycache__/" not in f and not (snapshot / f).exists()
    ]


def find_cached_kernel(
    cache: Path,
    repo: str,
    version: int | None,
    torch_version: str | None,
    torch_cuda: str | None,
    system: BuildSystem | None = None,
    *,
    offline: bool = True,
    kernels_version: str | None = None,
) -> HubKernel:
    """Would `kernels` load a cached build of `repo` (branch v{version}) for this torch and CUDA?

    Follows kernels' cache path (`HubCacheResolver`: `refs/v<N>` in `kernels--<org>--<repo>`, that
    snapshot's `build/`, then `resolve_build_variants`). A cached snapshot is not enough: a variant
    built for another torch, or for a newer CUDA minor than torch's, won't load. `system` defaults to
    this process (`BuildSystem.current`, with `kernels_version`: the kernels installed, None for the newest's
    rules), read only when a snapshot has variants to choose among. kernels before 0.19 also cannot load
    offline a snapshot that huggingface_hub's tree listing shows incomplete (every download of one variant
    is: its `snapshot_download(local_files_only=True)` raises IncompleteSnapshotError, which kernels 0.17
    turns into "Cannot find a local snapshot"; 0.19 reads the folder anyway): with `offline` that counts as
    not cached, online kernels downloads the variant again and it does.
    """
    folder = cache / ("kernels--" + repo.replace("/", "--"))
    if not folder.is_dir():
        return HubKernel(repo, version, None, "not in the local cache")
    ref = folder / "refs" / (f"v{version}" if version is not None else "main")
    try:
        commit = ref.read_text(encoding="utf-8").strip()
    except OSError:
        have = sorted(p.name for p in (folder / "refs").glob("v*") if p.is_file())
        return HubKernel(
            repo, version, None, f"cached, but not version {ref.name} (cached: {', '.join(have) or 'none'})"
        )
    snapshot = folder / "snapshots" / commit
    if not snapshot.is_dir():
        return HubKernel(
            repo, version, None, f"cached ref {ref.name} points at snapshot {commit[:12]}, which is not cached"
        )
    builds = [p.name for p in (snapshot / "build").glob("*") if p.is_dir()]
    if not builds:
        return HubKernel(repo, version, None, "cached snapshot has no build/ variants")
    if torch_version is None:
        return HubKernel(repo, version, None, "cached, but torch is not installed: no Hub kernel loads")
    from .kernel_variants import BuildSystem, describe_rejections, describe_system, resolve_build_variants

    if system is None:
        system = BuildSystem.current(torch_version, kernels_version)
    try:
        resolution = resolve_build_variants(builds, torch_version, torch_cuda, system)
    except InvalidVersion:
        return HubKernel(repo, version, None, f"cached, but torch's CUDA version {torch_cuda!r} cannot be read")
    best = resolution.best
    if best is None:
        return HubKernel(
            repo,
            version,
            None,
            f"cached, but no variant for {describe_system(torch_version, torch_cuda, system)} that kernels "
            f"{system.kernels or '(newest)'} would load ({describe_rejections(resolution)})",
        )
    missing = [] if system.new_rules else _missing_from_snapshot(folder, commit, snapshot)
    if missing:
        why = (
            f"kernels {system.kernels} cannot load snapshot {commit[:12]} offline: huggingface_hub's tree listing "
            f"shows it incomplete ({len(missing)} files missing, e.g. {missing[0]}); kernels 0.19 can"
        )
        if offline:
            return HubKernel(repo, version, None, f"cached variant {best}, but {why}")
        return HubKernel(repo, version, best, f"cached variant {best} (online only: {why})", commit)
    return HubKernel(repo, version, best, f"cached variant {best}", commit)


def find_local_kernel(
    repo: str,
    path: Path,
    version: int | None,
    torch_version: str | None,
    torch_cuda: str | None,
    system: BuildSystem,
) -> HubKernel:
    """What `kernels` loads for a LOCAL_KERNELS override of `repo` (kernels `resolver.py`
    `resolve_local_kernel`): the best variant among `path`'s folders, else among `path/build`'s,
    else `path` itself when it holds a metadata.json. None of those: kernels raises
    FileNotFoundError and does not fall back to the cache or the Hub."""
    from .kernel_variants import VariantResolution, describe_rejections, describe_system, resolve_build_variants

    resolution = VariantResolution((), ())
    if torch_version is not None:
        for base in (path, path / "build"):
            try:
                names = [p.name for p in base.iterdir() if p.is_dir()]
            except OSError:
                names = []
            try:
                resolution = resolve_build_variants(names, torch_version, torch_cuda, system)
            except InvalidVersion:
                break
            if resolution.best is not None:
                return HubKernel(
                    repo,
                    version,
                    f"local:{base / resolution.best}",
                    f"LOCAL_KERNELS override: variant {resolution.best} in {base}",
                )
    if (path / "metadata.json").exists():
        return HubKernel(repo, version, f"local:{path}", f"LOCAL_KERNELS override: {path} (a build variant itself)")
    return HubKernel(
        repo,
        version,
        None,
        f"LOCAL_KERNELS names {path}, which has no build variant for "
        f"{describe_system(torch_version, torch_cuda, system)} ({describe_rejections(resolution)}): kernels raises "
        "FileNotFoundError instead of using the cache or the Hub",
    )


def probe_hub(env: Mapping[str, str], software: Software, system: BuildSystem | None = None) -> Hub:
    """Offline mode and, per Hub attention kernel, whether `kernels` would load it here: a
    LOCAL_KERNELS override first (as kernels resolves), else the branch transformers asks for in
    the cache. `system` defaults to this process."""
    offline = hub_offline(env)
    cache = hub_cache_dir(env)
    overrides, malformed = parse_local_kernels(env)
    torch_version = software.version("torch")
    kernels_version, cuda = software.version("kernels"), software.torch_cuda
    kernels = []
    for repo in sorted(o.hub_repo for o in FLASH_OPTIONS.values()):
        version = hub_kernel_version(repo, torch_version, software.version("transformers"))
        if malformed is not None:
            kernels.append(HubKernel(repo, version, None, malformed))
            continue
        try:
            if repo in overrides:
                if system is None:
                    from .kernel_variants import BuildSystem

                    system = BuildSystem.current(torch_version, kernels_version)
                found = find_local_kernel(repo, overrides[repo], version, torch_version, cuda, system)
            else:
                found = find_cached_kernel(
                    cache, repo, version, torch_version, cuda, system, offline=offline, kernels_version=kernels_version
                )
        except OSError as exc:  # another user's 0700 folder, a name over 255 bytes: detection goes on
            folder = overrides.get(repo, cache)
            unreadable(folder, exc)
            found = HubKernel(
                repo, version, None, f"{folder} cannot be read ({exc.strerror or exc}): taken as not cached"
            )
        kernels.append(found)
    return Hub(offline=offline, kernels=tuple(kernels), layer_kernels_disabled=layer_kernels_disabled(env))


def layer_kernels_disabled(env: Mapping[str, str]) -> str | None:
    """ "USE_HUB_KERNELS=<value>" when it turns Hub layer kernels off, as transformers reads it (5.25
    integrations/hub_kernels.py `_kernels_enabled`: `is_env_variable_true("USE_HUB_KERNELS", default="YES")`,
    true for 1/true/y/yes/on after `.lower()`, nothing stripped: " yes " is false; 5.22 reads 1/on/yes/true);
    None when unset or true."""
    value = env.get("USE_HUB_KERNELS")
    if value is None or value.lower() in ("1", "true", "y", "yes", "on"):
        return None
    return f"USE_HUB_KERNELS={value}"
