"""Which attention specs this plugin serves, per GPU architecture: pure rules on
(``AttentionSpec``, ``DeviceInfo``), each rejection with its reason.

One declaration covers decode and prefill: a feature is accepted only when both the decode
kernel (XQA on SM90/SM12x, trtllm-gen on SM100) and the FlashInfer paged prefill honour it.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

import torch

from plugin_api.contract.decision import Decision
from plugin_api.device_info import DeviceInfo
from plugin_api.ops.attention import FP8, AttentionSpec

from . import versions


class Arch(str, enum.Enum):
    SM90 = "sm90"  # Hopper: validated
    SM100 = "sm100"  # datacenter Blackwell: experimental, trtllm-gen decode
    SM12X = "sm12x"  # RTX Blackwell: experimental, XQA decode

    def __str__(self) -> str:
        return self.value


ARCH_OF_MAJOR = {9: Arch.SM90, 10: Arch.SM100, 12: Arch.SM12X}
DECODE_KERNEL = {Arch.SM90: "xqa", Arch.SM12X: "xqa", Arch.SM100: "trtllm-gen"}
HEAD_SIZES = (64, 128, 256)  # XQA takes multiples of 16 up to 256; the FA2 prefill is validated
BLOCK_SIZES = (16, 32, 64, 128)  # XQA's TOKENS_PER_PAGE choices
MODEL_DTYPES = (torch.float16, torch.bfloat16)  # XQA and FA2 inputs


def arch_of(info: DeviceInfo) -> Arch | None:
    gpus = info.accelerators_of("nvidia")
    if not gpus or gpus[0].compute_capability is None:
        return None
    return ARCH_OF_MAJOR.get(gpus[0].compute_capability[0])


def _dtypes(spec: AttentionSpec, arch: Arch) -> str | None:
    if spec.dtype not in MODEL_DTYPES:
        return f"dtype={spec.dtype}: FlashInfer XQA decode and FA2 prefill take fp16/bf16"
    if spec.cache_dtype not in (spec.dtype, FP8):
        return f"kv_cache_dtype={spec.cache_dtype}: the cache is the model dtype or fp8 e4m3"
    if spec.q_dtype != spec.dtype:
        return (
            f"query_dtype={spec.q_dtype}: the {DECODE_KERNEL[arch]} decode path here takes "
            "queries in the model dtype (no fp8-query path in this plugin)"
        )
    return None


def _shapes(spec: AttentionSpec, arch: Arch) -> str | None:
    if spec.head_size not in HEAD_SIZES:
        return f"head_size={spec.head_size}: served sizes are {HEAD_SIZES}"
    if spec.block_size not in BLOCK_SIZES:
        return f"block_size={spec.block_size}: XQA pages are {BLOCK_SIZES} tokens"
    return None


def _fp8_cache(spec: AttentionSpec, arch: Arch) -> str | None:
    if spec.fp8_kv and DECODE_KERNEL[arch] == "xqa":
        return (
            f"kv_cache_dtype={spec.cache_dtype} on the XQA decode: with an fp8 cache XQA computes "
            "Q.K and P.V in fp8 (query and probabilities rounded to e4m3), where the contract "
            "keeps the query in the model dtype; measured on an H200 (FlashInfer 0.7.4): kit "
            "outputs off by up to 30 at tolerance 0.02"
        )
    return None


def _soft_cap(spec: AttentionSpec, arch: Arch) -> str | None:
    if spec.logits_soft_cap is not None:
        return (
            f"logits_soft_cap={spec.logits_soft_cap:g}: XQA decode has no soft cap (the "
            "prefill could apply it, but one declaration covers both)"
        )
    return None


def _parallelism(spec: AttentionSpec, arch: Arch) -> str | None:
    if spec.dcp_size > 1 and spec.kv_sharing:
        return (
            f"kv_sharing with dcp_size={spec.dcp_size}: context-parallel prefill consumes this "
            "step's K/V, which a KV-sharing layer does not have (key=None, value=None)"
        )
    if spec.dcp_size > 1:
        return (
            f"dcp_size={spec.dcp_size}: decode context parallelism (cross-rank merge of partial "
            "outputs) is not implemented by this plugin"
        )
    return None


def _sm100_paths(spec: AttentionSpec, arch: Arch) -> str | None:
    if arch is not Arch.SM100 or spec.causal:
        return None
    if spec.has_sinks:
        return (
            "sinks on the SM100 non-causal (trtllm-gen) path: known to drop the sinks "
            "silently upstream; refused"
        )
    if spec.num_speculative_tokens:
        return (
            "non-causal speculative decode on SM100: trtllm-gen decode applies a causal draft "
            "mask only"
        )
    return None


RULES: tuple[Callable[[AttentionSpec, Arch], str | None], ...] = (
    _dtypes,
    _shapes,
    _fp8_cache,
    _soft_cap,
    _parallelism,
    _sm100_paths,
)


def attention_decision(spec: AttentionSpec, info: DeviceInfo) -> Decision:
    """Accept ``spec`` on the machine ``info`` describes, or reject it with every reason."""
    arch = arch_of(info)
    if arch is None:
        return Decision.reject("no SM90/SM100/SM12x NVIDIA GPU in this DeviceInfo")
    reasons = [r for rule in RULES if (r := rule(spec, arch)) is not None]
    installed = versions.check_installed(info)
    failing = Decision.all_of(
        Decision.reject(*reasons) if reasons else Decision.accept(), installed
    )
    if not failing:
        return failing
    return Decision.accept(
        f"{arch}: {DECODE_KERNEL[arch]} decode + FlashInfer FA2 paged prefill"
        + (" (sink-aware variant)" if spec.has_sinks else ""),
        *installed.reasons,
    )
