"""One version per distribution, written once (``[project] version`` in its pyproject.toml), and
``plugin-api --version`` reporting what is installed, through the real CLI."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import importlib_metadata
import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.version import Version

import plugin_api
from plugin_api._version import HOST_API_VERSION, source_tree_version

from .distributions import write_plugin
from .test_cli import cli

ROOT = Path(__file__).resolve().parent.parent
PYPROJECTS = sorted(
    [
        ROOT / "pyproject.toml",
        *ROOT.glob("plugins/*/pyproject.toml"),
        *ROOT.glob("integrations/*/pyproject.toml"),
        *ROOT.glob("docs/examples/*/pyproject.toml"),
    ]
)


def project(pyproject: Path) -> dict[str, Any]:
    table: dict[str, Any] = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    return table


def host_version() -> str:
    return str(project(ROOT / "pyproject.toml")["version"])


def packages_of(pyproject: Path) -> list[Path]:
    """The import packages a distribution ships (``tool.setuptools.packages.find.include``)."""
    config = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    include = config["tool"]["setuptools"]["packages"]["find"]["include"]
    return [pyproject.parent / pattern.rstrip("*") for pattern in include]


# ---- one source -----------------------------------------------------------------------------


def test_the_repository_has_every_distribution():
    names = {str(project(p)["name"]) for p in PYPROJECTS}
    assert {
        "plugin-api",
        "plugin-api-cpu-arm-acl",
        "plugin-api-cuda-sm90",
        "plugin-api-rocm",
        "plugin-api-xpu",
        "plugin-api-vllm",
        "plugin-api-example",
    } <= names


@pytest.mark.parametrize("pyproject", PYPROJECTS, ids=lambda p: str(p.parent.relative_to(ROOT)))
def test_each_distribution_writes_its_version_once(pyproject: Path):
    """The pyproject's static ``version`` is the only literal: no package assigns a string to
    ``__version__`` (code reads the installed metadata), and the version is not dynamic (the docs
    checks and the release procedure read it from the pyproject)."""
    proj = project(pyproject)
    assert "version" not in proj.get("dynamic", []), pyproject
    Version(str(proj["version"]))  # a PEP 440 version, or this raises
    literals = []
    for package in packages_of(pyproject):
        for source in package.rglob("*.py"):
            for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
                if (
                    isinstance(node, ast.Assign)
                    and any(isinstance(t, ast.Name) and t.id == "__version__" for t in node.targets)
                    and isinstance(node.value, ast.Constant)
                ):
                    literals.append(f"{source.relative_to(ROOT)}:{node.lineno}")
    assert literals == [], f"a second copy of the version; read the metadata instead: {literals}"


@pytest.mark.parametrize("pyproject", PYPROJECTS, ids=lambda p: str(p.parent.relative_to(ROOT)))
def test_installed_metadata_is_the_pyproject_version(pyproject: Path):
    """An editable install keeps the version it was installed with: after a bump, reinstall."""
    proj = project(pyproject)
    try:
        installed = importlib_metadata.version(str(proj["name"]))
    except importlib_metadata.PackageNotFoundError:
        if proj["name"] == "plugin-api":
            raise
        pytest.skip(f"{proj['name']} is not installed in this environment")
    assert installed == proj["version"], (
        f"{proj['name']} is installed as {installed} but {pyproject.relative_to(ROOT)} says "
        f"{proj['version']}: pip install -e {pyproject.parent.relative_to(ROOT)} --no-deps"
    )


def test_host_version_attribute_is_the_pyproject_version():
    assert plugin_api.__version__ == host_version()


@pytest.mark.parametrize("pyproject", PYPROJECTS, ids=lambda p: str(p.parent.relative_to(ROOT)))
def test_source_tree_reading_agrees_with_tomllib(pyproject: Path):
    """What an uninstalled source tree reads for the host's version, checked against a full TOML
    parser; any other distribution's pyproject is refused by name."""
    proj = project(pyproject)
    if proj["name"] == "plugin-api":
        assert source_tree_version(pyproject) == proj["version"]
    else:
        with pytest.raises(RuntimeError, match="no \\[project\\] version for 'plugin-api'"):
            source_tree_version(pyproject)


