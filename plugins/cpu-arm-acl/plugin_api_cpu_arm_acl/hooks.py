"""pluggy hookimpls of the ``cpu-arm-acl`` backend, in the shape every plugin shares: its probe,
the facts it reads (its oneDNN, the CPU family), and one module per op family (``attention``,
``gemm``, ``quant``)."""

from plugin_api.hookspecs import PluginHooks

from .facts import read
from .probe import probe

HOOKS = PluginHooks(__package__, probe, facts=read)
