"""Parses a Hub kernel's build/<variant> folder name as `kernels` does (`parse_variant`): the
framework and its version, the C++ ABI tag, the backend, the Python ABI and the system, by the rules of
kernels 0.17.2 (legacy `torch210-cxx11-cu128-x86_64-linux` names only) or 0.19.1 (also
`torch-2.10-cuda-12.8-cpython-3.12-abi3-x86_64-linux`, SDK and MLX noarch variants).
`kernel_variants.py` checks and orders the parsed variants."""

from __future__ import annotations

import re

from packaging.version import Version

from ..frozen import frozen

__all__ = ["Backend", "Variant", "parse_variant"]

_PYTHON_MARKER = "cpython"
_LEGACY_PYTHON = Version("3.9")
_ABI3T_MIN_PYTHON = Version("3.15")


@frozen
class Backend:
    """The backend part of a build variant's name (`cu128`, `cuda-12.8`, `cpu`, ...)."""

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


@frozen
class Variant:
    """A Hub kernel's build variant, parsed from its folder name."""

    kind: str  # "arch", "noarch" or "sdk"
    framework: str = ""  # "torch", "torch-stable-abi", "tvm-ffi", "torch-noarch", "mlx-noarch", "sdk"
    version: Version | None = None  # the framework's
    cxx11_abi: bool | None = None
    backend: Backend | None = None
    python: tuple[Version, str] | None = (_LEGACY_PYTHON, "abi3")
    system: tuple[str, str] | None = None  # (cpu, os)


_VERSIONED = {"cuda": "cu", "rocm": "rocm", "xpu": "xpu", "cann": "cann"}
_UNVERSIONED = ("cpu", "metal", "neuron", "tpu")


def _two_part_version(pattern: str, text: str) -> Version | None:
    match = re.fullmatch(pattern, text)
    return Version(f"{match.group(1)}.{match.group(2)}") if match else None


def _parse_backend(parts: list[str], legacy: bool) -> Backend:
    """kernels `backends.parse_backend`: legacy `cu128` / `cpu` (one part), new `cuda`, `12.8`."""
    if legacy:
        if len(parts) != 1:
            raise ValueError(f"Invalid backend variant parts, expected a single part, got: {parts!r}")
        name = parts[0]
        if name in _UNVERSIONED:
            return Backend(name)
        for backend, prefix in _VERSIONED.items():
            if name.startswith(prefix):
                version = _two_part_version(rf"{prefix}(\d+)(\d+)", name)
                if version is None:
                    raise ValueError(f"Invalid {backend} variant parts: {parts!r}")
                return Backend(backend, version)
        raise ValueError(f"Unknown backend variant parts: {parts!r}")
    name = parts[0] if parts else ""
    if name in _UNVERSIONED:
        if parts != [name]:
            raise ValueError(f"Invalid {name} variant parts: {parts!r}")
        return Backend(name)
    if name in _VERSIONED:
        version = _two_part_version(r"(\d+)\.(\d+)", parts[1]) if len(parts) == 2 else None
        if version is None:
            raise ValueError(f"Invalid {name} variant parts: {parts!r}")
        return Backend(name, version, legacy=False)
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


def parse_variant(name: str, new_rules: bool) -> Variant:
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
            return Variant("noarch", "torch-noarch", backend=Backend("-".join(parts[1:]), noarch=True))
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
        return Variant("arch", framework, version, cxx11, _parse_backend(rest[:1], True), system=(rest[1], rest[2]))

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
        return Variant("noarch", "torch-noarch", backend=Backend("-".join(parts[1:]), noarch=True))
    elif parts[0] == "mlx" and len(parts) >= 2 and not parts[1][:1].isdigit():
        return Variant("noarch", "mlx-noarch", backend=Backend("-".join(parts[1:]), noarch=True))
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
    return Variant("arch", framework, version, cxx11, _parse_backend(backend_parts, legacy), python, system)


def _parse_sdk(name: str, rest: list[str]) -> Variant:
    """kernels 0.19 `parse_sdk_variant`: `sdk`, `sdk-<backend>`, `sdk[-<backend>]-cpython-...-<cpu>-<os>`."""
    if _PYTHON_MARKER in rest:
        if len(rest) < 2:
            raise ValueError(f"Invalid variant parts: {rest!r}")
        rest, system = rest[:-2], (rest[-2], rest[-1])
        rest, python = _split_python(rest)
        if python is None:  # `cpython` was the cpu or os part
            raise ValueError("SDK variants must define the Python version and ABI together with the system")
        return Variant(
            "sdk", "sdk", backend=_parse_backend(rest, False) if rest else None, python=python, system=system
        )
    if len(rest) > 1:
        raise ValueError(f"Invalid SDK variant string: {name!r}")
    backend = Backend(rest[0], noarch=True) if rest else None
    return Variant("sdk", "sdk", backend=backend, python=None, system=None)
