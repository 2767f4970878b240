"""The CLI as a user runs it: separate processes, real environment variables."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from plugin_api.ops.huge_pages import kv_cache_pages, thp_mode

from .distributions import write_plugin

ALL_IDS = {"reference", "cpu-arm-acl", "xpu", "cuda-sm90", "rocm"}


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("PLUGIN_API_")}
    return subprocess.run(
        [sys.executable, "-m", "plugin_api", *args],
        capture_output=True,
        text=True,
        env=base | (env or {}),
        timeout=120,
    )


def test_doctor_json_on_this_machine():
    r = cli("doctor", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["selection"]["backend"] == "reference"
    assert {p["id"] for p in data["plugins"]} == ALL_IDS
    for p in data["plugins"]:
        assert p["state"] in ("validated", "experimental", "unavailable") and p["reasons"], p
    layers = [layer for m in data["ops"] for layer in m["layers"]]
    assert {layer["family"] for layer in layers} == {"attention", "gemm", "quant", "state"}
    for layer in layers:
        assert layer["chosen"]["path"] == "reference", layer
        if layer["family"] == "attention":
            assert layer["graph"]["level"] == "NEVER" and layer["graph"]["reason"]
    # a CPU backend: the report says whether KV caches get huge pages on this kernel
    assert data["kv_cache_pages"] == kv_cache_pages(thp_mode())


def test_doctor_text_is_readable():
    r = cli("doctor")
    assert r.returncode == 0
    assert "chosen: reference on cpu (validated)" in r.stdout
    assert "CUDA graphs for the model: NEVER" in r.stdout


def test_named_backend_unavailable_exits_with_probe_reasons():
    r = cli("doctor", env={"PLUGIN_API_BACKEND": "cuda-sm90"})
    assert r.returncode == 1
    assert "PLUGIN_API_BACKEND='cuda-sm90' is unavailable here (no fallback is made)" in r.stdout
    assert "is not a CUDA build" in r.stdout


def test_unknown_backend_lists_installed_ids():
    r = cli("doctor", env={"PLUGIN_API_BACKEND": "nosuch"})
    assert r.returncode == 1
    assert "PLUGIN_API_BACKEND='nosuch' is not installed. Installed: cpu-arm-acl, cuda-sm90, " in (
        r.stdout
    )
    assert "reference, rocm, xpu." in r.stdout


def test_unknown_variable_is_refused():
    r = cli("doctor", env={"PLUGIN_API_BACKNED": "xpu"})
    assert r.returncode == 2
    assert "Did you mean PLUGIN_API_BACKEND?" in r.stderr


def test_what_if_h200():
    r = cli("doctor", "--json", "--device-info", "h200")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["what_if"] is True
    cuda = next(p for p in data["plugins"] if p["id"] == "cuda-sm90")
    assert cuda["state"] == "validated" and data["selection"]["backend"] == "cuda-sm90"
    assert "kv_cache_pages" not in data  # this kernel's THP mode says nothing of that machine


def test_what_if_from_a_file(tmp_path: Path):
    from plugin_api.machines import MACHINES

    f = tmp_path / "mi300x.json"
    f.write_text(MACHINES["mi300x"].to_json())
    data = json.loads(cli("list", "--json", "--device-info", str(f)).stdout)
    rocm = next(p for p in data["plugins"] if p["id"] == "rocm")
    assert rocm["state"] == "validated"  # with op families, the probe verdict is the state


def test_bad_device_info_file(tmp_path: Path):
    f = tmp_path / "x.json"
    f.write_text('{"machine": "x86_64", "gpu": "H200"}')
    r = cli("doctor", "--device-info", str(f))
    assert r.returncode == 2 and "unknown keys ['gpu']" in r.stderr


def test_list_json():
    data = json.loads(cli("list", "--json").stdout)
    assert {p["id"] for p in data["plugins"]} == ALL_IDS
    assert data["host"]["api"] == "1.0"


def test_check_json_runs_the_kit_and_reports_ops():
    r = cli("check", "--json")
    assert r.returncode == 0, r.stdout[-2000:]
    data = json.loads(r.stdout)
    assert data["passed"] and data["backend"] == "reference" and data["cases"] is None
    assert set(data["families"]) == {"attention", "gemm", "quant", "state"}
    assert all(k.startswith("reference:") for p in data["paths"].values() for k in p)
    assert data["ops"][0]["layers"][0]["graph"]["level"] == "NEVER"


def test_check_k_runs_a_named_subset_and_says_so():
    r = cli("check", "--json", "-k", "quant")
    assert r.returncode == 0, r.stdout[-2000:]
    data = json.loads(r.stdout)
    assert data["passed"] and data["cases"] == "quant" and set(data["families"]) == {"quant"}
    text = cli("check", "-k", "quant").stdout
    assert "conformance kit on reference (only the cases matching -k 'quant'):" in text


def test_check_k_matching_nothing_fails():
    r = cli("check", "-k", "no_such_case")
    assert r.returncode == 5
    assert "no kit case matches -k 'no_such_case'" in r.stdout and "result: FAIL" in r.stdout


@pytest.mark.parametrize("expr", ["", "  "])
def test_check_k_refuses_an_empty_expression(expr):
    r = cli("check", "-k", expr)
    assert r.returncode == 2
    assert "argument -k: an empty expression selects every case" in r.stderr


SELECT = """
import json, warnings, plugin_api
from plugin_api.selection import process_selection
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    sel = plugin_api.select_backend()
    plugin_api.select_backend()
