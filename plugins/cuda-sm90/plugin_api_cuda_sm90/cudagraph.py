"""CUDA-graph support per (architecture, spec): the host's rule, then a decision table.

A spec this plugin's rules refuse (``rules.attention_decision``) is NEVER captured, with the
refusal as the reason (``plugin_api.contract.graphs.unless_refused``, the rule every attention
implementation follows). A served spec takes the first matching row of ``TABLE``; every row
names its condition, the level and why, and the plugin README prints the same table (a test
keeps the two in step). A wrong claim here gives NaNs in a replayed graph, so a row claims a
level only where the decode kernel reads nothing but the plan's stable buffers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from plugin_api.contract.graphs import GraphLevel, GraphSupport, unless_refused
from plugin_api.device_info import DeviceInfo
from plugin_api.ops.attention import AttentionSpec

from .rules import Arch, DecodeKernel, arch_of, attention_decision, decode_kernel

Condition = Callable[[AttentionSpec, Arch], bool]


@dataclass(frozen=True, slots=True)
class GraphRule:
    condition: str  # what the README's "condition" column says
    applies: Condition
    level: GraphLevel
    reason: str


# Rows for served specs only: the refusals (another architecture, FlashInfer outside the
# validated range, head sizes, dtypes, a soft cap, dcp_size > 1, ...) never reach them.
TABLE: tuple[GraphRule, ...] = (
    GraphRule(
        "SM90 or SM12x, fp8 KV cache (every row through the FA2 paged prefill)",
        lambda s, a: decode_kernel(s, a) is DecodeKernel.FA2,
        GraphLevel.NEVER,
        "decode rows run in the FA2 paged prefill, which FlashInfer plans on the host per "
        "batch (launch sizes and split-KV work lists in its wrapper, not in the plan's stable "
        "buffers), so a replay would run the captured batch's plan; no step is captured",
    ),
    GraphRule(
        "SM100, non-causal",
        lambda s, a: a is Arch.SM100 and not s.causal,
        GraphLevel.UNIFORM_SINGLE_TOKEN_DECODE,
        "trtllm-gen decode has no non-causal draft mask; one-token decodes (causal and "
        "non-causal agree) are captured",
    ),
    GraphRule(
        "SM100, causal, any speculative tokens",
        lambda s, a: a is Arch.SM100,
        GraphLevel.UNIFORM_BATCH,
        "trtllm-gen decode takes q_len_per_req = 1 + speculative tokens from plan buffers",
    ),
    GraphRule(
        "SM90 or SM12x, fp16/bf16 KV cache (XQA), causal or not, any speculative tokens",
        lambda s, a: decode_kernel(s, a) is DecodeKernel.XQA,
        GraphLevel.UNIFORM_BATCH,
        "XQA decode reads q_len_per_req = 1 + speculative tokens and the bit-packed draft "
        "mask from plan buffers; uniform batches, speculative included, replay",
    ),
)


def _table_level(spec: AttentionSpec, arch: Arch | None) -> GraphSupport:
    if arch is not None:
        for rule in TABLE:
            if rule.applies(spec, arch):
                return GraphSupport(rule.level, f"{rule.condition}: {rule.reason}")
    raise AssertionError(f"cudagraph TABLE has no row for a spec served on {arch}")


def cudagraph_support(spec: AttentionSpec, info: DeviceInfo) -> GraphSupport:
    """The CUDA-graph level of ``spec`` on the machine ``info`` describes, with the reason.

    Mixed prefill/decode batches are never captured (no row says ALWAYS): the FlashInfer
    prefill plans on the host per batch; so, on SM90/SM12x, is no step with an fp8 cache.
    """
    return unless_refused(attention_decision(spec, info), lambda: _table_level(spec, arch_of(info)))
