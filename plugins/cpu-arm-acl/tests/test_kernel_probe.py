"""kernel_probe: oneDNN's own choice of implementation, asked through its C API, and the GEMM
decisions that read it."""

from __future__ import annotations

import platform
import re
from pathlib import Path

import pytest
import torch

from plugin_api.machines import MACHINES
from plugin_api.ops.gemm import GemmSpec
from plugin_api_cpu_arm_acl import kernel_probe, locate, settings
from plugin_api_cpu_arm_acl.build import extension
from plugin_api_cpu_arm_acl.gemm import CODES, PACK_M, OneDnnGemm
from plugin_api_cpu_arm_acl.matmul_form import ACL, MatmulForm
from plugin_api_cpu_arm_acl.panel_gemm import PanelGemm
from plugin_api_cpu_arm_acl.probe import probe

BF16, F32, S8 = torch.bfloat16, torch.float32, torch.int8
LM_HEAD = GemmSpec(128256, 4096, BF16, F32, "lm_head")


def _install() -> locate.OneDnnInstall:
    try:
        return locate.locate(settings.read().root)
    except locate.OneDnnNotFound as e:
        pytest.skip(str(e))


def _enum(header: Path, name: str) -> int:
    """The value of enumerator ``name`` in ``header`` (explicit, or one more than the last)."""
    text = re.sub(r"//[^\n]*|/\*.*?\*/|#[^\n]*", "", header.read_text(), flags=re.S)
    for body in re.findall(r"enum\s*\w*\s*\{(.*?)\}", text, flags=re.S):
        value, seen = -1, {}
        for item in (i.strip() for i in body.split(",")):
            if not item:
                continue
            key, _, explicit = (p.strip() for p in item.partition("="))
            if not explicit:
                value += 1
            elif explicit in seen:  # an alias of an earlier enumerator
                value = seen[explicit]
            elif re.fullmatch(r"-?(0x[0-9a-fA-F]+|\d+)[uUlL]*", explicit):
                value = int(explicit.rstrip("uUlL"), 0)
            else:
                break  # an expression (flag enums): not one of the enums read here
            seen[key] = value
            if key == name:
                return value
    raise AssertionError(f"{name} not in {header}")


def test_the_c_api_values_match_the_headers_of_the_onednn_found():
    include = _install().include / "oneapi" / "dnnl"
    common, types = include / "dnnl_common_types.h", include / "dnnl_types.h"
    assert _enum(common, "dnnl_f16") == kernel_probe.F16
    assert _enum(common, "dnnl_bf16") == kernel_probe.BF16
    assert _enum(common, "dnnl_f32") == kernel_probe.F32
    assert _enum(common, "dnnl_s8") == kernel_probe.S8
    assert _enum(common, "dnnl_cpu") == kernel_probe.ENGINE_CPU
    assert _enum(types, "dnnl_format_tag_any") == kernel_probe.FORMAT_ANY
    assert _enum(types, "dnnl_scratchpad_mode_user") == kernel_probe.SCRATCHPAD_USER
    assert _enum(types, "dnnl_query_impl_info_str") == kernel_probe.QUERY_IMPL_INFO_STR
    assert _enum(types, "dnnl_query_weights_md") == kernel_probe.QUERY_WEIGHTS_MD
    assert f"#define DNNL_ARG_WEIGHTS_0 {kernel_probe.ARG_WEIGHTS}" in types.read_text()
    assert f"#define DNNL_MAX_NDIMS {kernel_probe.MAX_NDIMS}" in common.read_text()


