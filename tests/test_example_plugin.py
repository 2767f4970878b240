"""The worked example of docs/writing-a-plugin.md, installed by pip like any plugin: it passes the
conformance kit and shows up in ``plugin-api doctor``; a host-API mismatch stops it at the
descriptor."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import importlib_metadata
import pytest

EXAMPLE = Path(__file__).resolve().parent.parent / "docs" / "examples" / "plugin-api-example"


def pip_install(src: Path, target: Path) -> None:
    """A real ``pip install`` (wheel built by setuptools) into ``target``, offline."""
    r = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
         "--no-deps", "--no-build-isolation", "--no-index", "--target", str(target), str(src)],
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr


def copy_example(dest: Path) -> Path:
    """pip builds in the source folder: build from a copy so the repository stays clean."""
    ignore = shutil.ignore_patterns("build", "*.egg-info", "__pycache__")
    return Path(shutil.copytree(EXAMPLE, dest / "plugin-api-example", ignore=ignore))


@pytest.fixture(scope="module")
def example_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    site = tmp_path_factory.mktemp("site")
    pip_install(copy_example(tmp_path_factory.mktemp("src")), site)
    return site


def run(site: Path, *args: str, env: dict[str, str] | None = None, cwd: Path | None = None):
    base = {k: v for k, v in os.environ.items() if not k.startswith("PLUGIN_API_")}
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        env=base | {"PYTHONPATH": str(site)} | (env or {}),
        cwd=cwd,
        timeout=600,
    )


def doctor(site: Path, **env: str) -> dict:
    r = run(site, "-m", "plugin_api", "doctor", "--json", env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout)


def test_pip_installs_a_distribution_with_the_entry_point(example_site: Path):
    (dist,) = importlib_metadata.distributions(path=[str(example_site)])
    assert (dist.metadata["Name"], dist.version) == ("plugin-api-example", "0.1.0")
    (ep,) = dist.entry_points.select(group="plugin_api.backends")
    assert (ep.name, ep.value) == ("example", "plugin_api_example.descriptor")


def test_the_conformance_kit_passes(example_site: Path, tmp_path: Path):
    r = run(example_site, "-m", "pytest", "--plugin-api-backend=example", "-q",
            "-p", "no:cacheprovider", cwd=tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "plugin-api conformance: example" in r.stdout
    ran = re.search(r"^quant\s+torch:example:chunked-int8 x(\d+)$", r.stdout, re.M)
    assert ran and int(ran[1]) > 0, "the example's own quant implementation must run"
    assert "only fallbacks ran" not in r.stdout
    passed = re.search(r"(\d+) passed", r.stdout)
    assert passed and int(passed[1]) >= int(ran[1])


def test_doctor_lists_it_and_auto_selection_leaves_it_alone(example_site: Path):
    data = doctor(example_site)
    (rec,) = [p for p in data["plugins"] if p["id"] == "example"]
    assert rec["state"] == "experimental" and rec["distribution"] == "plugin-api-example"
    assert rec["version"] == "0.1.0" and rec["families"] == ["quant"]
    assert rec["host_api"] == ">=1.0,<2" and "not validated" in rec["reasons"][0]
    assert data["selection"]["backend"] == "reference"
    assert any("PLUGIN_API_BACKEND=example" in n for n in data["selection"]["notes"])


def test_doctor_resolves_quant_layers_to_it_with_reasons(example_site: Path):
    data = doctor(example_site, PLUGIN_API_BACKEND="example")
    assert data["selection"]["backend"] == "example"
    quant = {
        layer["spec"]: layer
        for m in data["ops"]
        for layer in m["layers"]
        if layer["family"] == "quant"
    }
    int8 = quant["K=14336 group=14336 bf16->int8"]
    assert int8["chosen"] == {
        "impl": "example:chunked-int8", "path": "torch", "backend": "example", "fallback": False
    }  # fmt: skip
    fp8 = quant["K=7168 group=128 bf16->fp8 col-major ue8m0"]
    assert fp8["chosen"]["fallback"] and fp8["chosen"]["backend"] == "reference"
    (rejected,) = [c for c in fp8["trace"] if c["impl"] == "example:chunked-int8"]
    assert not rejected["accepted"] and "dtype=fp8" in rejected["reason"]


LOAD = """
import json, sys
from plugin_api.registry import load_plugins
from plugin_api.settings import read_settings
rec = load_plugins(read_settings()).record("example")
print(json.dumps({"state": rec.state, "reasons": list(rec.reasons),
                  "stage": rec.failure.stage if rec.failure else None,
                  "modules": sorted(m for m in sys.modules if m.startswith("plugin_api_example"))}))
"""


def test_a_host_api_mismatch_stops_at_the_descriptor(tmp_path: Path):
    src = copy_example(tmp_path)
    descriptor = src / "plugin_api_example" / "descriptor.py"
    text = descriptor.read_text()
    assert 'host_api=">=1.0,<2"' in text
    descriptor.write_text(text.replace('host_api=">=1.0,<2"', 'host_api=">=2.0,<3"'))
    site = tmp_path / "site"
    pip_install(src, site)
    r = run(site, "-c", LOAD)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["state"] == "failed" and out["stage"] == "compat"
    assert (
        "supports host API >=2.0,<3" in out["reasons"][0]
        and "provides API 1.0" in out["reasons"][0]
    )
    assert out["modules"] == ["plugin_api_example", "plugin_api_example.descriptor"]


def test_descriptor_and_hooks_import_nothing_heavy(example_site: Path):
    code = (
        "import sys, plugin_api_example.descriptor, plugin_api_example.hooks\n"
        "print(sorted(m for m in ('torch', 'plugin_api_example.quant') if m in sys.modules))"
    )
    r = run(example_site, "-c", code)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr
