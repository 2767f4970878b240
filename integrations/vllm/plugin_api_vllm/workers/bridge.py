"""What every bridge worker adds to vLLM's worker for its device: model loading with linear layers
on plugin-api, a refusal of any layer left on vLLM's kernels, and the provenance report."""

from __future__ import annotations

import logging
from typing import Any

from ..errors import BridgeRefused
from ..linear import routed_to_plugin_api
from ..report import collect, summary

log = logging.getLogger("vllm.plugin_api")  # vLLM's handlers and level apply


class BridgeWorker:
    """Mixin placed before vLLM's worker class: ``class Worker(BridgeWorker, VllmWorker)``."""

    model_runner: Any

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        with routed_to_plugin_api():
            super().load_model(*args, **kwargs)  # type: ignore[misc]
        report = collect(self.model_runner.get_model())
        if report["engine_layers"]:
            # never a silent switch to vLLM's kernels: a layer the bridge could not take stops it
            raise BridgeRefused(
                "these layers would run on vLLM's own kernels, not plugin-api: "
                + ", ".join(report["engine_layers"])
            )
        log.info("plugin-api serves this model:\n%s", summary(report))

    def plugin_api_report(self) -> dict[str, Any]:
        """What served each layer, with call counts.

        Reached from the engine's user as ``LLM.collective_rpc("plugin_api_report")``."""
        return collect(self.model_runner.get_model())
