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
import itertools
import threading
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import torch
from vllm.config import get_current_vllm_config
from vllm.model_executor.kernels.linear.scaled_mm.ScaledMMLinearKernel import (
    Int8ScaledMMLinearKernel,
    Int8ScaledMMLinearLayerConfig,
)
from vllm.model_executor.layers.linear import UnquantizedLinearMethod
from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase
from vllm.model_executor.layers.quantization.compressed_tensors.schemes import (
    CompressedTensorsW8A8Int8,
)
from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

import plugin_api as pa
from plugin_api.ops.gemm import Usage

from .attention import model_dtype
from .errors import BridgeRefused

# vLLM's attribute for a layer's method (read by its layers' forward and by ``served``)
QUANT_METHOD = "quant_method"


@dataclass
class Weight:
    """One weight the custom op serves: prepared now (linear) or at its first call (LM head)."""

    n: int
    out_dtype: torch.dtype
    usage: Literal["linear", "lm_head", "scaled"]
    source: torch.Tensor | None  # the unprepared weight, until prepared
    packed: pa.PackedWeight | None = None
    calls: int = 0  # counted in the op: compiled graphs never run ``apply``

    def prepared(self) -> pa.PackedWeight:
        if self.packed is None:
            assert self.source is not None
            usage: Usage = "lm_head" if self.usage == "lm_head" else "linear"
            self.packed = pa.prepare(self.source, out_dtype=self.out_dtype, usage=usage)
        return self.packed


# This process's weights, indexed by the int the custom op carries (a PackedWeight cannot be an
# argument of a torch op); each is released with the layer it serves, so the engines made one
# after another in a process do not keep each other's weights.
_weights: dict[int, Weight] = {}
_indices = itertools.count()
_lock = threading.Lock()


def register(weight: Weight, layer: torch.nn.Module) -> int:
    """The index of ``weight``, served while ``layer`` lives."""
    with _lock:
        index = next(_indices)
        _weights[index] = weight
    weakref.finalize(layer, _weights.pop, index, None)
    return index


def registered(index: int) -> Weight:
    try:
        return _weights[index]
    except KeyError:
        raise KeyError(f"plugin_api_vllm: weight {index} was released with its layer") from None


@torch.library.custom_op("plugin_api_vllm::mm", mutates_args=())
def mm_op(x: torch.Tensor, weight: int, bias: torch.Tensor | None) -> torch.Tensor:
    """``x[..., K] @ W^T (+ bias)`` on the registered weight number ``weight``."""
    w = registered(weight)
    packed = w.prepared()
    w.calls += 1
    rows = x.reshape(-1, x.shape[-1])
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    return pa.mm(rows, packed, bias).view(*x.shape[:-1], w.n)


def mm(x: torch.Tensor, weight: int, bias: torch.Tensor | None) -> torch.Tensor:
    """``mm_op`` through the dispatcher (``torch.ops``), as vLLM's compiled graphs record it."""
    y: torch.Tensor = torch.ops.plugin_api_vllm.mm(x, weight, bias)
    return y


@mm_op.register_fake
def _mm_fake(x: torch.Tensor, weight: int, bias: torch.Tensor | None) -> torch.Tensor:
    w = registered(weight)
    return x.new_empty((*x.shape[:-1], w.n), dtype=w.out_dtype)


@torch.library.custom_op("plugin_api_vllm::scaled_mm", mutates_args=())
def scaled_mm_op(x: torch.Tensor, weight: int, bias: torch.Tensor | None) -> torch.Tensor:
    """int8 W8A8: ``x`` quantized per token, times the registered int8 weight ``weight``."""
    w = registered(weight)
    packed = w.prepared()
    w.calls += 1
    rows = x.reshape(-1, x.shape[-1]).contiguous()
    q, scales = pa.per_token_group_quant(rows, group_size=rows.shape[1], dtype=torch.int8)
    return pa.scaled_mm(q, scales, packed, bias).view(*x.shape[:-1], w.n)