def test_source_tree_reading_takes_the_project_table_only(tmp_path: Path):
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(
        '[tool.other]\nversion = "9.9.9"\n\n[project]\nname = "plugin-api"\n'
        'dependencies = [\n    "x",\n]\nversion = "1.2.3"\n\n[tool.x]\nversion = "8.8.8"\n'
    )
    assert source_tree_version(pyproject) == "1.2.3"
    pyproject.write_text('[project]\nname = "plugin-api"\n\n[tool.x]\nversion = "8.8.8"\n')
    with pytest.raises(RuntimeError, match="no \\[project\\] version"):
        source_tree_version(pyproject)


@pytest.mark.parametrize("pyproject", PYPROJECTS, ids=lambda p: str(p.parent.relative_to(ROOT)))
def test_dependents_admit_the_host_version(pyproject: Path):
    """Bumping the host past a distribution's ``plugin-api`` range must widen that range too: in
    the pyproject, and in the installed metadata where the dependencies are dynamic (setup.py)."""
    proj = project(pyproject)
    declared = list(proj.get("dependencies", []))
    try:
        declared += importlib_metadata.requires(proj["name"]) or []
    except importlib_metadata.PackageNotFoundError:
        assert "dependencies" not in proj.get("dynamic", []), f"install {proj['name']} to check"
    for req in map(Requirement, declared):
        if req.name == "plugin-api":
            assert req.specifier.contains(host_version(), prereleases=True), (
                f"{proj['name']} requires {req}; the host is {host_version()}"
            )


def test_changelog_releases_are_not_ahead_of_the_host():
    """Keep a Changelog: an Unreleased section on top, then released versions, newest first,
    none newer than the version the host's pyproject carries."""
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    headings = re.findall(r"^## \[([^\]]+)\](.*)$", text, re.MULTILINE)
    assert headings and headings[0][0] == "Unreleased", headings[:1]
    for v, rest in headings[1:]:
        assert re.fullmatch(r" - \d{4}-\d{2}-\d{2}", rest), f"## [{v}]{rest}: add ' - YYYY-MM-DD'"
    released = [Version(v) for v, _ in headings[1:]]
    assert released == sorted(released, reverse=True)
    assert all(v <= Version(host_version()) for v in released), (released, host_version())


# ---- plugin-api --version -----------------------------------------------------------------


