"""Which build/<variant> folders of a Hub kernel `kernels` would load here: its resolution rule
as a pure function of the facts (torch version, its CUDA build, OS, CPU, Python).

kernels resolves a repository's build/<variant> folders in `variants.py` (0.17.2;
`_internals/variants.py` in 0.19.1): `parse_variant` names the parts, `_check_variants` accepts
or rejects each against the system, `_sort_variants` orders the accepted ones. Its entry point
`resolve_variants` reads the system from the running process (torch imported, the CUDA backend
from `torch.version.cuda`), and the fact-taking `_resolve_variant_for_system` is private, moved
between 0.17 and 0.19 and changed signature; importing kernels also costs ~0.5 s and imports
huggingface_hub, which detect() must not. So the rule is followed here, for both releases, and
tests/test_hub_variants.py holds it against the installed kernels' own functions.
"""

from __future__ import annotations

import importlib.util
import platform
import re
import sys
import sysconfig
from collections.abc import Iterable
from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

__all__ = ["BuildSystem", "VariantResolution", "describe_rejections", "describe_system", "resolve_build_variants"]


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


def describe_system(torch_version: str | None, torch_cuda: str | None, system: BuildSystem) -> str:
    release = _release(torch_version)
    torch = f"torch{release[0]}{release[1]}" if len(release) >= 2 else "no torch"
    return f"{torch} + {'CUDA ' + torch_cuda if torch_cuda else 'CPU'} on {system.cpu}-{system.os}"


def describe_rejections(resolution: VariantResolution) -> str:
    return "; ".join(f"{name}: {reason}" for name, reason in resolution.rejected) or "no variant folders"