@pytest.mark.parametrize("form", [None, ACL], ids=["machine-default", "acl"])
def test_the_probe_names_the_kernel_the_extension_gets(onednn_backend, form: MatmulForm | None):
    """For every kind, the implementation the C-API probe reports is the one the plugin's own
    primitive gets for the same problem (so the decisions read what will really run)."""
    impl = OneDnnGemm(threads=None, form=form)
    form_used = impl.form_for(platform.machine())
    found = kernel_probe.probe_kernels(_install().library, form_used)
    assert set(found) == set(kernel_probe.KIND_NAMES)
    n, k = kernel_probe.N, kernel_probe.K
    assert kernel_probe.M == PACK_M
    ops = extension().ops
    for kind in kernel_probe.kinds(form_used):
        ab = {kernel_probe.BF16: BF16, kernel_probe.F32: F32, kernel_probe.S8: S8}[kind.ab]
        c = {kernel_probe.BF16: BF16, kernel_probe.F32: F32}[kind.c]
        if found[kind.name] == kernel_probe.NO_KERNEL:
            continue  # the extension's pack would fail the same way; the decisions reject it
        w = torch.zeros(n, k, dtype=ab)
        scale = torch.ones(n) if kind.scales else None
        threads = torch.get_num_threads()
        conf = [PACK_M, n, k, k, n, CODES[ab], CODES[ab], CODES[F32], 0]
        packed = ops.pack(w, scale, [*conf, int(kind.scales), threads])
        conf = [PACK_M, n, k, k, n, CODES[ab], CODES[ab], CODES[c], CODES[F32] if kind.bias else 0]
        prim = ops.matmul([*conf, int(kind.scales), threads], packed)
        assert str(prim.impl()) == found[kind.name], kind


def test_a_library_that_is_not_onednn_is_a_reported_failure(tmp_path):
    bogus = tmp_path / "libdnnl.so"
    bogus.write_bytes(b"not an ELF file")
    facts = kernel_probe.facts(bogus, MatmulForm())
    assert list(facts) == [kernel_probe.FACT_ERROR] and str(bogus) in facts[kernel_probe.FACT_ERROR]
    a = probe(MACHINES["graviton4"].with_facts(facts))
    assert str(a.status) == "unavailable" and str(bogus) in a.reasons[0]


# What Debian trixie's ACL 24.11 (built without fixed_format_kernels) gives oneDNN 3.7.2, seen on
# an emulated Neoverse-V2-like CPU (tools/arm64_emulated.sh onednn): bf16 on reference code.
DEBIAN_ACL = {
    kernel_probe.FACT_PREFIX + "bf16->f32": "gemm:jit:bf16",
    kernel_probe.FACT_PREFIX + "bf16->bf16": "gemm:jit:bf16",
    kernel_probe.FACT_PREFIX + "f32->f32": "gemm:acl",
    kernel_probe.FACT_PREFIX + "s8->f32": "lowp_gemm:acl",
}


def test_bf16_on_oneDNNs_reference_code_goes_to_the_panel_kernels():
    info = MACHINES["graviton4"].with_facts(DEBIAN_ACL)
    onednn, panel = OneDnnGemm(), PanelGemm()
    rejected = onednn.supports(LM_HEAD, info)
    assert not rejected
    assert "only its reference kernel 'gemm:jit:bf16' for bf16->f32" in rejected.because()
    assert "fixed_format_kernels=1" in rejected.because()
    accepted = panel.supports(LM_HEAD, info)
    assert accepted and "oneDNN's is reference code" in accepted.because()
    w8a8 = GemmSpec(4096, 4096, S8, BF16)
    assert onednn.supports(w8a8, info) and onednn.supports(GemmSpec(64, 64, F32, F32), info)
    a = probe(info)
    assert str(a.status) == "validated"
    assert any("bf16->f32 gemm:jit:bf16 (reference code)" in r for r in a.reasons)
    assert any("bf16 GEMMs run the plugin's panel kernels" in r for r in a.reasons)


def test_int8_or_fp32_on_reference_code_is_rejected_with_the_kernel_named():
    slow = DEBIAN_ACL | {
        kernel_probe.FACT_PREFIX + "s8->f32": "gemm:jit",
        kernel_probe.FACT_PREFIX + "f32->f32": kernel_probe.NO_KERNEL,
    }
    info = MACHINES["graviton4"].with_facts(slow)
    int8 = OneDnnGemm().supports(GemmSpec(4096, 4096, S8, BF16), info)
    assert not int8 and "reference kernel 'gemm:jit' for s8->f32" in int8.because()
    fp32 = OneDnnGemm().supports(GemmSpec(64, 64, F32, F32), info)
    assert not fp32 and "no kernel for f32->f32" in fp32.because()


def test_a_what_if_machine_without_kernel_facts_decides_from_its_flags():
    info = MACHINES["graviton4"]
    assert kernel_probe.onednn_kernel(info, "bf16->f32") is None
    assert kernel_probe.onednn_bf16(info) and OneDnnGemm().supports(LM_HEAD, info)
