"""The bridge activates only on request, hands workers the selection, and refuses plainly."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from plugin_api_vllm import activation
from plugin_api_vllm.status import status
from plugin_api_vllm.versions import UnsupportedVllm, check_vllm, release, supported_range

PROBE = """
import json, os
from plugin_api_vllm.activation import activate
path = activate()
print(json.dumps({"path": path, "selection": os.environ.get("PLUGIN_API_SELECTION")}))
"""


def activate_in(env: dict[str, str]) -> dict[str, str | None]:
    r = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_not_opted_in_leaves_vllm_alone(env: Any) -> None:
    assert activate_in(env()) == {"path": None, "selection": None}


@pytest.mark.needs_vllm
def test_opt_in_selects_once_and_hands_the_selection_to_workers(env: Any) -> None:
    out = activate_in(env(PLUGIN_API_BACKEND="reference"))
    assert out["path"] == "plugin_api_vllm.platforms.cpu.CpuPlatform"
    sel = json.loads(out["selection"] or "{}")
    assert sel["backend"] == "reference" and sel["device"]["machine"] != "(not read)"


@pytest.mark.needs_vllm
def test_unknown_backend_stops_vllm_with_the_reason(env: Any) -> None:
    # vLLM swallows what a platform plugin raises; the refused platform re-raises it
    code = "from vllm.platforms import current_platform; current_platform.device_type"
    r = subprocess.run(
        [sys.executable, "-c", code],
        env=env(PLUGIN_API_BACKEND="cpu-arm-acI"),
        capture_output=True,
        text=True,
    )
    assert r.returncode != 0
    assert "BridgeRefused" in r.stderr and "'cpu-arm-acI' is not installed" in r.stderr
    assert "Did you mean 'cpu-arm-acl'" in r.stderr


def write_fake_vllm(site: Path, version: str) -> None:
    info = site / f"vllm-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")


@pytest.mark.needs_vllm
def test_vllm_out_of_range_is_refused_with_the_range(tmp_path: Path, env: Any) -> None:
    write_fake_vllm(tmp_path, "0.31.2")
    with pytest.raises(UnsupportedVllm, match=r"vllm 0\.31\.2 is outside .*>=0\.32,<0\.33"):
        check_vllm([str(tmp_path)])
    # end to end: vLLM (the real one) sees the bridge refuse the fake newer distribution first
    fake = env(PLUGIN_API_BACKEND="reference", PYTHONPATH=str(tmp_path))
    code = "from vllm.platforms import current_platform; current_platform.device_type"
    r = subprocess.run([sys.executable, "-c", code], env=fake, capture_output=True, text=True)
    assert r.returncode != 0 and "outside the range this bridge supports" in r.stderr


def test_vllm_missing_is_said_plainly(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedVllm, match="vLLM is not installed"):
        check_vllm([str(tmp_path)])


def test_versions_parse() -> None:
    assert release("0.32.0+cpu") == (0, 32) and supported_range() == ">=0.32,<0.33"
    with pytest.raises(UnsupportedVllm):
        release("main")


def test_doctor_shows_the_bridge(env: Any) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "plugin_api.cli", "doctor", "--json"],
        env=env(),
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    (entry,) = [i for i in json.loads(r.stdout)["integrations"] if i["name"] == "vllm"]
    assert entry == {"name": "vllm", **status(), "distribution": entry["distribution"]}
    assert "vLLM 0.32.0" in entry["built_against"]


def test_platform_paths_cover_every_device() -> None:
    assert activation.platform_for("rocm", "cuda").endswith("RocmPlatform")
    assert activation.platform_for("cuda-sm90", "cuda").endswith("CudaPlatform")
    assert activation.platform_for("xpu", "xpu").endswith("XpuPlatform")
    with pytest.raises(ValueError, match="device type 'tpu'"):
        activation.platform_for("x", "tpu")


BAD_COUNTS = [
    ["plugin_api_vllm.bench", "--reps", "0"],
    ["plugin_api_vllm.demo", "--max-tokens", "-1"],
]


@pytest.mark.parametrize("args", BAD_COUNTS)
def test_bad_counts_are_refused_naming_the_option(env: Any, run: Any, args: list[str]) -> None:
    r = run(args, env())
    assert r.returncode == 2 and f"argument {args[1]}" in r.stderr and ">= 1" in r.stderr


def test_bench_kv_cache_dtype_is_a_choice(env: Any, run: Any) -> None:
    """A KV dtype other than the two the bench runs (auto, fp8) is refused, naming the option."""
    r = run(["plugin_api_vllm.bench", "--kv-cache-dtype", "fp16"], env())
    assert r.returncode == 2 and "argument --kv-cache-dtype" in r.stderr
    assert "'auto', 'fp8'" in r.stderr
