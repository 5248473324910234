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
import platform
import re
import sys
import sysconfig
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version

from ..facts.machine import Hub, HubKernel, Software
from ..upstream import FLASH_DISTRIBUTIONS, FLASH_OPTIONS, hub_kernel_version

__all__ = [
    "BuildSystem",
    "VariantResolution",
    "check_hub_reachable",
    "find_cached_kernel",
    "find_local_kernel",
    "flash_provided",
    "hub_cache_dir",
    "hub_offline",
    "parse_local_kernels",
    "probe_hub",
    "probe_software",
    "resolve_build_variants",
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


# --- build variants: kernels' resolution rule, as a pure function ----------------------------------
#
# kernels resolves a repository's build/<variant> folders in `variants.py` (0.17.2;
# `_internals/variants.py` in 0.19.1): `parse_variant` names the parts, `_check_variants` accepts
# or rejects each against the system, `_sort_variants` orders the accepted ones. Its entry point
# `resolve_variants` reads the system from the running process (torch imported, the CUDA backend
# from `torch.version.cuda`), and the fact-taking `_resolve_variant_for_system` is private, moved
# between 0.17 and 0.19 and changed signature; importing kernels also costs ~0.5 s and imports
# huggingface_hub, which detect() must not. So the rule is followed here, for both releases, and
# tests/test_hub_variants.py holds it against the installed kernels' own functions.

_NEW_VARIANT_RULES = (0, 19)
"""kernels 0.19 added `torch-2.10-cuda-12.8-cpython-3.12-abi3-x86_64-linux` names, the Python ABI
check, SDK variants and MLX noarch; earlier releases parse only the legacy `torch210-cxx11-cu128-...`."""

_PYTHON_MARKER = "cpython"
_LEGACY_PYTHON = Version("3.9")
_ABI3T_MIN_PYTHON = Version("3.15")


@dataclass(frozen=True)
class BuildSystem:
    """What `kernels` matches a build variant against, besides torch and its CUDA build.

    Attributes:
        cpu: `platform.machine()` as kernels names it ("x86_64", "aarch64"; arm64 and AMD64 mapped).
        os: `platform.system().lower()` ("linux").
        cxx11_abi: `torch.compiled_with_cxx11_abi()` on Linux, None elsewhere (kernels' rule).
        python: The interpreter's (major, minor).
        free_threaded: A free-threaded (no-GIL) interpreter.
        mlx: MLX is importable (kernels 0.19 rejects MLX noarch variants without it).
        tvm_ffi: The installed tvm-ffi version; None: not installed.
        kernels: The installed kernels version, which picks the rule set (None: the newest).
    """

    cpu: str
    os: str = "linux"
    cxx11_abi: bool | None = True
    python: tuple[int, int] = (3, 11)
    free_threaded: bool = False
    mlx: bool = False
    tvm_ffi: str | None = None
    kernels: str | None = None

    @classmethod
    def current(cls, torch_version: str | None = None, kernels_version: str | None = None) -> BuildSystem:
        """This process, read as kernels `resolve_variants` reads it, without importing torch:
        the C++11 ABI is asked of torch only when torch is already imported; otherwise it is True on
        Linux for torch >= 2.7 (C++11 ABI by default from 2.7, pytorch/pytorch#143962) and on aarch64,
        False for an older x86_64 torch (its PyPI wheels used the pre-C++11 ABI). tvm-ffi is not
        looked for (kernels imports it for its version): tvm-ffi builds count as not loadable."""
        cpu = platform.machine()
        os_name = platform.system().lower()
        if os_name == "darwin":
            cpu = "aarch64" if cpu == "arm64" else cpu
        elif os_name == "windows":
            cpu = "x86_64" if cpu == "AMD64" else cpu
        cxx11: bool | None = None
        if os_name == "linux":
            torch = sys.modules.get("torch")
            if torch is not None and hasattr(torch, "compiled_with_cxx11_abi"):
                cxx11 = bool(torch.compiled_with_cxx11_abi())
            else:
                cxx11 = cpu == "aarch64" or _release(torch_version)[:2] >= (2, 7)
        return cls(
            cpu=cpu,
            os=os_name,
            cxx11_abi=cxx11,
            python=(sys.version_info.major, sys.version_info.minor),
            free_threaded=bool(sysconfig.get_config_var("Py_GIL_DISABLED")),
            mlx=importlib.util.find_spec("mlx") is not None,
            kernels=kernels_version,
        )

    @property
    def new_rules(self) -> bool:
        return self.kernels is None or _release(self.kernels)[:2] >= _NEW_VARIANT_RULES


def _release(version: str | None) -> tuple[int, ...]:
    """The numeric release of a version ("2.13.0+cpu" -> (2, 13, 0)); () when there is none."""
    if version is None:
        return ()
    try:
        return Version(version).release
    except InvalidVersion:
        return ()


@dataclass(frozen=True)
class _Backend:
    name: str
    """"cuda", "cpu", "rocm", ...; for a noarch (or `sdk-<backend>`) variant the name as written."""
    version: Version | None = None
    legacy: bool = True
    noarch: bool = False

    @property
    def variant_str(self) -> str:
        if self.version is None:
            return self.name
        if self.legacy:
            prefix = "cu" if self.name == "cuda" else self.name
            return f"{prefix}{self.version.major}{self.version.minor}"
        return f"{self.name}-{self.version.major}.{self.version.minor}"


@dataclass(frozen=True)
class _Variant:
    kind: str  # "arch", "noarch" or "sdk"
    framework: str = ""  # "torch", "torch-stable-abi", "tvm-ffi", "torch-noarch", "mlx-noarch", "sdk"
    version: Version | None = None  # the framework's
    cxx11_abi: bool | None = None
    backend: _Backend | None = None
    python: tuple[Version, str] | None = (_LEGACY_PYTHON, "abi3")
    system: tuple[str, str] | None = None  # (cpu, os)


_VERSIONED = {"cuda": "cu", "rocm": "rocm", "xpu": "xpu", "cann": "cann"}
_UNVERSIONED = ("cpu", "metal", "neuron", "tpu")


def _two_part_version(pattern: str, text: str) -> Version | None:
    match = re.fullmatch(pattern, text)
    return Version(f"{match.group(1)}.{match.group(2)}") if match else None


def _parse_backend(parts: list[str], legacy: bool) -> _Backend:
    """kernels `backends.parse_backend`: legacy `cu128` / `cpu` (one part), new `cuda`, `12.8`."""
    if legacy:
        if len(parts) != 1:
            raise ValueError(f"Invalid backend variant parts, expected a single part, got: {parts!r}")
        name = parts[0]
        if name in _UNVERSIONED:
            return _Backend(name)
        for backend, prefix in _VERSIONED.items():
            if name.startswith(prefix):
                version = _two_part_version(rf"{prefix}(\d+)(\d+)", name)
                if version is None:
                    raise ValueError(f"Invalid {backend} variant parts: {parts!r}")
                return _Backend(backend, version)
        raise ValueError(f"Unknown backend variant parts: {parts!r}")
    name = parts[0] if parts else ""
    if name in _UNVERSIONED:
        if parts != [name]:
            raise ValueError(f"Invalid {name} variant parts: {parts!r}")
        return _Backend(name)
    if name in _VERSIONED:
        version = _two_part_version(r"(\d+)\.(\d+)", parts[1]) if len(parts) == 2 else None
        if version is None:
            raise ValueError(f"Invalid {name} variant parts: {parts!r}")
        return _Backend(name, version, legacy=False)
    raise ValueError(f"Unknown backend variant parts: {parts!r}")


def _parse_python(parts: list[str]) -> tuple[Version, str]:
    """kernels 0.19 `Python.parse`: `cpython`, `3.12`, `abi3` | `abi3t` (abi3t needs 3.15+)."""
    if len(parts) != 3 or parts[0] != _PYTHON_MARKER:
        raise ValueError(f"Invalid Python variant parts, expected `cpython-[version]-[abi]`, got: {parts!r}")
    version = _two_part_version(r"(\d+)\.(\d+)", parts[1])
    if version is None or parts[2] not in ("abi3", "abi3t"):
        raise ValueError(f"Invalid Python version or ABI in variant parts: {parts!r}")
    if parts[2] == "abi3t" and version < _ABI3T_MIN_PYTHON:
        raise ValueError(f"abi3t requires Python {_ABI3T_MIN_PYTHON} or later, not {version}")
    return version, parts[2]


def _split_python(parts: list[str]) -> tuple[list[str], tuple[Version, str] | None]:
    if _PYTHON_MARKER not in parts:
        return parts, None
    i = parts.index(_PYTHON_MARKER)
    return parts[:i], _parse_python(parts[i:])


_LEGACY_TORCH = r"torch(\d)(\d+)(?:-(cxx11|cxx98))?"
"""kernels `Torch` (legacy): `torch210`, `torch210-cxx11`; 0.19 also `torch-2.10[-cxx11]`."""


def _torch_framework(pattern: str, text: str) -> tuple[Version | None, bool | None]:
    """(torch minor, C++11 ABI tag: None untagged, False for cxx98) of a torch framework part."""
    match = re.fullmatch(pattern, text)
    if not match:
        return None, None
    return Version(f"{match.group(1)}.{match.group(2)}"), None if match.group(3) is None else match.group(3) != "cxx98"


def _parse_variant(name: str, new_rules: bool) -> _Variant:
    """kernels `variants.parse_variant` (0.17.2 when not `new_rules`, else 0.19.1); ValueError for a
    name kernels does not parse (its `get_variants_local` skips those)."""
    parts = name.split("-")
    if not new_rules:
        # 0.17.2: the framework, then exactly backend, cpu, os (`Arch.parse`).
        if name.startswith("torch-stable-abi"):
            version = _two_part_version(r"torch-stable-abi(\d)(\d+)", "-".join(parts[:3]))
            framework, rest = "torch-stable-abi", parts[3:]
            cxx11 = None
        elif parts[0] == "torch":
            return _Variant("noarch", "torch-noarch", backend=_Backend("-".join(parts[1:]), noarch=True))
        elif parts[0].startswith("torch"):
            n = 2 if len(parts) >= 2 and parts[1] in ("cxx11", "cxx98") else 1
            version, cxx11 = _torch_framework(_LEGACY_TORCH, "-".join(parts[:n]))
            framework, rest = "torch", parts[n:]
        elif parts[0] == "tvm" and len(parts) >= 2 and parts[1].startswith("ffi"):
            version = _two_part_version(r"tvm-ffi(\d+?)(\d+)", f"tvm-{parts[1]}")
            framework, rest, cxx11 = "tvm-ffi", parts[2:], None
        else:
            raise ValueError(f"Unknown framework in variant string: {name!r}")
        if version is None:
            raise ValueError(f"Invalid {framework} variant string: {name!r}")
        if len(rest) != 3:
            raise ValueError(f"Invalid arch variant parts: {rest!r}")
        return _Variant("arch", framework, version, cxx11, _parse_backend(rest[:1], True), system=(rest[1], rest[2]))

    # 0.19.1
    if parts[0] == "sdk":
        return _parse_sdk(name, parts[1:])
    if name.startswith("torch-stable-abi"):
        legacy = not (len(parts) > 3 and parts[2] == "abi")
        n = 3 if legacy else 4
        pattern = r"torch-stable-abi(\d)(\d+)" if legacy else r"torch-stable-abi-(\d+)\.(\d+)"
        version = _two_part_version(pattern, "-".join(parts[:n]))
        framework, cxx11 = "torch-stable-abi", None
    elif parts[0] == "torch" and len(parts) >= 2 and parts[1][:1].isdigit():
        legacy = False
        n = 3 if len(parts) >= 3 and parts[2] in ("cxx11", "cxx98") else 2
        version, cxx11 = _torch_framework(r"torch-(\d+)\.(\d+)(?:-(cxx11|cxx98))?", "-".join(parts[:n]))
        framework = "torch"
    elif parts[0] == "torch":
        return _Variant("noarch", "torch-noarch", backend=_Backend("-".join(parts[1:]), noarch=True))
    elif parts[0] == "mlx" and len(parts) >= 2 and not parts[1][:1].isdigit():
        return _Variant("noarch", "mlx-noarch", backend=_Backend("-".join(parts[1:]), noarch=True))
    elif parts[0].startswith("torch"):
        legacy = True
        n = 2 if len(parts) >= 2 and parts[1] in ("cxx11", "cxx98") else 1
        version, cxx11 = _torch_framework(_LEGACY_TORCH, "-".join(parts[:n]))
        framework = "torch"
    elif parts[0] == "tvm" and len(parts) >= 2 and parts[1].startswith("ffi"):
        legacy = not (len(parts) > 2 and parts[1] == "ffi")
        n = 2 if legacy else 3
        pattern = r"tvm-ffi(\d+?)(\d+)" if legacy else r"tvm-ffi-(\d+)\.(\d+)"
        version = _two_part_version(pattern, "-".join(parts[:n]))
        framework, cxx11 = "tvm-ffi", None
    else:
        raise ValueError(f"Unknown framework in variant string: {name!r}")
    if version is None:
        raise ValueError(f"Invalid {framework} variant string: {name!r}")
    rest = parts[n:]
    if len(rest) < 2:
        raise ValueError(f"Invalid variant parts: {rest!r}")
    backend_parts, system = rest[:-2], (rest[-2], rest[-1])
    python: tuple[Version, str] | None = (_LEGACY_PYTHON, "abi3")
    if not legacy:
        backend_parts, python = _split_python(backend_parts)
    if python is None:
        raise ValueError(f"Missing Python version and ABI in variant string: {name!r}")
    if not backend_parts:
        raise ValueError(f"Missing backend in variant string: {name!r}")
    return _Variant("arch", framework, version, cxx11, _parse_backend(backend_parts, legacy), python, system)


def _parse_sdk(name: str, rest: list[str]) -> _Variant:
    """kernels 0.19 `parse_sdk_variant`: `sdk`, `sdk-<backend>`, `sdk[-<backend>]-cpython-...-<cpu>-<os>`."""
    if _PYTHON_MARKER in rest:
        if len(rest) < 2:
            raise ValueError(f"Invalid variant parts: {rest!r}")
        rest, system = rest[:-2], (rest[-2], rest[-1])
        rest, python = _split_python(rest)
        if python is None:  # `cpython` was the cpu or os part
            raise ValueError("SDK variants must define the Python version and ABI together with the system")
        return _Variant(
            "sdk", "sdk", backend=_parse_backend(rest, False) if rest else None, python=python, system=system
        )
    if len(rest) > 1:
        raise ValueError(f"Invalid SDK variant string: {name!r}")
    backend = _Backend(rest[0], noarch=True) if rest else None
    return _Variant("sdk", "sdk", backend=backend, python=None, system=None)


@dataclass(frozen=True)
class VariantResolution:
    """Which build variants `kernels` would load here, most preferred first, and why the others not.

    Attributes:
        accepted: The variants kernels accepts, in its order of preference (it loads the first).
        rejected: (variant, kernels' reason) for each other folder, including names kernels cannot
            parse (which it skips silently).
    """

    accepted: tuple[str, ...]
    rejected: tuple[tuple[str, str], ...]

    @property
    def best(self) -> str | None:
        return self.accepted[0] if self.accepted else None


def _python_mismatch(python: tuple[Version, str], system: BuildSystem) -> str | None:
    version, abi = python
    here = Version(f"{system.python[0]}.{system.python[1]}")
    if abi == "abi3" and system.free_threaded:
        return "abi3 is not supported on free-threaded Python, abi3t is required"
    if here < version:
        return f"Python {version} or later is required, system Python version is {here}"
    return None


def _system_mismatch(cpu_os: tuple[str, str], system: BuildSystem) -> str | None:
    if cpu_os[0] != system.cpu:
        return f"CPU ({cpu_os[0]}) does not match system CPU ({system.cpu})"
    if cpu_os[1] != system.os:
        return f"OS ({cpu_os[1]}) does not match system OS ({system.os})"
    return None


def _backend_mismatch(backend: _Backend, selected: _Backend) -> str | None:
    """Given a system CUDA x.y, only CUDA x.z with z <= y qualifies; otherwise the backend (and
    version) must match. kernels' ROCm and Metal branches need a ROCm or Metal system, which a
    `Software` (torch's CUDA build or none) never is."""
    if selected.name == "cuda" and backend.name == "cuda":
        assert selected.version is not None and backend.version is not None
        if backend.version.major != selected.version.major or backend.version.minor > selected.version.minor:
            return f"CUDA version ({backend.version}) is not compatible with system CUDA version ({selected.version})"
        return None
    if (backend.name, backend.version) != (selected.name, selected.version):
        return f"backend ({backend.variant_str}) does not match selected backend ({selected.variant_str})"
    return None


def _check(variant: _Variant, torch: Version | None, selected: _Backend, system: BuildSystem) -> str | None:
    """kernels `_check_variants` for one variant: None when accepted, else kernels' reason."""
    if variant.kind == "arch":
        assert variant.system is not None and variant.backend is not None and variant.python is not None
        if system.new_rules:
            reason = _python_mismatch(variant.python, system) or _system_mismatch(variant.system, system)
        elif system.python < (3, 15) and system.free_threaded:
            reason = "arch kernel not supported on free-threaded Python <3.15"
        else:
            reason = _system_mismatch(variant.system, system)
        if reason:
            return reason
        if variant.framework == "torch":
            if variant.version != torch:
                return f"Torch version ({variant.version}) does not match environment Torch version ({torch})"
            if variant.cxx11_abi is not None and variant.cxx11_abi != system.cxx11_abi:
                return (
                    f"Torch CXX11 ABI ({variant.cxx11_abi}) does not match environment Torch CXX11 ABI "
                    f"({system.cxx11_abi})"
                )
        elif variant.framework == "torch-stable-abi":
            assert variant.version is not None
            if torch is None or variant.version > torch:
                return (
                    f"Torch stable ABI version ({variant.version}) is too new for environment Torch version ({torch})"
                )
        elif variant.framework == "tvm-ffi":
            tvm = Version(".".join(str(p) for p in _release(system.tvm_ffi)[:2])) if system.tvm_ffi else None
            if variant.version != tvm:
                return f"tvm-ffi version ({variant.version}) does not match environment tvm-ffi version ({tvm})"
        return _backend_mismatch(variant.backend, selected)
    if variant.kind == "noarch":
        assert variant.backend is not None
        if variant.framework == "mlx-noarch" and not system.mlx:
            return "MLX is not installed in the environment"
        if variant.backend.name not in (selected.name, "universal"):
            return (
                f"backend ({variant.backend.name}) does not match system backend ({selected.name}) and is not universal"
            )
        return None
    reason = None  # an SDK variant (kernels 0.19)
    if variant.python is not None:
        reason = _python_mismatch(variant.python, system)
    if reason is None and variant.system is not None:
        reason = _system_mismatch(variant.system, system)
    if reason is None and variant.backend is not None:
        if variant.backend.noarch:
            if variant.backend.name != selected.name:
                reason = f"backend ({variant.backend.name}) does not match system backend ({selected.name})"
        else:
            reason = _backend_mismatch(variant.backend, selected)
    return reason


def _preference(variant: _Variant, new_rules: bool) -> tuple[int, ...]:
    """kernels `_sort_variants`' key, less the accepted-first element: stable-ABI builds (newest ABI
    first), then torch builds (untagged before C++-ABI-tagged), then tvm-ffi, each by highest
    backend minor; then (0.19) SDK builds; then noarch, `universal` last."""

    def backend_order(backend: _Backend | None) -> int:
        return -backend.version.minor if backend is not None and backend.version is not None else 0

    def python_order(python: tuple[Version, str] | None) -> tuple[int, int, int]:
        assert python is not None
        return (("abi3", "abi3t").index(python[1]), -python[0].major, -python[0].minor)

    if variant.kind == "arch":
        assert variant.version is not None
        if variant.framework == "torch-stable-abi":
            key: tuple[int, ...] = (0, -variant.version.major, -variant.version.minor)
        elif variant.framework == "torch":
            key = (1, 0, 1 if variant.cxx11_abi is not None else 0)
        else:
            key = (2, 0, 0)
        key += (backend_order(variant.backend),)
        return key + python_order(variant.python) if new_rules else key
    universal = 1 if variant.backend is not None and variant.backend.name == "universal" else 0
    if variant.kind == "noarch":
        return (4, 0, 0, universal, 0, 0) if new_rules else (2, 0, 0, universal)
    if variant.python is not None:
        order = 1 if variant.backend is None else backend_order(variant.backend)
        return (3, 0, 0, order, *python_order(variant.python))
    return (5 if variant.backend is not None else 6, 0, 0, 0, 0, 0, 0)


def resolve_build_variants(
    names: Iterable[str], torch_version: str | None, torch_cuda: str | None, system: BuildSystem
) -> VariantResolution:
    """Which of `names` (a kernel's build/ folders) `kernels` would load for this torch, CUDA build
    and system, most preferred first; each other name with kernels' reason.

    Follows kernels `variants.py` `parse_variant`, `_check_variants` and `_sort_variants` (0.17.2;
    `_internals/variants.py` in 0.19.1, picked by `system.kernels`), with the system backend kernels
    `backends._backend()` selects: CUDA `torch_cuda` for a CUDA torch, else CPU. The rules that
    matter most: the torch minor must match exactly (a `torch-stable-abi<x><y>` build needs torch >=
    x.y); a CUDA build needs the same CUDA major and a minor <= torch's (cu126 runs under CUDA 12.8,
    cu129 does not); a noarch `torch-cuda` / `torch-universal` build loads whatever the arch.
    """
    new_rules = system.new_rules
    torch_release = _release(torch_version)
    torch = Version(f"{torch_release[0]}.{torch_release[1]}") if len(torch_release) >= 2 else None
    selected = _Backend("cuda", Version(torch_cuda)) if torch_cuda else _Backend("cpu")
    decided: list[tuple[bool, tuple[int, ...], str, str]] = []
    skipped: list[tuple[str, str]] = []
    for name in sorted(set(names)):
        try:
            variant = _parse_variant(name, new_rules)
        except ValueError as exc:
            skipped.append((name, f"not a build variant name kernels parses ({exc}): skipped"))
            continue
        reason = _check(variant, torch, selected, system)
        decided.append((reason is None, _preference(variant, new_rules), name, reason or ""))
    decided.sort(key=lambda d: (not d[0], d[1]))
    return VariantResolution(
        accepted=tuple(name for ok, _, name, _ in decided if ok),
        rejected=tuple((name, reason) for ok, _, name, reason in decided if not ok) + tuple(skipped),
    )


def _system_words(torch_version: str | None, torch_cuda: str | None, system: BuildSystem) -> str:
    release = _release(torch_version)
    torch = f"torch{release[0]}{release[1]}" if len(release) >= 2 else "no torch"
    return f"{torch} + {'CUDA ' + torch_cuda if torch_cuda else 'CPU'} on {system.cpu}-{system.os}"


def _reasons(resolution: VariantResolution) -> str:
    return "; ".join(f"{name}: {reason}" for name, reason in resolution.rejected) or "no variant folders"


def _missing_from_snapshot(folder: Path, commit: str, snapshot: Path) -> list[str]:
    """Files huggingface_hub's cached tree listing (`<repo folder>/trees/<commit>.json`, written by
    a download) names that the snapshot lacks, bytecode excepted (kernels' ignore patterns)."""
    try:
        listing = json.loads((folder / "trees" / f"{commit}.json").read_text())
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
) -> HubKernel:
    """Would `kernels` load a cached build of `repo` (branch v{version}) for this torch and CUDA?

    Follows kernels' cache path (`HubCacheResolver`: `refs/v<N>` in `kernels--<org>--<repo>`, that
    snapshot's `build/`, then `resolve_build_variants`). A cached snapshot is not enough: a variant
    built for another torch, or for a newer CUDA minor than torch's, won't load. `system` defaults to
    this process (`BuildSystem.current`). kernels before 0.19 also cannot load offline a snapshot
    that huggingface_hub's tree listing shows incomplete (every download of one variant is: its
    `snapshot_download(local_files_only=True)` raises IncompleteSnapshotError, which kernels 0.17
    turns into "Cannot find a local snapshot"; 0.19 reads the folder anyway): with `offline` that
    counts as not cached, online kernels downloads the variant again and it does.
    """
    if system is None:
        system = BuildSystem.current(torch_version)
    folder = cache / ("kernels--" + repo.replace("/", "--"))
    if not folder.is_dir():
        return HubKernel(repo, version, None, "not in the local cache")
    ref = folder / "refs" / (f"v{version}" if version is not None else "main")
    try:
        commit = ref.read_text().strip()
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
            f"cached, but no variant for {_system_words(torch_version, torch_cuda, system)} that kernels "
            f"{system.kernels or '(newest)'} would load ({_reasons(resolution)})",
        )
    missing = [] if system.new_rules else _missing_from_snapshot(folder, commit, snapshot)
    if missing:
        why = (
            f"kernels {system.kernels} cannot load snapshot {commit[:12]} offline: huggingface_hub's tree listing "
            f"shows it incomplete ({len(missing)} files missing, e.g. {missing[0]}); kernels 0.19 can"
        )
        if offline:
            return HubKernel(repo, version, None, f"cached variant {best}, but {why}")
        return HubKernel(repo, version, best, f"cached variant {best} (online only: {why})")
    return HubKernel(repo, version, best, f"cached variant {best}")


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
        f"{_system_words(torch_version, torch_cuda, system)} ({_reasons(resolution)}): kernels raises "
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
    if system is None:
        system = BuildSystem.current(torch_version, software.version("kernels"))
    kernels = []
    for repo in sorted(o.hub_repo for o in FLASH_OPTIONS.values()):
        version = hub_kernel_version(repo, torch_version, software.version("transformers"))
        if malformed is not None:
            kernels.append(HubKernel(repo, version, None, malformed))
        elif repo in overrides:
            kernels.append(
                find_local_kernel(repo, overrides[repo], version, torch_version, software.torch_cuda, system)
            )
        else:
            kernels.append(
                find_cached_kernel(cache, repo, version, torch_version, software.torch_cuda, system, offline=offline)
            )
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
