"""The selection report: what `plugin-api list` and `plugin-api doctor` print (text, JSON)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from .._version import HOST_API_VERSION, __version__
from ..device_info import DeviceInfo
from ..errors import PluginApiError
from ..registry import PluginRecord
from ..selection import Selection

_MARK = {"validated": "+", "experimental": "~", "unavailable": "-", "failed": "!", "excluded": "x"}


def record_dict(r: PluginRecord, *, tracebacks: bool = True) -> dict[str, Any]:
    d: dict[str, Any] = {
        "id": r.id,
        "distribution": r.distribution,
        "version": r.version,
        "module": r.module,
        "state": r.state,
        "reasons": list(r.reasons),
        "seconds": round(r.seconds, 6),
    }
    if r.descriptor is not None:
        desc = r.descriptor
        d.update(
            priority=desc.priority,
            host_api=desc.host_api,
            families=[str(f) for f in desc.families],
            device_kinds=list(desc.device_kinds),
            summary=desc.summary,
            settings=list(desc.settings),
        )
    a = r.availability
    if a is not None:
        d["device_type"] = a.device_type
        if r.probe is not None and r.probe is not a:
            d["hardware"] = {"status": str(r.probe.status), "reasons": list(r.probe.reasons)}
    if r.failure is not None:
        d["failure"] = {"stage": r.failure.stage, "message": r.failure.message}
        if tracebacks:
            d["failure"]["traceback"] = r.failure.traceback
    return d


def host_dict() -> dict[str, str]:
    return {"version": __version__, "api": HOST_API_VERSION}


def selection_dict(sel: Selection) -> dict[str, Any]:
    d = asdict(sel)
    d["status"] = str(sel.status)
    return d


def error_dict(e: PluginApiError) -> dict[str, Any]:
    return {
        "type": type(e).__name__,
        "message": str(e),
        "backend": e.backend,
        "reasons": list(e.reasons),
    }


def _machine_line(info: DeviceInfo) -> str:
    torch = f"torch {info.torch.version}" if info.torch else "torch not installed"
    isa = [
        f for f in ("amx_bf16", "avx512f", "avx2", "sve2", "sve", "asimd") if f in info.cpu_flags
    ]
    cpu = f"{info.machine} {info.cpu_model or 'CPU'} ({info.cpu_count} cpus"
    cpu += f", {'/'.join(isa[:2])})" if isa else ")"
    return f"{cpu} · {torch}"


def plugins_table(records: Sequence[PluginRecord], *, verbose: bool = False) -> str:
    rows = []
    for r in records:
        dist = f"{r.distribution} {r.version}"
        fams = ",".join(str(f) for f in r.descriptor.families) if r.descriptor else ""
        head = f"  {_MARK.get(r.state, '?')} {r.id:<13} {r.state:<12} {dist:<30} {fams or '-'}"
        rows.append(head)
        rows.extend(f"      {reason}" for reason in r.reasons)
        if verbose and r.failure is not None and r.failure.traceback:
            rows.extend("      | " + ln for ln in r.failure.traceback.rstrip().splitlines())
    return "\n".join(rows)


def list_text(records: Sequence[PluginRecord], info: DeviceInfo, *, verbose: bool = False) -> str:
    head = f"plugin-api {__version__} (host API {HOST_API_VERSION}) · {_machine_line(info)}"
    accel = ", ".join(f"{a.name} ({a.arch})" for a in info.accelerators) or "none"
    return (
        f"{head}\naccelerators: {accel}\n\nplugins (id, state, distribution, op families)\n"
        + plugins_table(records, verbose=verbose)
    )


def selection_text(sel: Selection) -> str:
    lines = [f"chosen: {sel.backend} on {sel.device_type} ({sel.status}) — {sel.reason}"]
    lines.extend(f"note: {n}" for n in sel.notes)
    if sel.strict:
        lines.append("strict: PLUGIN_API_STRICT=1, every op-level fallback is an error")
    return "\n".join(lines)
