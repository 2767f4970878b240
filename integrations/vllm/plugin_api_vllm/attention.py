"""vLLM's attention backend interface, served by plugin-api's ``Attention``.

- One ``AttentionSpec`` per layer, resolved on the selected backend when vLLM builds the layer:
  a spec the backend refuses stops vLLM's start-up with the backend's reasons.
- The metadata builder turns vLLM's common metadata into one ``AttentionBatch`` per step
  (decodes first: it asks vLLM to reorder the batch so) and plans it once per distinct spec;
  layers with equal specs share the plan. Where vLLM replays full CUDA graphs of decode steps,
  it keeps one plan per spec and captured batch shape and re-plans into it (``reuse=``).
- ``forward`` is ``Attention.run``: it writes this step's K/V (not for KV-sharing layers) and
  attends. The KV cache is plugin-api's layout, viewed over the bytes vLLM allocated.
"""

from __future__ import annotations

import statistics
import time
import weakref
from collections import Counter, deque
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from vllm.config import (
    CUDAGraphMode,
    VllmConfig,
    get_current_vllm_config,
    get_layers_from_vllm_config,
)
from vllm.model_executor.layers.attention import Attention as VllmAttentionLayer
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionCGSupport,
    AttentionImpl,
    AttentionMetadata,
    AttentionMetadataBuilder,
    AttentionType,
    CommonAttentionMetadata,
    MultipleOf,
)
from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend
from vllm.v1.kv_cache_layout import KVCacheLayout

import plugin_api as pa
from plugin_api.ops.attention import AttentionPlan, kv_cache_shape

from .errors import BridgeRefused

# vLLM's --kv-cache-dtype names and the plugin-api cache dtype each means (None: the model's)
KV_CACHE_DTYPES: dict[str, torch.dtype | None] = {
    "auto": None,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "fp8": torch.float8_e4m3fn,
    "fp8_e4m3": torch.float8_e4m3fn,
}
# plugin-api's graph levels, by name, as vLLM's
GRAPH_LEVELS = {
    "NEVER": AttentionCGSupport.NEVER,
    "UNIFORM_SINGLE_TOKEN_DECODE": AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE,
    "UNIFORM_BATCH": AttentionCGSupport.UNIFORM_BATCH,
    "ALWAYS": AttentionCGSupport.ALWAYS,
}


NAME = "PLUGIN_API"


class PluginApiAttentionBackend(AttentionBackend):
    # Attention.run writes the step's K/V itself, so vLLM does not call a separate update
    forward_includes_kv_cache_update: bool = True
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16, torch.float32]
    supported_kv_cache_dtypes: ClassVar[list[Any]] = list(KV_CACHE_DTYPES)

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec: Any = None) -> list[int | MultipleOf]:
        # any size reaches plugin-api, whose backend accepts or refuses it with a reason
        return [MultipleOf(1)]

    @staticmethod
    def get_name() -> str:
        return NAME

    @staticmethod
    def get_impl_cls() -> type[PluginApiAttentionImpl]:
        return PluginApiAttentionImpl

    @staticmethod
    def get_builder_cls() -> type[PluginApiMetadataBuilder]:
        return PluginApiMetadataBuilder

    @classmethod
    def supports_sink(cls) -> bool:
        return True  # the backend decides per spec (has_sinks), and refuses what it cannot do

    @classmethod
    def supports_sliding_window(cls) -> bool:
        return True

    @classmethod
    def supported_kv_cache_layouts(cls) -> tuple[KVCacheLayout, ...]:
        # layer-major, block-contiguous: each layer's cache is one dense buffer of whole blocks
        return (KVCacheLayout.LBHNC,)


@dataclass
class PluginApiAttentionMetadata(AttentionMetadata):
    """One step: the token count and a plan per distinct spec among the group's layers."""

    num_actual_tokens: int
    plans: dict[pa.AttentionSpec, AttentionPlan]


