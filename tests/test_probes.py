"""Probe reasons across plugins, and DeviceInfo itself (verdict tables live in each plugin)."""

from __future__ import annotations

import pytest

from plugin_api.device_info import DeviceInfo, TorchBuild, read_device_info
from plugin_api.machines import MACHINES
from plugin_api_cpu_arm_acl.probe import probe as cpu_probe
from plugin_api_cuda_sm90.probe import probe as cuda_probe
from plugin_api_rocm.probe import probe as rocm_probe
from plugin_api_xpu.probe import probe as xpu_probe

PROBES = {"cuda-sm90": cuda_probe, "rocm": rocm_probe, "xpu": xpu_probe, "cpu-arm-acl": cpu_probe}


@pytest.mark.parametrize(
    "machine,plugin,reason",
    [
        ("h200", "cuda-sm90", "NVIDIA H200, compute capability 9.0: the validated target"),
        ("a100", "cuda-sm90", "needs 9.x (validated) or 10.x/12.x (experimental)"),
        ("mi300x", "cuda-sm90", "is a ROCm build; use plugin-api-rocm"),
        ("h200", "rocm", "is not a ROCm build (torch.version.hip is None)"),
        ("h200", "xpu", "built without XPU support (torch.xpu.is_available() is False)"),
        ("graviton4-no-acl", "cpu-arm-acl", "no ACL-enabled oneDNN found"),
        ("max-1550", "xpu", "IPEX not installed (optional"),
    ],
)
def test_probe_reasons(machine, plugin, reason):
    a = PROBES[plugin](MACHINES[machine])
    assert any(reason in r for r in a.reasons), a.reasons


def test_xpu_build_without_a_device():
    info = DeviceInfo("x86_64", torch=TorchBuild("2.13.0+xpu", xpu=True))
    a = xpu_probe(info)
    assert str(a.status) == "unavailable"
    assert a.reasons == (
        "torch.xpu.is_available() is False: no Intel GPU visible to this XPU build",
    )


@pytest.mark.parametrize(
    "ipex,expect",
    [
        ("2.13.10+xpu", "matches torch 2.13.0+xpu: optional, and no op of this plugin routes"),
        ("2.8.10+xpu", "IPEX 2.8.10+xpu is built for torch 2.8, not 2.13.0+xpu: not used"),
    ],
)
def test_ipex_is_optional_and_version_matched(ipex, expect):
    base = MACHINES["max-1550"]
    info = DeviceInfo.from_dict(
        base.to_dict() | {"libraries": {"intel-extension-for-pytorch": ipex}}
    )
    assert any(expect in r for r in xpu_probe(info).reasons)


def test_this_machine():
    info = read_device_info()
    for plugin, probe in PROBES.items():
        a = probe(info)
        assert a.reasons, plugin
    if info.torch and info.torch.cuda is None and info.torch.hip is None:
        assert str(cuda_probe(info).status) == "unavailable"
        assert str(rocm_probe(info).status) == "unavailable"


def test_device_info_json_round_trip():
    for info in MACHINES.values():
        assert DeviceInfo.from_dict(info.to_dict()) == info


def test_device_info_rejects_unknown_keys():
    with pytest.raises(ValueError, match=r"DeviceInfo: unknown keys \['gpus'\]"):
        DeviceInfo.from_dict({"machine": "x86_64", "gpus": []})
