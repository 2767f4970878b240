"""pluggy hookimpls of the ``rocm`` backend, in the shape every plugin shares: its probe, the facts
it reads from the installed torch, and one module per op family (``attention``, ``gemm``,
``quant``, ``state``)."""

from plugin_api.hookspecs import PluginHooks

from .facts import read
from .probe import probe

HOOKS = PluginHooks(__package__, probe, facts=read)