def test_version_json_reports_every_installed_distribution():
    r = cli("--version", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["host"] == {
        "distribution": "plugin-api",
        "version": host_version(),
        "api": HOST_API_VERSION,
    }
    assert data["torch"] == importlib_metadata.version("torch")
    eps = importlib_metadata.entry_points(group="plugin_api.backends")
    assert [p["id"] for p in data["plugins"]] == sorted(e.name for e in eps)
    for p in data["plugins"]:
        assert p["version"] == importlib_metadata.version(p["distribution"]), p
        assert p["supports_host"] is True, p
        descriptor = next(e for e in eps if e.name == p["id"]).load().DESCRIPTOR
        assert p["host_api"] == descriptor.host_api
    # in-repo plugins report the versions their pyprojects carry
    in_repo = {str(project(p)["name"]): str(project(p)["version"]) for p in PYPROJECTS}
    for p in data["plugins"]:
        if p["distribution"] in in_repo:
            assert p["version"] == in_repo[p["distribution"]]
    integrations = importlib_metadata.entry_points(group="plugin_api.integrations")
    assert [i["name"] for i in data["integrations"]] == sorted(e.name for e in integrations)
    for i in data["integrations"]:
        assert i["version"] == importlib_metadata.version(i["distribution"]), i
        assert i.get("engine"), i


def test_version_text_names_host_api_plugins_and_integrations():
    r = cli("--version")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith(f"plugin-api {host_version()} (host API {HOST_API_VERSION})")
    for ep in importlib_metadata.entry_points(group="plugin_api.backends"):
        dist = ep.dist
        assert dist is not None
        row = next(line for line in lines if line.split()[:1] == [ep.name])
        assert f"{dist.metadata['Name']} {dist.version}" in row, row
    for ep in importlib_metadata.entry_points(group="plugin_api.integrations"):
        assert any(line.split()[:1] == [ep.name] for line in lines), lines


def test_version_reads_descriptors_only(tmp_path: Path):
    """A plugin built for another host API is listed with its range, a broken descriptor with its
    error, an excluded plugin without importing it; no hooks module is imported on the way."""
    site = tmp_path / "site"
    marker = tmp_path / "hooks-imported"
    hooks = f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n"
    write_plugin(
        site, dist="fx-next", backend_id="fx-next", package="fx_next", version="3.1.4",
        host_api=">=2,<3", hooks=hooks,
    )  # fmt: skip
    write_plugin(
        site, dist="fx-broken", backend_id="fx-broken", package="fx_broken", version="0.0.1",
        descriptor="raise ImportError('no such library')", hooks=hooks,
    )  # fmt: skip
    env = {"PYTHONPATH": str(site)}
    r = cli("--version", "--json", env=env)
    assert r.returncode == 0, r.stderr
    by_id = {p["id"]: p for p in json.loads(r.stdout)["plugins"]}
    assert by_id["fx-next"] == {
        "id": "fx-next",
        "distribution": "fx-next",
        "version": "3.1.4",
        "host_api": ">=2,<3",
        "supports_host": False,
    }
    assert by_id["fx-broken"]["error"] == "describe: ImportError: no such library"
    text = cli("--version", env=env).stdout
    assert f"(not this host's API {HOST_API_VERSION}: it will not load)" in text
    assert "failed: describe: ImportError: no such library" in text
    # PLUGIN_API_PLUGINS leaves fx-broken out: listed, its descriptor not imported
    r = cli("--version", "--json", env=env | {"PLUGIN_API_PLUGINS": "fx-next"})
    assert r.returncode == 0, r.stderr
    broken = next(p for p in json.loads(r.stdout)["plugins"] if p["id"] == "fx-broken")
    assert broken == {
        "id": "fx-broken",
        "distribution": "fx-broken",
        "version": "0.0.1",
        "excluded": "excluded by PLUGIN_API_PLUGINS",
    }
    assert not marker.exists(), "plugin-api --version imported a plugin's hooks module"


def test_version_imports_no_plugin_module_past_its_descriptor():
    code = """
import contextlib, io, json, sys
from plugin_api.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    assert main(["--version"]) == 0
print(json.dumps(sorted(m for m in sys.modules if m.startswith("plugin_api_"))))
"""
    base = {k: v for k, v in os.environ.items() if not k.startswith("PLUGIN_API_")}
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=base, timeout=120
    )
    assert r.returncode == 0, r.stderr
    loaded = json.loads(r.stdout.splitlines()[-1])
    # the integration's status hook reads metadata through its versions module
    light = {"plugin_api_vllm.status", "plugin_api_vllm.versions"}
    heavy = [m for m in loaded if "." in m and not m.endswith(".descriptor") and m not in light]
    assert heavy == [], heavy


@pytest.mark.parametrize(
    "args",
    [(), ("--version", "list"), ("--json", "list"), ("--json",)],
    ids=lambda a: " ".join(a) or "no-arguments",
)
def test_version_or_a_verb(args: tuple[str, ...]):
    r = cli(*args)
    assert r.returncode == 2
    assert "give a verb, or --version alone (plugin-api --version [--json])" in r.stderr


def test_torch_finds_numpy_through_the_hosts_dependencies():
    """torch warns "Failed to initialize NumPy" at import where numpy is absent, so the host
    declares it; the installed numpy meets that range and no command prints the warning."""
    requires = [Requirement(r) for r in importlib_metadata.requires("plugin-api") or []]
    numpy = next((r for r in requires if r.name == "numpy"), None)
    assert numpy is not None, "plugin-api does not declare numpy"
    assert numpy.specifier.contains(importlib_metadata.version("numpy"))
    r = cli("--version")
    assert r.returncode == 0 and "NumPy" not in r.stderr, r.stderr
