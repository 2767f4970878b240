"""What ``plugin-api --version`` prints: the host, its API version, and every installed plugin and
integration with theirs.

Read from package metadata and plugin descriptors only: no plugin's hooks, probe or kernel module
is imported, so the answer comes even where a plugin cannot load or run.
"""

from __future__ import annotations

import platform
from collections.abc import Iterable
from typing import Any

import importlib_metadata

from .._version import DISTRIBUTION, HOST_API_VERSION, __version__
from ..device_info import dist_name_version, installed_version
from ..integrations import GROUP as INTEGRATIONS_GROUP
from ..registry import REFERENCE_ID, PluginEntry, discover, read_descriptor
from ..settings import Settings


def _plugin(entry: PluginEntry, allowed: frozenset[str] | None) -> dict[str, Any]:
    d: dict[str, Any] = {
        "id": entry.id,
        "distribution": entry.distribution,
        "version": entry.version,
    }
    if allowed is not None and entry.id not in allowed:  # nothing of it may be imported
        return d | {"excluded": "excluded by PLUGIN_API_PLUGINS"}
    try:
        desc = read_descriptor(entry)
    except Exception as e:  # a broken descriptor is shown with its error, never dropped
        return d | {"error": f"describe: {type(e).__name__}: {e}"}
    return d | {"host_api": desc.host_api, "supports_host": desc.supports_host(HOST_API_VERSION)}


def _integration(ep: importlib_metadata.EntryPoint) -> dict[str, Any]:
    name, version = dist_name_version(ep.dist)
    d: dict[str, Any] = {"name": ep.name, "distribution": name, "version": version}
    try:  # the integration's light status hook: metadata only, never the engine itself
        status = dict(ep.load()())
    except Exception as e:
        return d | {"error": f"status: {type(e).__name__}: {e}"}
    return d | {"engine": str(status.get("engine", "-"))}


def version_report(settings: Settings) -> dict[str, Any]:
    """The versions as plain data (``plugin-api --version --json``)."""
    entries, conflicts = discover()
    allowed = settings.plugins | {REFERENCE_ID} if settings.plugins is not None else None
    plugins = [_plugin(e, allowed) for e in entries]
    plugins += [
        {"id": c.id, "distribution": c.distribution, "version": c.version, "error": c.reasons[0]}
        for c in conflicts
    ]
    eps = sorted(importlib_metadata.entry_points(group=INTEGRATIONS_GROUP), key=lambda e: e.name)
    return {
        "host": {"distribution": DISTRIBUTION, "version": __version__, "api": HOST_API_VERSION},
        "python": platform.python_version(),
        "torch": installed_version("torch"),
        "plugins": sorted(plugins, key=lambda p: (p["id"], p["distribution"])),
        "integrations": [_integration(ep) for ep in eps],
    }


def _rows(rows: Iterable[tuple[str, str, str]]) -> list[str]:
    return [f"  {a:<14} {b:<32} {c}".rstrip() for a, b, c in rows]


def _api_column(p: dict[str, Any]) -> str:
    if "host_api" not in p:
        return str(p.get("excluded") or f"failed: {p['error']}")
    if p["supports_host"]:
        return str(p["host_api"])
    return f"{p['host_api']} (not this host's API {HOST_API_VERSION}: it will not load)"


def version_text(report: dict[str, Any]) -> str:
    host = report["host"]
    torch = f"torch {report['torch']}" if report["torch"] else "torch not installed"
    lines = [
        f"{host['distribution']} {host['version']} (host API {host['api']}) · "
        f"Python {report['python']} · {torch}",
        "",
        "plugins (backend id, distribution, host API range it supports)",
        *_rows(
            (p["id"], f"{p['distribution']} {p['version']}", _api_column(p))
            for p in report["plugins"]
        ),
        "",
    ]
    if not report["integrations"]:
        return "\n".join([*lines, "integrations: none installed"])
    return "\n".join(
        [
            *lines,
            "integrations (name, distribution, engine it bridges)",
            *_rows(
                (i["name"], f"{i['distribution']} {i['version']}", i.get("engine") or i["error"])
                for i in report["integrations"]
            ),
        ]
    )
