"""Engine integrations (entry-point group ``plugin_api.integrations``) as the doctor reports them:
each one's status, and a status hook that fails shown with its error instead of dropped."""

from __future__ import annotations

from pathlib import Path

from plugin_api.integrations import integrations, integrations_text


def write_integration(root: Path, *, name: str, package: str, body: str) -> None:
    pkg = root / package
    pkg.mkdir()
    (pkg / "__init__.py").write_text(body)
    info = root / f"{package}-2.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\nVersion: 2.0\n")
    (info / "entry_points.txt").write_text(
        f"[plugin_api.integrations]\n{name} = {package}:status\n"
    )


def test_integrations_report_status_and_failures(site: Path) -> None:
    write_integration(
        site,
        name="fx-engine",
        package="fx_engine_ok",
        body="def status():\n    return {'state': 'ready', 'engine': 'fx 1.0'}\n",
    )
    write_integration(
        site,
        name="fx-broken",
        package="fx_engine_broken",
        body="def status():\n    raise RuntimeError('cannot read the engine version')\n",
    )
    found = {e["name"]: e for e in integrations()}
    assert found["fx-engine"] == {
        "name": "fx-engine",
        "distribution": "fx_engine_ok 2.0",
        "state": "ready",
        "engine": "fx 1.0",
    }
    broken = found["fx-broken"]["state"]
    assert broken == "failed: RuntimeError: cannot read the engine version"
    text = integrations_text(list(found.values()))
    assert "fx-broken" in text and "failed: RuntimeError" in text and "engine: fx 1.0" in text
