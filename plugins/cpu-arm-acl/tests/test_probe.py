"""The cpu-arm-acl probe against DeviceInfo for real machine classes (no hardware needed)."""

from __future__ import annotations

import dataclasses
import platform

import pytest

from plugin_api.device_info import DeviceInfo, TorchBuild, read_device_info
from plugin_api.machines import MACHINES
from plugin_api.ops.huge_pages import thp_mode
from plugin_api_cpu_arm_acl import locate, pages
from plugin_api_cpu_arm_acl.isa import bf16_matmul, int8_matmul_exact, isa_name
from plugin_api_cpu_arm_acl.probe import probe

ONEDNN_X86 = {locate.FACT_VERSION: "3.2.0", locate.FACT_ACL: "no", locate.FACT_ROOT: "/opt/x"}
AVX2 = frozenset({"avx2", "fma", "f16c"})
AVX512 = AVX2 | {"avx512f", "avx512bw", "avx512_vnni"}


def x86(flags: frozenset[str], facts: dict[str, str] | None = None) -> DeviceInfo:
    info = DeviceInfo("x86_64", cpu_model="x86 CPU", cpu_flags=flags, torch=TorchBuild("2.13.0"))
    return info.with_facts(ONEDNN_X86 if facts is None else facts)


def test_graviton4_with_acl_is_validated():
    a = probe(MACHINES["graviton4"])
    assert str(a.status) == "validated" and a.device_type == "cpu"
    assert "ACL-enabled oneDNN 3.9.0" in a.reasons[0] and "SVE2/SVE/BF16/I8MM" in a.reasons[0]


def test_graviton4_without_onednn_is_unavailable():
    a = probe(MACHINES["graviton4-no-acl"])
    assert str(a.status) == "unavailable" and a.device_type is None
    assert "no ACL-enabled oneDNN found" in a.reasons[0]
    assert "PLUGIN_API_ONEDNN_ROOT" in a.reasons[0]


def test_graviton4_with_onednn_built_without_acl_is_unavailable():
    info = MACHINES["graviton4-no-acl"].with_facts(ONEDNN_X86)
    a = probe(info)
    assert str(a.status) == "unavailable"
    assert "oneDNN 3.2.0 at /opt/x was built without ACL" in a.reasons[0]


@pytest.mark.parametrize(
    "flags,isa,bf16",
    [
        (AVX2, "AVX2", "bf16 GEMMs run the plugin's panel kernels"),
        (AVX512, "AVX-512", "bf16 matmuls run oneDNN bf16 kernels"),
        (MACHINES["xeon-cpu"].cpu_flags, "AMX", "bf16 matmuls run oneDNN bf16 kernels"),
    ],
    ids=["avx2", "avx512", "amx"],
)
def test_x86_is_experimental_and_names_its_isa(flags, isa, bf16):
    a = probe(x86(frozenset(flags)))
    assert str(a.status) == "experimental" and a.device_type == "cpu"
    assert f"({isa}): oneDNN 3.2.0 at /opt/x" in a.reasons[0]
    assert bf16 in a.reasons[1]


def test_x86_without_onednn_is_unavailable_with_the_reason():
    missing = {locate.FACT_MISSING: "oneDNN library not found: onednn-cpu-gomp not installed"}
    a = probe(x86(AVX2, missing))
    assert str(a.status) == "unavailable"
    assert a.reasons == ("x86 CPU (AVX2): oneDNN library not found: onednn-cpu-gomp not installed",)


def test_x86_without_avx2_and_other_machines():
    assert "needs at least AVX2" in probe(x86(frozenset({"sse4_2"}))).reasons[0]
    riscv = dataclasses.replace(MACHINES["graviton4"], machine="riscv64")
    assert probe(riscv).reasons == ("riscv64: not an Arm or x86-64 CPU",)
    no_torch = dataclasses.replace(MACHINES["graviton4"], torch=None)
    assert probe(no_torch).reasons == ("torch is not installed",)


def test_isa_capabilities():
    assert isa_name(x86(AVX2)) == "AVX2" and not bf16_matmul(x86(AVX2))
    assert not int8_matmul_exact(x86(AVX2))  # vpmaddubsw saturates without VNNI
    assert bf16_matmul(x86(AVX512)) and int8_matmul_exact(x86(AVX512))
    assert bf16_matmul(MACHINES["graviton4"]) and int8_matmul_exact(MACHINES["graviton4"])
    neoverse_n1 = dataclasses.replace(MACHINES["graviton4"], cpu_flags=frozenset({"asimd"}))
    assert isa_name(neoverse_n1) == "NEON" and not bf16_matmul(neoverse_n1)


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the oneDNN wheels are x86_64 only")
def test_this_machine_reads_the_installed_onednn():
    """The facts hook finds the oneDNN the plugin depends on here, and the probe accepts it."""
    info = read_device_info().with_facts(locate.facts(None))
    found = locate.locate(None)
    assert info.fact(locate.FACT_VERSION) == found.version
    assert found.library.exists() and (found.include / "oneapi" / "dnnl" / "dnnl.hpp").exists()
    assert probe(info).usable, probe(info).reasons


@pytest.mark.parametrize(
    "mode,line",
    [
        ("madvise", "packed weights of 4 MiB or more ask for transparent huge pages (THP mode "),
        ("always", "ask for transparent huge pages (THP mode 'always')"),
        ("never", "THP mode 'never': packed weights get 4 KB pages"),
        (None, None),
    ],
)
def test_the_probe_says_whether_packed_weights_get_huge_pages(mode, line):
    facts = ONEDNN_X86 | ({} if mode is None else {pages.FACT_THP: mode})
    reasons = probe(x86(AVX512, facts)).reasons
    said = [r for r in reasons if "4 KB pages" in r or "huge pages" in r]
    assert said == [] if line is None else len(said) == 1 and line in said[0], reasons


def test_the_thp_fact_is_this_machines_mode():
    mode = thp_mode()
    assert pages.facts() == ({} if mode is None else {pages.FACT_THP: mode})
