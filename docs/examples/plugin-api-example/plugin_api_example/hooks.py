"""pluggy hookimpls of the ``example`` backend, in the shape every plugin shares: its probe, and
one module per op family (``quant``)."""

from plugin_api.hookspecs import PluginHooks

from .probe import probe

HOOKS = PluginHooks(__package__, probe)
