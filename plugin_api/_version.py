"""Versions of the host: the distribution release and the plugin-facing API.

The release version is written once, as ``version`` in the host's pyproject.toml (as every
distribution in this repository does). Installed code reads it back from the distribution's
metadata, which pip writes from that field for wheels and editable installs alike; a source tree
that was never installed reads the pyproject.toml beside the package.
"""

from __future__ import annotations

import re
from pathlib import Path

import importlib_metadata

DISTRIBUTION = "plugin-api"

# The API plugins are written against. Plugins declare a range of it in their descriptor;
# bump the major version when a hookspec or an op protocol changes incompatibly.
HOST_API_VERSION = "1.0"

_PROJECT_TABLE = re.compile(r"^\[project\][ \t]*$(.*?)(?=^\[|\Z)", re.MULTILINE | re.DOTALL)
_FIELD = r'^{}[ \t]*=[ \t]*"([^"]*)"'


def source_tree_version(pyproject: Path) -> str:
    """``[project] version`` of ``pyproject``, which must be the host's (``name = "plugin-api"``).

    A line-level read of the two string fields, because tomllib is 3.11+ and this runs at import.
    """
    table = _PROJECT_TABLE.search(pyproject.read_text(encoding="utf-8"))
    fields = {
        key: m[1]
        for key in ("name", "version")
        if table and (m := re.search(_FIELD.format(key), table[1], re.MULTILINE))
    }
    if fields.get("name") != DISTRIBUTION or "version" not in fields:
        raise RuntimeError(
            f"{pyproject} has no [project] version for {DISTRIBUTION!r}; "
            "install the host (pip install -e .) or run it from its source tree"
        )
    return fields["version"]


def _host_version() -> str:
    try:
        return importlib_metadata.version(DISTRIBUTION)
    except importlib_metadata.PackageNotFoundError:  # a source tree that was never installed
        return source_tree_version(Path(__file__).resolve().parent.parent / "pyproject.toml")


__version__ = _host_version()
