"""The plugin's settings: declared in the descriptor, parsed strictly, visible in decisions."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from plugin_api.contract import OpFamily
from plugin_api.errors import SettingError
from plugin_api.machines import MACHINES
from plugin_api.ops.gemm import GemmSpec
from plugin_api.settings import check_names
from plugin_api_cpu_arm_acl import hooks, settings
from plugin_api_cpu_arm_acl.descriptor import DESCRIPTOR
from plugin_api_cpu_arm_acl.settings import LargeMPolicy, LmHeadPolicy, PanelPolicy

LM_HEAD = GemmSpec(128256, 4096, torch.bfloat16, torch.float32, "lm_head")


def test_descriptor_declares_every_setting():
    assert set(DESCRIPTOR.settings) == set(settings.NAMES)
    check_names({name: "1" for name in settings.NAMES}, DESCRIPTOR.settings)  # no error


def test_defaults():
    s = settings.read({})
    assert s == settings.PluginSettings(None, None, None, None, gemv=None)
    assert LmHeadPolicy.default_for("aarch64") == LmHeadPolicy(64000, 9)
    assert LmHeadPolicy.default_for("x86_64") == LmHeadPolicy(enabled=False, pad_m=4, gemv_m=8)


def test_off_turns_the_f32_dst_gate_off():
    off = settings.read({settings.LM_HEAD: " off "}).lm_head
    assert off == LmHeadPolicy(enabled=False)
    assert not any(off.f32_dst(m, 128256) for m in (1, 9, 256))
    assert off.describe() == "bf16 out always runs the bf16-dst kernel"
    both = settings.read({settings.LM_HEAD: "off, pad_m=4"}).lm_head
    assert both == LmHeadPolicy(enabled=False, pad_m=4)
    assert settings.read({settings.LM_HEAD: "pad_m=2"}).lm_head == LmHeadPolicy(pad_m=2)


XEON = MACHINES["xeon-cpu"]  # Sapphire Rapids: AMX
XEON_NO_AMX = dataclasses.replace(XEON, cpu_flags=XEON.cpu_flags - {"amx_bf16", "amx_tile"})


@pytest.mark.parametrize(
    "info,why",
    [
        (
            MACHINES["graviton4"],
            "f32-dst kernel + one downcast when N >= 64000 and M >= 9 (default on aarch64)",
        ),
        (
            XEON_NO_AMX,
            "M <= 8 runs the bf16 GEMV (vdpbf16ps) on oneDNN's packed weights (where they are in "
            "its AVX-512 BF16 layout); M < 4 runs the 4-row kernel on padded rows (default on "
            "x86_64)",
        ),
        (
            XEON,
            "LmHeadPolicy: bf16 out always runs the bf16-dst kernel; M <= 64 runs the bf16 GEMV "
            "(AMX tiles) on oneDNN's packed weights (where they are in its AVX-512 BF16 layout) "
            "(default on x86_64 with AMX)",
        ),
    ],
    ids=["graviton4", "xeon-no-amx", "xeon-cpu"],
)
def test_doctor_shows_the_default_of_the_machine_described(info, why):
    """A what-if DeviceInfo gets its own machine's default (architecture, AMX), not the host's."""
    (onednn,) = [
        i for i in hooks.HOOKS.plugin_api_implementations(OpFamily.GEMM) if i.name == "onednn"
    ]
    assert (
        why
        in onednn.supports(dataclasses.replace(LM_HEAD, out_dtype=torch.bfloat16), info).reasons[-1]
    )


def test_read_values():
    env = {
        settings.ROOT: "/opt/onednn-acl",
        settings.THREADS: "3",
        settings.LM_HEAD: "min_n=32000, min_m=1",
        settings.PANEL: "isa=generic, kc=512,mc=64",
        settings.LARGE_M: "min_m=1024",
    }
    s = settings.read(env)
    assert s.root == "/opt/onednn-acl" and s.threads == 3
    assert s.large_m == LargeMPolicy(min_m=1024)
    assert settings.read({settings.LARGE_M: " off "}).large_m == LargeMPolicy(min_m=0)
    assert s.lm_head == LmHeadPolicy(min_n=32000, min_m=1)
    assert s.panel == PanelPolicy(isa="generic", kc=512, mc=64)
    assert settings.read({settings.LM_HEAD: "min_m=2"}).lm_head == LmHeadPolicy(64000, 2)


@pytest.mark.parametrize(
    "name,value,match",
    [
        (settings.THREADS, "0", "must be a positive integer"),
        (settings.THREADS, "two", "must be a positive integer"),
        (settings.LM_HEAD, "min_n=64k", "min_n must be an integer"),
        (
            settings.LM_HEAD,
            "max_n=5",
            "keys \\['gemv_m', 'min_m', 'min_n', 'pad_m'\\], got 'max_n=5'",
        ),
        (settings.LM_HEAD, "min_m=0", "min_m=0 must be an int >= 1"),
        (settings.LM_HEAD, "off,max_n=5", "LM_HEAD='off,max_n=5': expected .* got 'max_n=5'"),
        (
            settings.LM_HEAD,
            "enabled=0",
            "keys \\['gemv_m', 'min_m', 'min_n', 'pad_m'\\], got 'enabled=0'",
        ),
        (settings.ROOT, " ", "set but empty"),
        (settings.PANEL, "isa=sse2", "isa='sse2' must be one of \\('auto', 'avx2', 'generic'\\)"),
        (settings.PANEL, "kc=0", "PanelPolicy.kc=0 must be an int >= 1"),
        (settings.PANEL, "mc=8x", "mc must be an integer"),
        (settings.PANEL, "threads=2", "got 'threads=2'"),
        (settings.LARGE_M, "min_m=big", "min_m must be an integer"),
        (settings.LARGE_M, "1024", "expected comma-separated key=value"),
    ],
)
def test_bad_values_are_errors(name, value, match):
    with pytest.raises(SettingError, match=match):
        settings.read({name: value})


def test_policy_bands():
    p = LmHeadPolicy(min_n=64000, min_m=9)
    assert p.f32_dst(9, 128256) and p.f32_dst(256, 64000)
    assert not p.f32_dst(8, 128256) and not p.f32_dst(64, 63999)


def test_env_policy_reaches_the_implementation_and_its_reasons(monkeypatch):
    monkeypatch.setenv(settings.LM_HEAD, "min_n=1000,min_m=2")
    monkeypatch.setenv(settings.PANEL, "kc=128,mc=64")
    onednn, panel = hooks.HOOKS.plugin_api_implementations(OpFamily.GEMM)
    assert onednn.policy == LmHeadPolicy(1000, 2)
    assert panel.policy == PanelPolicy(kc=128, mc=64)
    # what `plugin-api doctor` prints for the LM-head layer
    avx512 = MACHINES["xeon-cpu"]
    reasons = onednn.supports(LM_HEAD, avx512).reasons
    assert "N >= 1000 and M >= 2 (PLUGIN_API_ONEDNN_LM_HEAD)" in reasons[-1]
    avx2 = dataclasses.replace(avx512, cpu_flags=frozenset({"avx2", "fma"}))
    reasons = panel.supports(LM_HEAD, avx2).reasons
    expect = "PanelPolicy: isa=auto, kc=128, mc=64, block_major_m=0 (PLUGIN_API_ONEDNN_PANEL)"
    assert expect in reasons[-1]


@pytest.mark.parametrize(
    "name,field,given,bads",
    [
        (settings.ATTENTION_MATRIX, "attention_matrix", " off ", ("yes", "1", "AMX")),
        (settings.ATTENTION_PREFETCH, "attention_prefetch", "l1 ", ("L1", "l3", "on")),
    ],
)
def test_attention_modes(name, field, given, bads):
    assert getattr(settings.read({}), field) == "auto"
    assert getattr(settings.read({name: given}), field) == given.strip()
    for bad in bads:
        with pytest.raises(SettingError, match=f"{name}='{bad}' must be one"):
            settings.read({name: bad})