def model_dtype(vllm_config: VllmConfig) -> torch.dtype:
    """The model's dtype. vLLM's config takes names ("auto", "bfloat16", ...) and resolves them
    to a ``torch.dtype`` when it is built; a name left here is a config vLLM did not finish."""
    dtype = vllm_config.model_config.dtype
    if not isinstance(dtype, torch.dtype):
        raise BridgeRefused(f"model dtype {dtype!r}: vLLM has not resolved it to a torch dtype")
    return dtype


def spec_for_layer(
    *,
    num_heads: int,
    head_size: int,
    scale: float,
    num_kv_heads: int,
    sliding_window: int | None,
    kv_cache_dtype: str,
    logits_soft_cap: float | None,
    has_sinks: bool,
    kv_sharing: bool,
    vllm_config: VllmConfig,
) -> pa.AttentionSpec:
    """The plugin-api spec of one vLLM attention layer."""
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise BridgeRefused(
            f"kv_cache_dtype={kv_cache_dtype!r}: the bridge maps {', '.join(KV_CACHE_DTYPES)}"
        )
    spec_cfg = vllm_config.speculative_config
    speculative = 0
    if spec_cfg is not None and spec_cfg.num_speculative_tokens:
        speculative = int(spec_cfg.num_speculative_tokens)
    return pa.AttentionSpec(
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_size=head_size,
        dtype=model_dtype(vllm_config),
        kv_cache_dtype=KV_CACHE_DTYPES[kv_cache_dtype],
        block_size=vllm_config.cache_config.block_size,
        sliding_window=sliding_window,
        logits_soft_cap=logits_soft_cap or None,  # vLLM passes 0/None for "no cap"
        has_sinks=has_sinks,
        kv_sharing=kv_sharing,
        num_speculative_tokens=speculative,
        scale=float(scale),
    )


