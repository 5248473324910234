"""Which build/<variant> folders of a Hub kernel `kernels` would load here: its resolution rule
as a pure function of the facts (torch version, its CUDA build, OS, CPU, Python).

kernels resolves a repository's build/<variant> folders in `variants.py` (0.17.2;
`_internals/variants.py` in 0.19.1): `parse_variant` names the parts, `_check_variants` accepts
or rejects each against the system, `_sort_variants` orders the accepted ones. Its entry point
`resolve_variants` reads the system from the running process (torch imported, the CUDA backend
from `torch.version.cuda`), and the fact-taking `_resolve_variant_for_system` is private, moved
between 0.17 and 0.19 and changed signature; importing kernels also costs ~0.5 s and imports
huggingface_hub, which detect() must not. So the rule is followed here, for both releases, and
tests/test_hub_variants.py holds it against the installed kernels' own functions. The names are parsed
in `variant_names.py`; this module checks each against the system and orders the accepted ones.
"""

from __future__ import annotations

import importlib.util
import platform
import sys
import sysconfig
from collections.abc import Iterable

from packaging.version import InvalidVersion, Version

from ..frozen import frozen
from .variant_names import Backend, Variant, parse_variant

__all__ = ["BuildSystem", "VariantResolution", "describe_rejections", "describe_system", "resolve_build_variants"]


_NEW_VARIANT_RULES = (0, 19)
"""kernels 0.19 added `torch-2.10-cuda-12.8-cpython-3.12-abi3-x86_64-linux` names, the Python ABI
check, SDK variants and MLX noarch; earlier releases parse only the legacy `torch210-cxx11-cu128-...`."""


@frozen
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


@frozen
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


def _backend_mismatch(backend: Backend, selected: Backend) -> str | None:
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


def _check(variant: Variant, torch: Version | None, selected: Backend, system: BuildSystem) -> str | None:
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


def _preference(variant: Variant, new_rules: bool) -> tuple[int, ...]:
    """kernels `_sort_variants`' key, less the accepted-first element: stable-ABI builds (newest ABI
    first), then torch builds (untagged before C++-ABI-tagged), then tvm-ffi, each by highest
    backend minor; then (0.19) SDK builds; then noarch, `universal` last."""

    def backend_order(backend: Backend | None) -> int:
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
    selected = Backend("cuda", Version(torch_cuda)) if torch_cuda else Backend("cpu")
    decided: list[tuple[bool, tuple[int, ...], str, str]] = []
    skipped: list[tuple[str, str]] = []
    for name in sorted(set(names)):
        try:
            variant = parse_variant(name, new_rules)
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
