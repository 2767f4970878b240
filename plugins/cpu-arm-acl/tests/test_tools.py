"""The plugin's tools on this machine: tools/attention_check.py (what arm64_emulated.sh runs on
an emulated Arm CPU) still fits the conformance kit's tables and passes; tools/stream_fma_probe.cpp
(the bound on the LM-head GEMV at 5-16 rows, docs/measurements/cpu-arm-acl/2026-12-04-zen5.md)
builds and reports every loop; tools/avx2_capped.py puts every layer on its AVX2 path."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
from pathlib import Path
from types import ModuleType

import pytest

from plugin_api.device_info import read_device_info
from plugin_api_cpu_arm_acl import _attention_ext as ext

TOOLS = Path(__file__).resolve().parents[1] / "tools"


def load_tool(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, TOOLS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(
    ext.isa_path(read_device_info()) is None, reason="this CPU has no supported vector ISA"
)
def test_attention_check_passes_on_this_machine(tmp_path):
    tool = load_tool("attention_check")
    report = tmp_path / "check.json"
    rc = tool.main(["--threads", "2", "--matrix", "off", "--json", str(report)])
    summary = json.loads(report.read_text())
    assert rc == 0, summary["failures"]
    assert summary["failed"] == 0 and summary["passed"] + summary["skipped"] == len(
        list(tool.cases())
    )
    assert summary["passed"] > 100


@pytest.mark.skipif(
    "avx512_bf16" not in read_device_info().cpu_flags or shutil.which("g++") is None,
    reason="the probe needs AVX-512 BF16 and g++",
)
def test_stream_fma_probe_reports_every_loop(tmp_path):
    exe = tmp_path / "probe"
    build = ["g++", "-O3", "-march=native", "-fopenmp", str(TOOLS / "stream_fma_probe.cpp")]
    subprocess.run([*build, "-o", str(exe)], check=True)
    run = subprocess.run([exe, "--mib", "64", "--json"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    rows = [json.loads(line) for line in run.stdout.splitlines()]
    assert [r["round"] for r in rows] == [1] * 8 + [2] * 8 + [3] * 8  # --rounds defaults to 3
    assert {r["loop"] for r in rows} >= {"ideal fmas=0", "ideal fmas=8", "gemv M=8 T=3"}
    for r in rows:
        assert r["gbs"] > 0 and r["copy_gbs"] > 0, r
        # the ratio is of the unrounded rates; gbs and copy_gbs are printed to 0.01 GB/s, which
        # moves their quotient by up to this much (more on a loaded machine's low copy rate)
        ratio = r["gbs"] / r["copy_gbs"]
        slack = ratio * (0.005 / r["gbs"] + 0.005 / r["copy_gbs"]) + 5e-4
        assert r["of_copy"] == pytest.approx(ratio, abs=slack), r
        printed = 0.005 * r["fmas_per_line"] + 0.05  # gbs printed to 0.01, gflops to 0.1
        assert r["gflops"] == pytest.approx(r["gbs"] * r["fmas_per_line"], abs=printed + 1e-6), r
    bad = subprocess.run([exe, "--rounds", "0"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--rounds must be a positive integer" in bad.stderr


def test_avx2_cap_hides_what_avx2_cpus_lack():
    tool = load_tool("avx2_capped")
    text = (
        "processor\t: 0\nflags\t\t: fpu avx avx2 fma f16c avx512f avx512_bf16 avx_vnni amx_tile "
        "amx_bf16 avx512vl\nmodel name\t: X\n\nprocessor\t: 1\nflags\t\t: avx2 avx512bw\n"
    )
    assert tool.capped_cpuinfo(text) == (
        "processor\t: 0\nflags\t\t: fpu avx avx2 fma f16c\nmodel name\t: X\n\n"
        "processor\t: 1\nflags\t\t: avx2\n"
    )


def test_avx2_cap_puts_every_layer_on_its_avx2_path(capfd):
    tool = load_tool("avx2_capped")
    why = tool.unavailable()
    if why is not None:
        pytest.skip(why)

    def flags() -> list[str]:  # not the whole text: "cpu MHz" moves between reads
        return re.findall(r"^flags.*$", Path("/proc/cpuinfo").read_text(), re.MULTILINE)

    before = flags()
    assert tool.main(["--check"]) == 0
    seen = json.loads(capfd.readouterr().out)
    assert seen["cpuinfo_avx512"] == []
    assert seen["plugin_isa"] == "AVX2" and seen["attention_variant"] == "avx2"
    assert seen["aten_capability"] == "AVX2" and seen["inductor_isa"] == "avx2"
    assert seen["inductor_march"] == "x86-64-v3"
    assert not any(seen["torch_probes"].values()), seen["torch_probes"]
    assert seen["env"] == tool.ENV
    assert flags() == before  # the mount stayed in its namespace
