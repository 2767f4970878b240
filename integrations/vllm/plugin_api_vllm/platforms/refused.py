"""The platform vLLM gets when the bridge was asked for and cannot run: constructing it raises
the reason, so vLLM stops instead of going on with its own platform."""

from vllm.platforms.interface import Platform

from ..errors import BridgeRefused


class RefusedPlatform(Platform):
    def __init__(self) -> None:
        from ..activation import failure

        raise BridgeRefused(
            "PLUGIN_API_BACKEND is set, so vLLM must run on plugin-api, and the bridge cannot "
            f"start: {failure() or 'see the error logged above'}. Unset PLUGIN_API_BACKEND to "
            "run vLLM on its own platform."
        )
