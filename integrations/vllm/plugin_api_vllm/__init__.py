"""plugin-api-vllm: vLLM runs its attention and linear layers on the selected plugin-api backend.

Installed, it registers in ``vllm.platform_plugins``; it activates only when
``PLUGIN_API_BACKEND`` is set. Importing this package does not import vLLM.
"""

from .versions import BUILT_AGAINST, SUPPORTED_VLLM, UnsupportedVllm, check_vllm

__all__ = ["BUILT_AGAINST", "SUPPORTED_VLLM", "UnsupportedVllm", "check_vllm"]
