"""A wheel's prebuilt libraries: the manifest, the torch they fit, what the probe says, and how
setup.py is told to compile (wheels) or not (editable installs, sdists). The wheels themselves
are built, installed and run by tests/wheels/wheel_check.py."""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from plugin_api.device_info import DeviceInfo, TorchBuild, read_device_info
from plugin_api_cpu_arm_acl import build, locate, native, prebuilt
from plugin_api_cpu_arm_acl.probe import probe

PLUGIN = Path(__file__).resolve().parents[1]
ONEDNN_X86 = {locate.FACT_VERSION: "3.2.0", locate.FACT_ACL: "no", locate.FACT_ROOT: "/opt/x"}
AVX512 = frozenset({"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq"})
MANIFEST = native.Manifest(
    torch="2.13.0+cpu",
    cxx11_abi=True,
    machine="x86_64",
    python="cp311",
    onednn="3.2.0",
    source_hash="0123456789abcdef",
    gemm=("avx512bf16", "avx512", "avx2"),
    attention=("avx512bf16", "avx512", "avx2"),
)


def x86(torch: str, facts: dict[str, str]) -> DeviceInfo:
    info = DeviceInfo("x86_64", cpu_model="x86 CPU", cpu_flags=AVX512, torch=TorchBuild(torch))
    return info.with_facts(ONEDNN_X86 | facts)


def wheel_facts(built: str, abi: str = "1", torch_abi: str = "1") -> dict[str, str]:
    return {
        prebuilt.FACT_NATIVE: "prebuilt",
        prebuilt.FACT_BUILT_TORCH: built,
        prebuilt.FACT_BUILT_ABI: abi,
        prebuilt.FACT_TORCH_ABI: torch_abi,
    }


def test_manifest_round_trips_and_names_what_is_wrong():
    assert native.Manifest.from_json(MANIFEST.to_json()) == MANIFEST
    data = json.loads(MANIFEST.to_json())
    with pytest.raises(ValueError, match="format 0, expected 1"):
        native.Manifest.from_json(json.dumps(data | {"format": 0}))
    del data["torch"]
    with pytest.raises(ValueError, match="KeyError: 'torch'"):
        native.Manifest.from_json(json.dumps(data))


@pytest.mark.parametrize(
    ("built", "found", "refused"),
    [
        ("2.13.0+cpu", "2.13.0+cpu", False),
        ("2.13.0+cpu", "2.13.0", False),  # the local label does not change the C++ ABI
        ("2.13.0+cpu", "2.13.0+cu128", False),
        ("2.13.0+cpu", "2.14.0+cpu", True),
        ("2.13.0+cpu", "2.13.1", True),
        ("2.12.0", "2.13.0+cpu", True),
    ],
)
def test_mismatch_compares_the_release(built, found, refused):
    why = prebuilt.mismatch(built, True, found, True)
    assert (why is not None) == refused
    if refused:
        assert why.startswith(f"built for torch {built}, found {found}")
        assert "pip install --force-reinstall plugin-api-cpu-arm-acl" in why


def test_mismatch_compares_the_cxx11_abi_when_known():
    why = prebuilt.mismatch("2.13.0", True, "2.13.0", False)
    assert why is not None and "_GLIBCXX_USE_CXX11_ABI=1, found 2.13.0 with 0" in why
    assert prebuilt.mismatch("2.13.0", True, "2.13.0", None) is None


def test_probe_refuses_a_wheel_built_for_another_torch():
    a = probe(x86("2.14.0", wheel_facts("2.13.0+cpu")))
    assert str(a.status) == "unavailable"
    assert "built for torch 2.13.0+cpu, found 2.14.0" in a.reasons[0]


def test_probe_refuses_a_wheel_built_for_another_onednn():
    facts = wheel_facts("2.13.0+cpu") | {prebuilt.FACT_BUILT_ONEDNN: "3.9.0"}
    a = probe(x86("2.13.0+cpu", facts))
    assert str(a.status) == "unavailable"
    assert (
        "built against oneDNN 3.9.0, found oneDNN 3.2.0; unset PLUGIN_API_ONEDNN_ROOT"
        in (a.reasons[0])
    )


def test_probe_refuses_an_unreadable_manifest():
    facts = {prebuilt.FACT_NATIVE: "prebuilt", prebuilt.FACT_MANIFEST_ERROR: "bad manifest (x)"}
    a = probe(x86("2.13.0", facts))
    assert str(a.status) == "unavailable" and "bad manifest (x)" in a.reasons[0]


def test_probe_says_where_the_kernels_come_from():
    wheel = probe(x86("2.13.0+cpu", wheel_facts("2.13.0+cpu")))
    assert str(wheel.status) == "experimental"
    level = "GEMM level avx512: AVX-512"  # AVX512 here lacks avx512_bf16/avx512vbmi
    assert f"native kernels prebuilt for torch 2.13.0+cpu (wheel); {level}" in wheel.reasons
    jit = probe(x86("2.13.0+cpu", {prebuilt.FACT_NATIVE: "jit"}))
    assert f"{prebuilt.JIT_NOTE}; {level}" in jit.reasons
    flags = frozenset({"avx2", "fma", "f16c"})
    avx2 = DeviceInfo("x86_64", cpu_model="x86 CPU", cpu_flags=flags, torch=TorchBuild("2.13.0"))
    avx2 = avx2.with_facts(ONEDNN_X86 | {prebuilt.FACT_NATIVE: "jit"})
    assert any(r.endswith("; GEMM level avx2: AVX2 + FMA + F16C") for r in probe(avx2).reasons)
    # a what-if DeviceInfo carries no such fact: no line either way
    plain = probe(x86("2.13.0+cpu", {}))
    assert not any("JIT" in r or "prebuilt" in r for r in plain.reasons)