@scaled_mm_op.register_fake
def _scaled_mm_fake(x: torch.Tensor, weight: int, bias: torch.Tensor | None) -> torch.Tensor:
    w = registered(weight)
    return x.new_empty((*x.shape[:-1], w.n), dtype=w.out_dtype)


class Int8Kernel(Int8ScaledMMLinearKernel):
    """vLLM's int8 scaled-mm kernel of a compressed-tensors W8A8 scheme, on plugin-api: it takes
    the place (config, parameter names) of the kernel vLLM chose when it made the weights."""

    def __init__(self, index: int, replaced: Int8ScaledMMLinearKernel) -> None:
        super().__init__(replaced.config, replaced.layer_param_names)
        self.index = index

    @classmethod
    def is_supported(cls, compute_capability: int | None = None) -> tuple[bool, str | None]:
        return True, None  # the selected plugin-api backend decided at prepare

    @classmethod
    def can_implement(cls, c: Int8ScaledMMLinearLayerConfig) -> tuple[bool, str | None]:
        return True, None  # _route_int8 refused every other scheme before this is made

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        pass

    def apply_weights(
        self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        y: torch.Tensor = torch.ops.plugin_api_vllm.scaled_mm(x, self.index, bias)
        return y


def served(module: torch.nn.Module) -> tuple[str, int] | None:
    """(kind, weight index) when the bridge serves ``module``'s GEMM, else None."""
    method = getattr(module, QUANT_METHOD, None)
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
        return mm(x, self.index, bias)


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
        return mm(x, self.index, bias)


def _tensor(layer: torch.nn.Module, name: str) -> torch.Tensor:
    """The data of ``layer``'s parameter ``name`` (typed: ``Module`` attributes may be modules)."""
    value = getattr(layer, name)
    if not isinstance(value, torch.Tensor):
        raise BridgeRefused(f"{type(layer).__name__}.{name} is not a tensor")
    return value.data


def _set_method(layer: torch.nn.Module, method: QuantizeMethodBase) -> None:
    # Module.__setattr__ is typed for tensors and modules; a layer's method is neither
    setattr(layer, QUANT_METHOD, method)


def _route_linear(layer: torch.nn.Module) -> None:
    w = _tensor(layer, "weight")
    packed = pa.prepare(w, usage="linear")
    index = register(Weight(int(w.shape[0]), packed.spec.out_dtype, "linear", None, packed), layer)
    _set_method(layer, PluginApiLinearMethod(index))
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
    w = _tensor(layer, "weight")
    scales = _tensor(layer, "weight_scale").reshape(-1).to(torch.float32).contiguous()
    dtype = model_dtype(get_current_vllm_config())
    packed = pa.prepare(w, weight_scale=scales, out_dtype=dtype)
    index = register(Weight(int(w.shape[0]), dtype, "scaled", None, packed), layer)
    scheme.kernel = Int8Kernel(index, scheme.kernel)
    empty = torch.empty(0, dtype=w.dtype, device=w.device)
    layer.weight = torch.nn.Parameter(empty, requires_grad=False)


def _route_embedding(layer: torch.nn.Module) -> None:
    # the weight stays: lookups (and a head tied to the embeddings) read it
    w = _tensor(layer, "weight")
    index = register(Weight(int(w.shape[0]), torch.float32, "lm_head", w), layer)
    _set_method(layer, PluginApiLmHeadMethod(index))


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

    def int8(self: CompressedTensorsW8A8Int8, layer: torch.nn.Module) -> None:
        _route_int8(self, layer)

    UnquantizedLinearMethod.process_weights_after_loading = linear  # type: ignore[method-assign]
    UnquantizedEmbeddingMethod.process_weights_after_loading = embedding  # type: ignore[method-assign]
    CompressedTensorsW8A8Int8.process_weights_after_loading = int8  # type: ignore[method-assign]
    try:
        yield
    finally:
        UnquantizedLinearMethod.process_weights_after_loading = linear_pwal  # type: ignore[method-assign]
        UnquantizedEmbeddingMethod.process_weights_after_loading = embedding_pwal  # type: ignore[method-assign]
        CompressedTensorsW8A8Int8.process_weights_after_loading = int8_pwal  # type: ignore[method-assign]
