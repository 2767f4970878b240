"""The exceptions plugin-api raises. One base class; each subclass names what happened."""

from __future__ import annotations


class PluginApiError(Exception):
    """Base of every error plugin-api raises on purpose.

    ``backend`` is the backend id the error is about (if any); ``reasons`` are the individual
    causes, already folded into the message.
    """

    def __init__(
        self, message: str, *, backend: str | None = None, reasons: tuple[str, ...] = ()
    ) -> None:
        super().__init__(message)
        self.backend = backend
        self.reasons = reasons


class SettingError(PluginApiError, ValueError):
    """A ``PLUGIN_API_*`` environment variable (or its programmatic twin) is unknown or invalid."""


class SelectionError(PluginApiError):
    """No backend can be selected under the current settings."""


class BackendNotInstalled(SelectionError):
    """The requested backend id matches no installed plugin."""


class BackendUnavailable(SelectionError):
    """The requested backend is installed but cannot run here (probe said unavailable or failed)."""


class AmbiguousSelection(SelectionError):
    """Automatic selection found several validated backends of equal priority."""


class StaleSelection(SelectionError):
    """A serialised selection no longer matches what is installed."""


class FallbackRefused(PluginApiError):
    """An op would fall back to another implementation while ``PLUGIN_API_STRICT=1``."""


class UnsupportedSpec(PluginApiError, ValueError):
    """No implementation accepts this op configuration; ``reasons`` holds one line per candidate."""


class ImplementationError(PluginApiError, RuntimeError):
    """An implementation broke the op contract during a call (a plugin bug, not bad input):
    for example it rebound an output tensor to other memory, dtype, shape or strides."""
