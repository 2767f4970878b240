"""The bridge's one error: vLLM cannot run on plugin-api as configured, with the reason."""

from plugin_api import PluginApiError


class BridgeRefused(PluginApiError):
    """vLLM asked for something the bridge or the selected backend does not serve."""
