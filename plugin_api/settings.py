"""Every ``PLUGIN_API_*`` environment variable, parsed in one place.

Unknown names and empty values are errors: a misspelt variable that is silently ignored is worse
than one that stops the program. Plugins declare the variables they read in their descriptor.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .errors import SettingError

PREFIX = "PLUGIN_API_"

HOST_SETTINGS: dict[str, str] = {
    "PLUGIN_API_BACKEND": "backend id to use, or 'auto' (default) to pick by probe and priority",
    "PLUGIN_API_STRICT": "1 turns every op-level fallback into an error (default 0)",
    "PLUGIN_API_PLUGINS": "comma-separated allow-list of plugin ids to load (default: all)",
    "PLUGIN_API_PROBE_TIMEOUT": "seconds a plugin may take to load and probe (default 10)",
    "PLUGIN_API_SELECTION": "a serialised selection (JSON) to reuse instead of probing",
    "PLUGIN_API_CHECK_SLOT_MAPPING": "1 makes Attention.plan check each step's slot_mapping "
    "against block_table and seq_lens (default 0; always on under PLUGIN_API_STRICT=1)",
}

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})
DEFAULT_PROBE_TIMEOUT = 10.0


@dataclass(frozen=True, slots=True)
class Settings:
    backend: str | None = None  # None means auto
    strict: bool = False
    plugins: frozenset[str] | None = None  # None means every installed plugin
    probe_timeout: float = DEFAULT_PROBE_TIMEOUT
    selection_json: str | None = None
    check_slot_mapping: bool = False


def parse_bool(name: str, value: str) -> bool:
    v = value.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise SettingError(f"{name}={value!r} is not a boolean; use 1 or 0")


def check_names(environ: Mapping[str, str], known: Iterable[str]) -> None:
    """Reject ``PLUGIN_API_*`` variables that neither the host nor a loaded plugin reads."""
    allowed = set(HOST_SETTINGS) | set(known)
    for name in sorted(k for k in environ if k.startswith(PREFIX)):
        if name not in allowed:
            close = difflib.get_close_matches(name, sorted(allowed), n=1)
            hint = f" Did you mean {close[0]}?" if close else ""
            raise SettingError(
                f"{name} is not a plugin-api setting.{hint} Known: {', '.join(sorted(allowed))}"
                " (plugins add their own: see `plugin-api list`)."
            )


def read_settings(environ: Mapping[str, str] | None = None) -> Settings:
    """Parse the host's own settings from ``environ`` (default ``os.environ``).

    Every ``PLUGIN_API_*`` variable that is set must be non-empty. Names are checked against the
    plugins' declarations by ``check_names`` once their descriptors are loaded.
    """
    environ = os.environ if environ is None else environ
    env = {k: v for k, v in environ.items() if k.startswith(PREFIX)}
    for name, value in sorted(env.items()):
        if not value.strip():
            raise SettingError(f"{name} is set but empty; unset it or give a value")
    backend = env.get("PLUGIN_API_BACKEND", "auto").strip()
    plugins = None
    if "PLUGIN_API_PLUGINS" in env:
        ids = [p.strip() for p in env["PLUGIN_API_PLUGINS"].split(",")]
        if any(not p for p in ids):
            raise SettingError(
                f"PLUGIN_API_PLUGINS={env['PLUGIN_API_PLUGINS']!r} has an empty entry"
            )
        plugins = frozenset(ids)
    timeout = DEFAULT_PROBE_TIMEOUT
    if "PLUGIN_API_PROBE_TIMEOUT" in env:
        raw = env["PLUGIN_API_PROBE_TIMEOUT"]
        try:
            timeout = float(raw)
        except ValueError:
            timeout = -1.0
        if not timeout > 0:
            raise SettingError(f"PLUGIN_API_PROBE_TIMEOUT={raw!r} must be a positive number")
    return Settings(
        backend=None if backend == "auto" else backend,
        strict=parse_bool("PLUGIN_API_STRICT", env["PLUGIN_API_STRICT"])
        if "PLUGIN_API_STRICT" in env
        else False,
        plugins=plugins,
        probe_timeout=timeout,
        selection_json=env.get("PLUGIN_API_SELECTION"),
        check_slot_mapping=parse_bool(
            "PLUGIN_API_CHECK_SLOT_MAPPING", env["PLUGIN_API_CHECK_SLOT_MAPPING"]
        )
        if "PLUGIN_API_CHECK_SLOT_MAPPING" in env
        else False,
    )
