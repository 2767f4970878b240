"""Real installed distributions for tests: a dist-info with entry points, on ``sys.path``.

importlib-metadata finds them exactly like pip-installed plugins, so discovery, loading and
failure handling run through the real code paths.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

GOOD_DESCRIPTOR = """
from plugin_api.contract import BackendDescriptor
DESCRIPTOR = BackendDescriptor(
    id={id!r}, host_api={host_api!r}, priority={priority}, families=("quant",),
    device_kinds=("cpu",), hooks={hooks!r}, summary="test fixture",
    settings={settings!r},
)
"""

GOOD_HOOKS = """
from plugin_api import Availability, Status, hookimpl
STATUS = "{status}"
@hookimpl
def plugin_api_probe(info):
    if STATUS == "unavailable":
        return Availability.unavailable("fixture says unavailable")
    return Availability(Status(STATUS), ("fixture says " + STATUS,), "cpu")
@hookimpl
def plugin_api_implementations(family):
    from plugin_api.reference.quant import ReferenceQuant
    q = ReferenceQuant()
    q.name = "{id}:quant"
    return (q,)
"""


def write_plugin(
    root: Path,
    *,
    dist: str,
    backend_id: str,
    package: str,
    version: str = "1.0",
    descriptor: str | None = None,
    hooks: str | None = None,
    status: str = "validated",
    priority: int = 50,
    host_api: str = ">=1.0,<2",
    settings: tuple[str, ...] = (),
    fields: dict[str, object] | None = None,
) -> Path:
    """Write package ``package`` and its dist-info declaring entry point ``backend_id``.

    ``descriptor``/``hooks`` are ``str.format`` templates; ``fields`` adds names to them."""
    pkg = root / package
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text("")
    fmt = dict(
        id=backend_id,
        host_api=host_api,
        priority=priority,
        status=status,
        hooks=f"{package}.hooks",
        settings=settings,
        **(fields or {}),
    )
    (pkg / "descriptor.py").write_text(
        textwrap.dedent(descriptor if descriptor is not None else GOOD_DESCRIPTOR).format(**fmt)
    )
    (pkg / "hooks.py").write_text(
        textwrap.dedent(hooks if hooks is not None else GOOD_HOOKS).format(**fmt)
    )
    info = root / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(
        f"[plugin_api.backends]\n{backend_id} = {package}.descriptor\n"
    )
    return pkg
