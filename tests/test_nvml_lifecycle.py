"""NVML is shut down after the GPUs are read, whether reading worked or not."""

from __future__ import annotations

import sys
import types

import pytest

from cudaload.capability import gpus


class _NvmlError(Exception):
    pass


def _fake_pynvml(calls: list[str], *, count_fails: bool = False) -> types.ModuleType:
    """A pynvml with one H100-like device that records init/shutdown calls."""
    nvml = types.ModuleType("pynvml")
    nvml.NVMLError = _NvmlError
    nvml.NVMLError_LibraryNotFound = type("NVMLError_LibraryNotFound", (_NvmlError,), {})
    nvml.NVMLError_DriverNotLoaded = type("NVMLError_DriverNotLoaded", (_NvmlError,), {})
    nvml.NVML_DEVICE_MIG_ENABLE = 1
    nvml.nvmlInit = lambda: calls.append("init")
    nvml.nvmlShutdown = lambda: calls.append("shutdown")
    nvml.nvmlSystemGetDriverVersion = lambda: "575.51"

    def count() -> int:
        if count_fails:
            raise _NvmlError("Unknown Error")
        return 1

    nvml.nvmlDeviceGetCount = count
    nvml.nvmlDeviceGetHandleByIndex = lambda i: f"handle{i}"
    nvml.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=80 * 2**30, free=79 * 2**30)
    nvml.nvmlDeviceGetCudaComputeCapability = lambda h: (9, 0)
    nvml.nvmlDeviceGetName = lambda h: "NVIDIA H100 80GB HBM3"
    nvml.nvmlDeviceGetUUID = lambda h: "GPU-0000"
    return nvml


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    monkeypatch.setattr(gpus, "nvidia_driver_absent", lambda: False)
    return []


def test_nvml_is_shut_down_once_after_reading_the_gpus(calls, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(calls))
    report = gpus.probe_gpus({}, [gpus.NvmlProbe])
    assert report.source == "nvml" and [g.name for g in report.gpus] == ["NVIDIA H100 80GB HBM3"]
    assert report.driver == "575.51"  # read before the shutdown
    assert calls == ["init", "shutdown"]


def test_nvml_is_shut_down_when_reading_fails(calls, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(calls, count_fails=True))
    report = gpus.probe_gpus({}, [gpus.NvmlProbe])
    assert report.source == "none" and report.gpus == ()
    assert any("nvml" in note for note in report.notes)
    assert calls == ["init", "shutdown"]


def test_a_probe_used_twice_shuts_nvml_down_once(calls, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(calls))
    probe = gpus.NvmlProbe()
    with probe:
        pass
    probe.__exit__(None, None, None)
    assert calls == ["init", "shutdown"]