def test_this_source_tree_has_no_prebuilt_libraries():
    assert not prebuilt.DIRECTORY.exists()
    assert prebuilt.read() is None
    assert prebuilt.facts() == {prebuilt.FACT_NATIVE: "jit"}


def test_an_unreadable_installed_manifest_is_a_fact(tmp_path, monkeypatch):
    bad = tmp_path / "manifest.json"
    bad.write_text("{}")
    monkeypatch.setattr(prebuilt, "MANIFEST", bad)
    found = prebuilt.facts()
    assert found[prebuilt.FACT_NATIVE] == "prebuilt"
    assert "unreadable manifest" in found[prebuilt.FACT_MANIFEST_ERROR]


def test_variants_pick_the_best_the_cpu_runs():
    # Cooper Lake (BF16 without VBMI) takes AVX-512 in both extensions: the top level of each
    # uses both (the bf16 GEMV and group quant; vdpbf16ps decode and the fp8 -> bf16 lookup)
    flags = AVX512 | {"avx512_bf16"}
    assert native.best(native.ISA_PATHS, "x86_64", flags).name == "avx512"
    assert native.best(native.GEMM_VARIANTS, "x86_64", flags).name == "avx512"
    top = flags | {"avx512vbmi"}
    assert native.best(native.ISA_PATHS, "x86_64", top).name == "avx512bf16"
    assert native.best(native.GEMM_VARIANTS, "x86_64", top).name == "avx512bf16"
    assert native.best(native.GEMM_VARIANTS, "x86_64", frozenset({"avx2"})) is None
    assert native.best(native.GEMM_VARIANTS, "aarch64", frozenset({"asimd"})).name == "neon"


def test_jit_and_wheel_flags_share_one_description():
    avx2 = next(v for v in native.GEMM_VARIANTS if v.name == "avx2")
    jit, wheel = native.gemm_cflags(None, "x86_64"), native.gemm_cflags(avx2)
    assert set(native.GEMM_COMMON_CFLAGS) <= set(jit) & set(wheel)
    assert "-march=native" in jit and "-march=native" not in wheel
    assert "-ffp-contract=off" in wheel  # the bit-exact epilogue needs it in both
    assert set(native.GEMM_ISA_SOURCES) <= set(native.GEMM_SOURCES)


def test_jit_build_compiles_the_level_a_wheel_loads_here():
    # a development install runs the code a wheel ships for this CPU, at the ISA plugin-api
    # reads from /proc/cpuinfo (not -march=native, which asks CPUID past a capped cpuinfo)
    if prebuilt.read() is not None:
        pytest.skip("a wheel install: its prebuilt libraries are loaded, nothing is compiled")
    variant = build.host_variant()
    flags = read_device_info().cpu_flags
    assert variant == native.best(native.GEMM_VARIANTS, platform.machine(), flags)
    if variant is None:
        pytest.skip(f"no GEMM variant fits this CPU ({platform.machine()}): -march=native")
    assert "-march=native" not in build.cflags() and set(variant.cflags) <= set(build.cflags())
    ext = build.extension()
    assert ext.origin == f"jit {variant.name}"
    # the compiled library agrees: only the avx512bf16 level has the bf16 GEMV
    assert (str(ext.ops.gemv_isa()) != "none") == (variant.name == "avx512bf16")


def _setup_requirements(env: dict[str, str]) -> list[str]:
    """setup.py's install_requires, as its own process computes them under ``env``."""
    code = (
        "import sys, importlib.util, setuptools\n"
        "setuptools.setup = lambda **kw: print(kw['install_requires'])\n"
        f"spec = importlib.util.spec_from_file_location('s', {str(PLUGIN / 'setup.py')!r})\n"
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    return list(ast.literal_eval(out.stdout))


def test_setup_pins_torch_for_wheels_only():
    import torch

    env = {k: v for k, v in os.environ.items() if k != "PLUGIN_API_CPU_ARM_ACL_PREBUILT"}
    editable = _setup_requirements(env)
    assert "torch>=2.4" in editable and "ninja>=1.11" in editable
    wheel = _setup_requirements(env | {"PLUGIN_API_CPU_ARM_ACL_PREBUILT": "1"})
    assert f"torch=={torch.__version__.split('+')[0]}" in wheel
    assert not any(r.startswith("ninja") for r in wheel)


@pytest.mark.filterwarnings("ignore:pkg_resources is deprecated:DeprecationWarning")
def test_backend_asks_for_the_toolchain_for_wheels_only():
    spec = importlib.util.spec_from_file_location("wheel_backend", PLUGIN / "wheel_backend.py")
    assert spec is not None and spec.loader is not None
    backend = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(backend)
    wheel = backend.get_requires_for_build_wheel()
    assert any(r.startswith("torch==") for r in wheel)
    assert not any(r.startswith("torch") for r in backend.get_requires_for_build_editable())


def test_manifest_fields_are_what_the_json_holds():
    keys = set(json.loads(MANIFEST.to_json())) - {"format"}
    assert keys == {f.name for f in dataclasses.fields(native.Manifest)}
