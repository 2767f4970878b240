"""vLLM's unquantized linear layers and LM heads on plugin-api's ``prepare``/``mm``.

vLLM has no platform hook for its linear kernels, so the bridge's worker loads the model inside
``routed_to_plugin_api()``: while it is active, the weight processing of vLLM's unquantized
linear and embedding methods gives each layer a method whose ``apply`` calls the
``plugin_api_vllm::mm`` custom op. The op is a ``torch.library`` custom op with a fake kernel,
so vLLM's compiled mode captures it without a graph break.

- Linear layers: the weight is prepared at load time and the layer keeps only the packed form
  (as vLLM's own CPU path does).
- int8 W8A8 (compressed-tensors, per-channel weight scales, dynamic per-token activations):
  the weight is prepared with its scales at load time; each call quantizes the activations with
  ``per_token_group_quant`` (one group per row) and runs ``scaled_mm``
  (``plugin_api_vllm::scaled_mm``). Other int8 schemes are refused with the reason.
- Embeddings: ``apply`` runs only when vLLM's logits processor uses the module as the LM head
  (``ParallelLMHead``, or the embedding itself for tied heads such as Gemma's). That weight is
  prepared at its first such call, with fp32 output (the bf16 x bf16 -> fp32 accumulator, S1);
  lookups stay vLLM's ``F.embedding``.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from vllm.config import get_current_vllm_config
from vllm.model_executor.layers.linear import UnquantizedLinearMethod
from vllm.model_executor.layers.quantization.compressed_tensors.schemes import (
    CompressedTensorsW8A8Int8,
)
from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

import plugin_api as pa

from .errors import BridgeRefused


@dataclass
class Weight:
    """One weight the custom op serves: prepared now (linear) or at its first call (LM head)."""

    n: int
    out_dtype: torch.dtype
    usage: str
    source: torch.Tensor | None  # the unprepared weight, until prepared
    packed: pa.PackedWeight | None = None
    calls: int = 0  # counted in the op: compiled graphs never run ``apply``

    def prepared(self) -> pa.PackedWeight:
        if self.packed is None:
            assert self.source is not None
            usage = "lm_head" if self.usage == "lm_head" else "linear"
            self.packed = pa.prepare(self.source, out_dtype=self.out_dtype, usage=usage)
        return self.packed


# This process's weights, indexed by the int the custom op carries (a PackedWeight cannot be an
# argument of a torch op).
_weights: list[Weight] = []
_lock = threading.Lock()


def register(weight: Weight) -> int:
    with _lock:
        _weights.append(weight)
        return len(_weights) - 1


def weight(index: int) -> Weight:
    return _weights[index]


@torch.library.custom_op("plugin_api_vllm::mm", mutates_args=())
def mm_op(x: torch.Tensor, weight: int, bias: torch.Tensor | None) -> torch.Tensor:
    """``x[..., K] @ W^T (+ bias)`` on the registered weight number ``weight``."""
    w = _weights[weight]
    packed = w.prepared()
    w.calls += 1
    rows = x.reshape(-1, x.shape[-1])
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    return pa.mm(rows, packed, bias).view(*x.shape[:-1], w.n)


@mm_op.register_fake
def _mm_fake(x: torch.Tensor, weight: int, bias: torch.Tensor | None) -> torch.Tensor:
    w = _weights[weight]
    return x.new_empty((*x.shape[:-1], w.n), dtype=w.out_dtype)


@torch.library.custom_op("plugin_api_vllm::scaled_mm", mutates_args=())
def scaled_mm_op(x: torch.Tensor, weight: int, bias: torch.Tensor | None) -> torch.Tensor:
    """int8 W8A8: ``x`` quantized per token, times the registered int8 weight ``weight``."""
    w = _weights[weight]
    packed = w.prepared()
    w.calls += 1
    rows = x.reshape(-1, x.shape[-1]).contiguous()
    q, scales = pa.per_token_group_quant(rows, group_size=rows.shape[1], dtype=torch.int8)
    return pa.scaled_mm(q, scales, packed, bias).view(*x.shape[:-1], w.n)


@scaled_mm_op.register_fake
def _scaled_mm_fake(x: torch.Tensor, weight: int, bias: torch.Tensor | None) -> torch.Tensor:
    w = _weights[weight]
    return x.new_empty((*x.shape[:-1], w.n), dtype=w.out_dtype)


class Int8Kernel:
    """Stands in for vLLM's int8 scaled-mm kernel object in a compressed-tensors W8A8 scheme."""

    def __init__(self, index: int) -> None:
        self.index = index

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        pass

    def apply_weights(
        self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        return torch.ops.plugin_api_vllm.scaled_mm(x, self.index, bias)


def served(module: torch.nn.Module) -> tuple[str, int] | None:
    """(kind, weight index) when the bridge serves ``module``'s GEMM, else None."""
    method = getattr(module, "quant_method", None)
    if isinstance(method, PluginApiLinearMethod):
        return "linear", method.index
    if isinstance(method, PluginApiLmHeadMethod):
        return "lm_head", method.index
    kernel = getattr(getattr(module, "scheme", None), "kernel", None)
    if isinstance(kernel, Int8Kernel):
        return "linear-int8", kernel.index
    return None


class PluginApiLinearMethod(UnquantizedLinearMethod):
    """An unquantized linear layer whose weight plugin-api prepared."""

    def __init__(self, index: int) -> None:
        super().__init__()
        self.index = index

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        pass  # prepared when it was routed

    def apply(
        self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        return torch.ops.plugin_api_vllm.mm(x, self.index, bias)


class PluginApiLmHeadMethod(UnquantizedEmbeddingMethod):
    """An embedding whose use as the LM head runs on plugin-api; lookups stay vLLM's."""

    def __init__(self, index: int) -> None:
        super().__init__()
        self.index = index

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        pass

    def apply(
        self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        return torch.ops.plugin_api_vllm.mm(x, self.index, bias)


def _route_linear(layer: torch.nn.Module) -> None:
    w = layer.weight.data
    packed = pa.prepare(w, usage="linear")
    index = register(Weight(int(w.shape[0]), packed.spec.out_dtype, "linear", None, packed))
    layer.quant_method = PluginApiLinearMethod(index)
    # as vLLM's CPU path does: the layer keeps only the packed weight
    layer.weight = torch.nn.Parameter(
        torch.empty(0, dtype=w.dtype, device=w.device), requires_grad=False
    )


def _route_int8(scheme: CompressedTensorsW8A8Int8, layer: torch.nn.Module) -> None:
    if str(scheme.strategy) != "channel" or scheme.is_static_input_scheme:
        raise BridgeRefused(
            f"int8 W8A8 with {scheme.strategy} weight scales and "
            f"{'static' if scheme.is_static_input_scheme else 'dynamic'} input scales: "
            "plugin-api's scaled_mm takes per-channel weight scales and dynamic per-token "
            "activation scales"
        )
    if not scheme.input_symmetric:
        raise BridgeRefused("int8 W8A8 with asymmetric activations: scaled_mm is symmetric")
    w = layer.weight.data
    scales = layer.weight_scale.data.reshape(-1).to(torch.float32).contiguous()
    dtype = get_current_vllm_config().model_config.dtype
    packed = pa.prepare(w, weight_scale=scales, out_dtype=dtype)
    index = register(Weight(int(w.shape[0]), dtype, "scaled", None, packed))
    scheme.kernel = Int8Kernel(index)
    empty = torch.empty(0, dtype=w.dtype, device=w.device)
    layer.weight = torch.nn.Parameter(empty, requires_grad=False)


def _route_embedding(layer: torch.nn.Module) -> None:
    # the weight stays: lookups (and a head tied to the embeddings) read it
    w = layer.weight.data
    index = register(Weight(int(w.shape[0]), torch.float32, "lm_head", w))
    layer.quant_method = PluginApiLmHeadMethod(index)


@contextlib.contextmanager
def routed_to_plugin_api() -> Iterator[None]:
    """While active (model loading), vLLM's unquantized linear layers and LM heads are routed to
    plugin-api instead of vLLM's kernels. Restored on exit, also on error."""
    linear_pwal = UnquantizedLinearMethod.process_weights_after_loading
    embedding_pwal = UnquantizedEmbeddingMethod.process_weights_after_loading
    int8_pwal = CompressedTensorsW8A8Int8.process_weights_after_loading

    def linear(self: UnquantizedLinearMethod, layer: torch.nn.Module) -> None:
        if isinstance(self, PluginApiLinearMethod):
            return
        if getattr(layer, "_cpu_skip_gemm_dispatch", False) or layer.weight.ndim != 2:
            # vLLM's own exclusions (MLA's kv_b_proj, conv weights): the worker refuses them
            linear_pwal(self, layer)
            return
        _route_linear(layer)

    def embedding(self: UnquantizedEmbeddingMethod, layer: torch.nn.Module) -> None:
        if not isinstance(self, PluginApiLmHeadMethod):
            _route_embedding(layer)

    UnquantizedLinearMethod.process_weights_after_loading = linear  # type: ignore[method-assign]
    UnquantizedEmbeddingMethod.process_weights_after_loading = embedding  # type: ignore[method-assign]
    CompressedTensorsW8A8Int8.process_weights_after_loading = _route_int8  # type: ignore[method-assign]
    try:
        yield
    finally:
        UnquantizedLinearMethod.process_weights_after_loading = linear_pwal  # type: ignore[method-assign]
        UnquantizedEmbeddingMethod.process_weights_after_loading = embedding_pwal  # type: ignore[method-assign]
        CompressedTensorsW8A8Int8.process_weights_after_loading = int8_pwal  # type: ignore[method-assign]
