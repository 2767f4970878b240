"""CUDA-graph support per (architecture, spec): a decision table, first matching row wins.

Every row names its condition, the level and why; the plugin README prints the same table
(a test keeps the two in step). A wrong claim here gives NaNs in a replayed graph, so a row
claims a level only where the decode kernel reads nothing but the plan's stable buffers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from plugin_api.contract.graphs import GraphLevel, GraphSupport
from plugin_api.device_info import DeviceInfo
from plugin_api.ops.attention import FP8, AttentionSpec

from . import versions
from .rules import HEAD_SIZES, MODEL_DTYPES, Arch, arch_of

Condition = Callable[[AttentionSpec, Arch | None, DeviceInfo], bool]


@dataclass(frozen=True, slots=True)
class GraphRule:
    condition: str  # what the README's "condition" column says
    applies: Condition
    level: GraphLevel
    reason: str


def _kv_dtype_ok(spec: AttentionSpec) -> bool:
    return spec.cache_dtype in (*MODEL_DTYPES, FP8)


TABLE: tuple[GraphRule, ...] = (
    GraphRule(
        "architecture is not SM90, SM100 or SM12x",
        lambda s, a, i: a is None,
        GraphLevel.NEVER,
        "no FlashInfer decode path of this plugin runs on this GPU",
    ),
    GraphRule(
        "FlashInfer missing or outside the validated version range",
        lambda s, a, i: not versions.check_installed(i),
        GraphLevel.NEVER,
        "no validated kernel to capture",
    ),
    GraphRule(
        f"head size not in {HEAD_SIZES}",
        lambda s, a, i: s.head_size not in HEAD_SIZES,
        GraphLevel.NEVER,
        "the decode kernel does not serve this head size",
    ),
    GraphRule(
        "KV dtype not fp16, bf16 or fp8 e4m3",
        lambda s, a, i: not _kv_dtype_ok(s),
        GraphLevel.NEVER,
        "the decode kernel does not serve this KV dtype",
    ),
    GraphRule(
        "fp8 KV on SM90 or SM12x",
        lambda s, a, i: s.fp8_kv and a in (Arch.SM90, Arch.SM12X),
        GraphLevel.NEVER,
        "the spec is refused there: XQA computes in fp8 with an fp8 cache",
    ),
    GraphRule(
        "DCP size > 1 (any architecture)",
        lambda s, a, i: s.dcp_size > 1,
        GraphLevel.UNIFORM_SINGLE_TOKEN_DECODE,
        "with decode context parallelism only one-token decodes are graph-safe (varlen "
        "decode is not, upstream on SM100 trtllm-gen)",
    ),
    GraphRule(
        "SM100, non-causal",
        lambda s, a, i: a is Arch.SM100 and not s.causal,
        GraphLevel.UNIFORM_SINGLE_TOKEN_DECODE,
        "trtllm-gen decode has no non-causal draft mask; one-token decodes (causal and "
        "non-causal agree) are captured",
    ),
    GraphRule(
        "SM100, causal, DCP size 1, any speculative tokens",
        lambda s, a, i: a is Arch.SM100,
        GraphLevel.UNIFORM_BATCH,
        "trtllm-gen decode takes q_len_per_req = 1 + speculative tokens from plan buffers",
    ),
    GraphRule(
        "SM90 or SM12x (XQA), causal or not, any speculative tokens, fp16/bf16 KV",
        lambda s, a, i: a in (Arch.SM90, Arch.SM12X),
        GraphLevel.UNIFORM_BATCH,
        "XQA decode reads q_len_per_req = 1 + speculative tokens and the bit-packed draft "
        "mask from plan buffers; uniform batches, speculative included, replay",
    ),
)


def cudagraph_support(spec: AttentionSpec, info: DeviceInfo) -> GraphSupport:
    """The CUDA-graph level of ``spec`` on the machine ``info`` describes, with the reason.

    Mixed prefill/decode batches are never captured (no row says ALWAYS): the FlashInfer
    prefill plans on the host per batch.
    """
    arch = arch_of(info)
    for rule in TABLE:
        if rule.applies(spec, arch, info):
            return GraphSupport(rule.level, f"{rule.condition}: {rule.reason}")
    raise AssertionError("cudagraph TABLE must end with rows that cover every architecture")