class PluginApiAttentionImpl(AttentionImpl[PluginApiAttentionMetadata]):
    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int | None = None,
        alibi_slopes: list[float] | None = None,
        sliding_window: int | None = None,
        kv_cache_dtype: str = "auto",
        logits_soft_cap: float | None = None,
        attn_type: str = AttentionType.DECODER,
        kv_sharing_target_layer_name: str | None = None,
        sinks: torch.Tensor | None = None,
    ) -> None:
        if alibi_slopes is not None:
            raise BridgeRefused("ALiBi slopes: not in plugin-api's attention contract")
        if attn_type != AttentionType.DECODER:
            raise BridgeRefused(f"attention type {attn_type!r}: the bridge serves decoder layers")
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = float(scale)
        self.num_kv_heads = num_kv_heads or num_heads
        self.kv_cache_dtype = kv_cache_dtype
        self.sliding_window = sliding_window
        self.kv_sharing_target_layer_name = kv_sharing_target_layer_name
        self.spec = spec_for_layer(
            num_heads=num_heads,
            head_size=head_size,
            scale=scale,
            num_kv_heads=self.num_kv_heads,
            sliding_window=sliding_window,
            kv_cache_dtype=kv_cache_dtype,
            logits_soft_cap=logits_soft_cap,
            has_sinks=sinks is not None,
            kv_sharing=kv_sharing_target_layer_name is not None,
            vllm_config=get_current_vllm_config(),
        )
        # resolved now: a refusal (or a fallback under PLUGIN_API_STRICT=1) stops start-up
        self.attention = pa.attention(self.spec)
        self.sinks = sinks
        self.calls = 0
        self._sinks_fp32: torch.Tensor | None = None
        self._kv: tuple[int, pa.KVCache] | None = None

    def _kv_cache(self, raw: torch.Tensor, layer: Any) -> pa.KVCache:
        """plugin-api's view of the cache vLLM allocated for this layer (made once)."""
        key = raw.data_ptr()
        if self._kv is not None and self._kv[0] == key:
            return self._kv[1]
        if not raw.is_contiguous():
            raise BridgeRefused(
                f"the KV cache vLLM allocated has strides {raw.stride()} for shape "
                f"{tuple(raw.shape)}; plugin-api needs each layer's blocks dense "
                "(VLLM_KV_CACHE_LAYOUT=LBHNC, no page padding)"
            )
        if self.spec.fp8_kv and raw.dtype == torch.uint8:
            raw = raw.view(self.spec.cache_dtype)  # vLLM keeps fp8 caches as uint8 storage
        num_blocks = int(raw.shape[0])
        data = raw.view(kv_cache_shape(self.spec, num_blocks))
        k_scale = v_scale = 1.0
        if self.spec.fp8_kv:
            k_scale, v_scale = float(layer._k_scale_float), float(layer._v_scale_float)
        kv = pa.KVCache(data, k_scale=k_scale, v_scale=v_scale)
        self._kv = (key, kv)
        return kv

    def _sinks(self) -> torch.Tensor | None:
        # sinks are model weights, loaded after __init__: converted once, at the first step
        if self.sinks is None:
            return None
        if self._sinks_fp32 is None:
            self._sinks_fp32 = self.sinks.detach().to(torch.float32).contiguous()
        return self._sinks_fp32

    def forward(
        self,
        layer: Any,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: PluginApiAttentionMetadata | None,
        output: torch.Tensor,
        output_scale: torch.Tensor | None = None,
        output_block_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if output_scale is not None or output_block_scale is not None:
            raise BridgeRefused("fused output quantization: not in plugin-api's attention op")
        if attn_metadata is None:  # vLLM's profiling run: no batch, nothing to attend
            return output
        plan = attn_metadata.plans[self.spec]
        n = plan.num_tokens
        # query/key/value are strided views of the fused QKV output: the op reads them in place
        q = query[:n]
        k = v = None
        if not self.spec.kv_sharing:
            k, v = key[:n], value[:n]
        self.attention.run(
            q, k, v, self._kv_cache(kv_cache, layer), plan, sinks=self._sinks(), out=output[:n]
        )
        self.calls += 1
        return output


def _layer_impls(vllm_config: VllmConfig, names: list[str]) -> list[PluginApiAttentionImpl]:
    layers = get_layers_from_vllm_config(vllm_config, VllmAttentionLayer, names)
    impls: list[PluginApiAttentionImpl] = []
    for layer in layers.values():
        if not isinstance(layer.impl, PluginApiAttentionImpl):
            raise BridgeRefused(
                f"layer runs {type(layer.impl).__name__}, not the plugin-api attention backend"
            )
        impls.append(layer.impl)
    return impls


def full_decode_graph_tokens(vllm_config: VllmConfig) -> int | None:
    """The largest decode step (in tokens) that vLLM replays as a full CUDA graph, or None when
    its (resolved) cudagraph mode replays no full graph of decode steps."""
    compilation = vllm_config.compilation_config
    if compilation.cudagraph_mode.decode_mode() != CUDAGraphMode.FULL:
        return None
    spec_cfg = vllm_config.speculative_config
    per_request = 1 + int(spec_cfg.num_speculative_tokens or 0) if spec_cfg is not None else 1
    tokens = per_request * vllm_config.scheduler_config.max_num_seqs
    if compilation.max_cudagraph_capture_size is not None:
        tokens = min(tokens, compilation.max_cudagraph_capture_size)
    return tokens or None  # no capture size: nothing is captured


def decode_graph_shape(
    m: CommonAttentionMetadata, batch: pa.AttentionBatch, max_tokens: int | None
) -> tuple[int, int] | None:
    """``(requests, tokens)`` of the full CUDA graph vLLM may replay for this step (its padded
    shape, the one it captured), or None when it replays none: not a pure-decode step, longer
    than ``max_tokens`` (``full_decode_graph_tokens``), or no full decode graphs at all."""
    if max_tokens is None or batch.num_seqs == 0 or batch.num_decodes < batch.num_seqs:
        return None
    if m.num_actual_tokens > max_tokens:
        return None
    return m.num_reqs, m.num_actual_tokens


# Live metadata builders of this process, for the report's count of kept graph plans
LIVE_BUILDERS: weakref.WeakSet[PluginApiMetadataBuilder] = weakref.WeakSet()


# step_shapes' keys
STEP_SHAPES = (
    "decode_only",
    "prefill_only",
    "mixed",
    "prefills_with_context",
    "speculative_decodes",
)


# Per-step build times each builder keeps for host_time's median (the latest steps only)
RECENT_BUILDS = 4096


def host_time() -> dict[str, float]:
    """The bridge's host time over this process's live metadata builders (one per KV-cache
    group of each live engine): builds (steps), their seconds, and the median build of the
    latest steps, each converting vLLM's metadata and planning every distinct spec. The median
    is the per-step figure: the sum also holds one-off costs (a first plan that builds the
    backend's kernels on a development install)."""
    recent = [t for b in LIVE_BUILDERS for t in b.recent_builds]
    return {
        "steps": sum(b.steps for b in LIVE_BUILDERS),
        "build_s": sum(b.build_s for b in LIVE_BUILDERS),
        "median_s": statistics.median(recent) if recent else 0.0,
    }


def step_shapes() -> dict[str, int]:
    """Over this process's live metadata builders: steps of decodes only, of prefills only and
    mixed (chunked prefill schedules prefill chunks beside running decodes), and prefill
    requests whose keys include tokens cached before the step (a later chunk of a prompt, or a
    prefix-cache hit), and decode requests that verify draft tokens (speculative decoding: more
    than one query token). Each builder counts its own steps, as in ``host_time``."""
    total: Counter[str] = Counter(dict.fromkeys(STEP_SHAPES, 0))
    for b in LIVE_BUILDERS:
        total.update(b.shapes)
    return dict(total)


def graph_plans() -> dict[str, int]:
    """Over this process's live metadata builders: the longest decode step vLLM replays as a
    full CUDA graph (0: none) and how many plans are kept for those graphs."""
    return {
        "full_decode_graph_tokens": max((b.graph_tokens or 0 for b in LIVE_BUILDERS), default=0),
        "kept": sum(len(b.graph_plans) for b in LIVE_BUILDERS),
    }


class PluginApiMetadataBuilder(AttentionMetadataBuilder[PluginApiAttentionMetadata]):
    def __init__(
        self,
        kv_cache_spec: Any,
        layer_names: list[str],
        vllm_config: VllmConfig,
        device: torch.device,
    ) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        # decodes (query length <= 1 + speculative tokens) first, as the op contract wants
        self._init_reorder_batch_threshold(1, supports_spec_as_decode=True)
        self.layers = get_layers_from_vllm_config(vllm_config, VllmAttentionLayer, layer_names)
        impls = _layer_impls(vllm_config, layer_names)
        self.attentions = {impl.spec: impl.attention for impl in impls}
        self.decode_limit = 1 + max((s.num_speculative_tokens for s in self.attentions), default=0)
        self.graph_tokens = full_decode_graph_tokens(vllm_config)
        # a captured graph keeps reading the buffers of the plan made at capture: one plan per
        # (spec, requests, tokens) of a replayable step, refilled by every later step of that shape
        self.graph_plans: dict[tuple[pa.AttentionSpec, int, int], AttentionPlan] = {}
        self.num_blocks: int | None = None
        self.steps, self.build_s = 0, 0.0  # host_time()
        self.recent_builds: deque[float] = deque(maxlen=RECENT_BUILDS)
        self.shapes: Counter[str] = Counter()  # step_shapes()
        LIVE_BUILDERS.add(self)

    def _cache_blocks(self) -> int | None:
        """The block count of the KV caches vLLM bound to this group's layers (what ``run``
        checks against; replayed graphs skip ``run``, so ``plan`` must check it), or None before
        vLLM binds them: its placeholders are empty."""
        if self.num_blocks is None:
            blocks = [int(layer.kv_cache.shape[0]) for layer in self.layers.values()]
            if blocks and min(blocks) > 0:
                self.num_blocks = min(blocks)
        return self.num_blocks

    @classmethod
    def get_cudagraph_support(
        cls, vllm_config: VllmConfig, kv_cache_spec: Any
    ) -> AttentionCGSupport:
        """The lowest plugin-api graph level over the model's attention layers."""
        layers = get_layers_from_vllm_config(vllm_config, VllmAttentionLayer)
        levels = [
            layer.impl.attention.graph_support().level
            for layer in layers.values()
            if isinstance(layer.impl, PluginApiAttentionImpl)
        ]
        if not levels:
            return AttentionCGSupport.NEVER
        # plans are kept for decode graphs only (build): full graphs of mixed steps would
        # replay stale plans, so vLLM is told UNIFORM_BATCH at most
        level = GRAPH_LEVELS[min(levels).name]
        return min(level, AttentionCGSupport.UNIFORM_BATCH, key=lambda s: s.value)

    def build(
        self,
        common_prefix_len: int,
        common_attn_metadata: CommonAttentionMetadata,
        fast_build: bool = False,
    ) -> PluginApiAttentionMetadata:
        t0 = time.perf_counter()
        batch = attention_batch(common_attn_metadata, self.decode_limit)
        shape = decode_graph_shape(common_attn_metadata, batch, self.graph_tokens)
        num_blocks = self._cache_blocks()
        plans: dict[pa.AttentionSpec, AttentionPlan] = {}
        for spec, attn in self.attentions.items():
            if shape is None:
                plans[spec] = attn.plan(batch, num_blocks=num_blocks)
                continue
            key = (spec, *shape)
            kept = self.graph_plans.get(key)
            plans[spec] = attn.plan(batch, reuse=kept, num_blocks=num_blocks)
            if kept is None:
                self.graph_plans[key] = plans[spec]
        self._count_shape(batch)
        took = time.perf_counter() - t0
        self.steps += 1
        self.build_s += took
        self.recent_builds.append(took)
        return PluginApiAttentionMetadata(common_attn_metadata.num_actual_tokens, plans)

    def _count_shape(self, batch: pa.AttentionBatch) -> None:
        decodes, prefills = batch.num_decodes, batch.num_seqs - batch.num_decodes
        qsl = batch.query_start_loc
        if decodes and self.decode_limit > 1:
            self.shapes["speculative_decodes"] += int(
                (qsl[1 : decodes + 1] - qsl[:decodes] > 1).sum()
            )
        if prefills == 0:
            self.shapes["decode_only"] += 1
            return
        self.shapes["mixed" if decodes else "prefill_only"] += 1
        qsl = qsl[decodes:]
        earlier = batch.seq_lens[decodes:] > qsl[1:] - qsl[:-1]
        self.shapes["prefills_with_context"] += int(earlier.sum())


def attention_batch(m: CommonAttentionMetadata, decode_limit: int) -> pa.AttentionBatch:
    """plugin-api's ``AttentionBatch`` (host int tensors) from vLLM's common metadata."""
    cpu = torch.device("cpu")
    qsl = m.query_start_loc_cpu[: m.num_reqs + 1].to(cpu, torch.int32)
    qlens = qsl[1:] - qsl[:-1]
    n = m.num_reqs
    if n and int(qlens[-1]) == 0:
        # a step padded to a captured graph's shape ends in requests with no query tokens: not
        # the batch's (the plan of the padded shape keeps room for them)
        real = qlens.nonzero()
        n = int(real[-1]) + 1 if real.numel() else 0
        qsl, qlens = qsl[: n + 1], qlens[:n]
    # vLLM reorders requests of at most decode_limit tokens to the front
    long = (qlens > decode_limit).nonzero()
    num_decodes = int(long[0]) if long.numel() else n
    return pa.AttentionBatch(
        query_start_loc=qsl,
        seq_lens=m.seq_lens[:n].to(cpu, torch.int32),
        block_table=m.block_table_tensor[:n].to(cpu, torch.int32),
        slot_mapping=m.slot_mapping[: int(qsl[-1])].to(cpu, torch.int64),
        num_decodes=num_decodes,
    )


# vLLM looks backends up by name in every process: register ours once per process
if NAME not in AttentionBackendEnum.__members__:
    register_backend(NAME, f"{__name__}.{PluginApiAttentionBackend.__qualname__}")
