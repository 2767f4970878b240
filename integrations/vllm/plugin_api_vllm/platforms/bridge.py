"""What every bridge platform changes in vLLM's platform for its device: the attention backend
and the worker class (whose model loading routes linear layers to plugin-api). Nothing else."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import BridgeRefused

if TYPE_CHECKING:
    from vllm.config import VllmConfig

ATTENTION_BACKEND = "plugin_api_vllm.attention.PluginApiAttentionBackend"


def refusals(config: Any) -> list[str]:
    """Why a layer described by vLLM's ``AttentionSelectorConfig`` cannot run on the bridge.

    Only what vLLM decides before plugin-api sees the layer; everything about the spec itself
    (head size, block size, window, sinks, fp8) is the selected backend's decision.
    """
    out = []
    if config.use_mla:
        out.append("multi-head latent attention (MLA): plugin-api has no MLA op family")
    if config.use_sparse:
        out.append("sparse attention: plugin-api has no sparse attention op")
    if config.attn_type != "decoder":
        out.append(f"attention type {config.attn_type!r}: plugin-api serves decoder attention")
    if config.use_mm_prefix or config.use_rswa:
        out.append("prefix-LM / reference sliding-window masks are not in plugin-api's contract")
    if config.use_non_causal:
        out.append("vLLM's non-causal attention option: not wired through the bridge")
    if config.use_pcp or config.use_dcp:
        out.append("context parallelism (PCP/DCP) across ranks: not wired through the bridge")
    if getattr(config, "use_per_head_quant_scales", False):
        out.append("per-head KV quantization scales: plugin-api's fp8 cache has per-layer scales")
    return out


class BridgePlatform:
    """Mixin placed before vLLM's platform class: ``class X(BridgePlatform, VllmPlatform)``."""

    # the worker class each device's vLLM default is replaced by, in check_and_update_config
    vllm_worker: str = ""
    bridge_worker: str = ""

    @classmethod
    def get_attn_backend_cls(
        cls, selected_backend: Any, attn_selector_config: Any, num_heads: int | None = None
    ) -> str:
        if selected_backend is not None:
            raise BridgeRefused(
                f"vLLM was asked for its attention backend {selected_backend} while plugin-api "
                "is selected (PLUGIN_API_BACKEND): the bridge never runs vLLM's own kernels. "
                "Drop --attention-backend, or unset PLUGIN_API_BACKEND to run vLLM on its own."
            )
        reasons = refusals(attn_selector_config)
        if reasons:
            raise BridgeRefused(
                "plugin-api cannot serve an attention layer of this model: "
                + "; ".join(reasons)
                + ". Unset PLUGIN_API_BACKEND to run this model on vLLM's own kernels."
            )
        return ATTENTION_BACKEND

    @classmethod
    def check_and_update_config(cls, vllm_config: VllmConfig) -> None:
        super().check_and_update_config(vllm_config)  # type: ignore[misc]
        parallel = vllm_config.parallel_config
        if parallel.worker_cls not in ("auto", cls.vllm_worker, cls.bridge_worker):
            raise BridgeRefused(
                f"worker_cls={parallel.worker_cls!r}: the bridge loads models through its own "
                f"worker ({cls.bridge_worker}), which routes linear layers to plugin-api"
            )
        parallel.worker_cls = cls.bridge_worker