registry = process_selection().registry
print(json.dumps({"selection": sel.to_json(), "warnings": [str(x.message) for x in w],
                  "probed": [r.id for r in registry.records if r.probe is not None],
                  "machine": registry.info.to_json()}))
"""


def run_select(env: dict[str, str], site: Path | None = None) -> dict:
    base = {k: v for k, v in os.environ.items() if not k.startswith("PLUGIN_API_")}
    if site is not None:
        base["PYTHONPATH"] = str(site)
    r = subprocess.run(
        [sys.executable, "-c", SELECT], capture_output=True, text=True, env=base | env, timeout=120
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_serialised_selection_is_reused_without_probing():
    first = run_select({})
    assert "reference" in first["probed"]
    second = run_select({"PLUGIN_API_SELECTION": first["selection"]})
    assert second["selection"] == first["selection"]
    assert second["probed"] == []
    # a worker reusing the selection decides ops on the machine the choice was made for
    assert second["machine"] == first["machine"]
    assert json.loads(second["machine"])["machine"] != "(not read)"


def test_stale_serialised_selection_is_refused():
    first = json.loads(run_select({})["selection"])
    first["host_api"] = "0.9"
    base = {k: v for k, v in os.environ.items() if not k.startswith("PLUGIN_API_")}
    r = subprocess.run(
        [sys.executable, "-c", SELECT],
        capture_output=True,
        text=True,
        env=base | {"PLUGIN_API_SELECTION": json.dumps(first)},
    )
    assert r.returncode != 0 and "made by host API 0.9" in r.stderr


@pytest.mark.parametrize("status", ["experimental"])
def test_experimental_backend_warns_once(tmp_path: Path, status: str):
    site = tmp_path / "site"
    site.mkdir()
    write_plugin(site, dist="fx-exp", backend_id="fx-exp", package="fx_exp", status=status)
    out = run_select({"PLUGIN_API_BACKEND": "fx-exp"}, site)
    assert json.loads(out["selection"])["backend"] == "fx-exp"
    assert out["warnings"] == ["fx-exp is experimental on this machine (runs, not validated)"]
    # a worker process reusing the choice does not warn again: once per selection, not per process
    worker = run_select({"PLUGIN_API_SELECTION": out["selection"]}, site)
    assert worker["selection"] == out["selection"]
    assert worker["probed"] == [] and worker["warnings"] == []


def test_list_refuses_an_implementation_lacking_a_protocol_method(tmp_path: Path):
    site = tmp_path / "site"
    site.mkdir()
    hooks = """
from plugin_api import Availability, hookimpl
from plugin_api.contract.decision import Decision, ImplPath
class HalfQuant:
    name = "fx-half:quant"
    path = ImplPath.TORCH
    def supports(self, spec, info):
        return Decision.accept("fixture")
@hookimpl
def plugin_api_probe(info):
    return Availability.validated("cpu", "fixture says validated")
@hookimpl
def plugin_api_implementations(family):
    return (HalfQuant(),)
"""
    write_plugin(site, dist="fx-half", backend_id="fx-half", package="fx_half", hooks=hooks)
    env = {"PYTHONPATH": str(site)}
    r = cli("list", "--json", env=env)
    assert r.returncode == 0, r.stderr
    rec = next(p for p in json.loads(r.stdout)["plugins"] if p["id"] == "fx-half")
    assert rec["state"] == "failed"
    assert rec["reasons"] == [
        "conform: fx-half: quant implementation(s) do not follow "
        "plugin_api.ops.quant.QuantImplementation: fx_half.hooks.HalfQuant: lacks method "
        "quantize(spec, x, eps, out_q, out_scales)"
    ]
    text = cli("list", env=env).stdout
    assert "lacks method quantize(spec, x, eps, out_q, out_scales)" in text
    # asking for it by name is refused with the same reason, and nothing falls back
    r = cli("doctor", env=env | {"PLUGIN_API_BACKEND": "fx-half"})
    assert r.returncode != 0
    said = r.stdout + r.stderr
    assert "PLUGIN_API_BACKEND='fx-half' failed to load" in said
    assert "lacks method quantize" in said


@pytest.mark.parametrize(
    "env,checks",
    [
        ({}, False),
        ({"PLUGIN_API_CHECK_SLOT_MAPPING": "1"}, True),
        ({"PLUGIN_API_STRICT": "1"}, True),
    ],
    ids=["default", "setting", "strict"],
)
def test_doctor_says_whether_plan_checks_slot_mapping(env, checks):
    r = cli("doctor", "--json", env=env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["selection"]["checks_slot_mapping"] is checks
    text = cli("doctor", env=env).stdout
    line = next(ln for ln in text.splitlines() if ln.startswith("batch check:"))
    assert ("not checked" not in line) is checks, line
