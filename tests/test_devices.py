"""policy/devices.py's one device parser: `gpu_indices` reads a device_map with `cuda_index`, so a
GPU index means the same thing to placement, max_memory and the KV-cache budget."""

from __future__ import annotations

import doctest
from typing import Any

import pytest

import cudaload.policy.devices as devices
from cudaload import Machine
from cudaload.errors import PlacementError
from cudaload.policy.devices import check_device_map, cuda_index, gpu_indices


class _Device:
    """Stands in for torch.device, which the policy reads through str() (no torch needed)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __str__(self) -> str:
        return self.text


@pytest.mark.parametrize(
    ("device_map", "expected"),
    [
        (None, set()),
        ("auto", set()),
        ("balanced", set()),
        ("balanced_low_0", set()),
        ("sequential", set()),
        ("cpu", set()),
        ("disk", set()),
        ("meta", set()),
        ("cuda", {0}),
        ("cuda:0", {0}),
        ("cuda:3", {3}),
        (0, {0}),
        (2, {2}),
        (_Device("cuda:1"), {1}),
        ({}, set()),
        ({"": 1}, {1}),
        ({"": "cuda:1"}, {1}),
        ({"": "cpu"}, set()),
        ({"model": 0, "lm_head": "cuda:1", "rest": "cpu", "tail": "disk"}, {0, 1}),
        ({"a": 1, "b": "cuda:1"}, {1}),
    ],
)
def test_gpu_indices(device_map: Any, expected: set[int]) -> None:
    assert gpu_indices(device_map) == expected


@pytest.mark.parametrize(
    ("device_map", "quoted"),
    [
        ("gpu:0", "device_map='gpu:0'"),
        ("cuda:x", "device_map='cuda:x'"),
        (-1, "device_map=-1"),
        (True, "device_map=True"),
        ({"lm_head": "gpu"}, "device_map['lm_head']='gpu'"),
        ([0], "device_map=[0]"),
    ],
)
def test_gpu_indices_refuses_what_is_not_a_device(device_map: Any, quoted: str) -> None:
    with pytest.raises(PlacementError) as raised:
        gpu_indices(device_map)
    assert str(raised.value).startswith(quoted)


@pytest.mark.parametrize("device_map", ["cuda:1", 1, {"": "cuda:1"}, {"a": 0, "b": 1}])
def test_gpu_indices_agrees_with_cuda_index_and_check_device_map(device_map: Any) -> None:
    values = device_map.values() if isinstance(device_map, dict) else [device_map]
    assert gpu_indices(device_map) == {cuda_index(v, "device_map") for v in values} - {None}
    # gpu_indices does not look at the machine; check_device_map refuses a GPU it does not see.
    check_device_map(Machine.simulated("A100", count=2), device_map)
    with pytest.raises(PlacementError, match="names cuda:1, but this process sees 1 GPU"):
        check_device_map(Machine.simulated("A100"), device_map)


def test_gpu_indices_example_runs() -> None:
    test = doctest.DocTestFinder().find(devices.gpu_indices, "gpu_indices", globs=vars(devices))[0]
    result = doctest.DocTestRunner().run(test)
    assert result.attempted == 1
    assert result.failed == 0
