"""Which attention specs this plugin serves, per GPU architecture: pure rules on
(``AttentionSpec``, ``DeviceInfo``), each rejection with its reason.

One declaration covers decode and prefill: a feature is accepted only when both the decode
kernel (``decode_kernel``: XQA on SM90/SM12x, trtllm-gen on SM100, and on SM90/SM12x with an fp8
cache the FA2 paged prefill itself) and the FlashInfer FA2 paged prefill honour it.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

import torch

from plugin_api.contract.decision import Decision
from plugin_api.device_info import DeviceInfo
from plugin_api.ops.attention import FP8, AttentionSpec

from . import versions
from .probe import TRITON


class Arch(str, enum.Enum):
    SM90 = "sm90"  # Hopper: validated
    SM100 = "sm100"  # datacenter Blackwell: experimental, trtllm-gen decode
    SM12X = "sm12x"  # RTX Blackwell: experimental, XQA decode

    def __str__(self) -> str:
        return self.value


class DecodeKernel(str, enum.Enum):
    """What computes a step's decode rows."""

    XQA = "xqa"  # flashinfer.decode.xqa_batch_decode_with_kv_cache, from plan buffers
    TRTLLM_GEN = "trtllm-gen"  # flashinfer.decode.trtllm_batch_decode_with_kv_cache
    FA2 = "fa2"  # no decode kernel: the FA2 paged prefill runs decode rows with the prefill rows

    def __str__(self) -> str:
        return self.value


ARCH_OF_MAJOR = {9: Arch.SM90, 10: Arch.SM100, 12: Arch.SM12X}
HEAD_SIZES = (64, 128, 256)  # XQA takes multiples of 16 up to 256; the FA2 prefill is validated
BLOCK_SIZES = (16, 32, 64, 128)  # XQA's TOKENS_PER_PAGE choices
MODEL_DTYPES = (torch.float16, torch.bfloat16)  # XQA and FA2 inputs


def decode_kernel(spec: AttentionSpec, arch: Arch) -> DecodeKernel:
    """The kernel that computes the decode rows of ``spec`` on ``arch``.

    With an fp8 cache XQA computes Q.K and P.V in fp8 (query and probabilities rounded to
    e4m3), off the contract by up to 30 on an H200 kit run (FlashInfer 0.7.4). The FA2 paged
    prefill instead casts each fp8 K/V tile to the query's dtype before fp16/bf16 MMAs (its fp8
    MMAs are only for an fp8 query), folds k_scale into sm_scale and multiplies the output by
    v_scale, so on SM90/SM12x every row of an fp8 step goes through it.
    """
    if arch is Arch.SM100:
        return DecodeKernel.TRTLLM_GEN
    return DecodeKernel.FA2 if spec.fp8_kv else DecodeKernel.XQA


def decodes_in_prefill(spec: AttentionSpec, arch: Arch) -> bool:
    """Whether the plan puts the decode rows into the FA2 prefill step (no decode step)."""
    return decode_kernel(spec, arch) is DecodeKernel.FA2


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
            f"query_dtype={spec.q_dtype}: the {decode_kernel(spec, arch)} decode path here takes "
            "queries in the model dtype (no fp8-query path in this plugin)"
        )
    return None


def _shapes(spec: AttentionSpec, arch: Arch) -> str | None:
    if spec.head_size not in HEAD_SIZES:
        return f"head_size={spec.head_size}: served sizes are {HEAD_SIZES}"
    if spec.block_size not in BLOCK_SIZES:
        return f"block_size={spec.block_size}: XQA pages are {BLOCK_SIZES} tokens"
    return None


def _soft_cap(spec: AttentionSpec, arch: Arch) -> str | None:
    if spec.logits_soft_cap is None:
        return None
    if decode_kernel(spec, arch) is DecodeKernel.FA2:
        return (
            f"logits_soft_cap={spec.logits_soft_cap:g}: this plugin's FA2 calls, which run "
            "every row of an fp8-cache step here, pass no soft cap (and the sink-aware "
            "variant has none)"
        )
    return (
        f"logits_soft_cap={spec.logits_soft_cap:g}: XQA decode has no soft cap (the "
        "prefill could apply it, but one declaration covers both)"
    )


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
    _soft_cap,
    _parallelism,
    _sm100_paths,
)


def kv_write_triton(info: DeviceInfo) -> str | None:
    """Why the step's K/V cannot be written here, if so: the write is the host's Triton kernel
    (``plugin_api.triton.cache_write``), one launch per step, with no torch fallback."""
    found = TRITON.triton(info)
    if found.ok:
        return None
    return f"{found.because()}: the K/V cache write is the host's Triton kernel"


def attention_decision(spec: AttentionSpec, info: DeviceInfo) -> Decision:
    """Accept ``spec`` on the machine ``info`` describes, or reject it with every reason."""
    arch = arch_of(info)
    if arch is None:
        return Decision.reject("no SM90/SM100/SM12x NVIDIA GPU in this DeviceInfo")
    reasons = [r for rule in RULES if (r := rule(spec, arch)) is not None]
    if not spec.kv_sharing and (triton := kv_write_triton(info)) is not None:
        reasons.append(triton)
    installed = versions.check_installed(info)
    failing = Decision.all_of(
        Decision.reject(*reasons) if reasons else Decision.accept(), installed
    )
    if not failing:
        return failing
    return Decision.accept(_served_by(spec, arch), *installed.reasons)


def _served_by(spec: AttentionSpec, arch: Arch) -> str:
    variant = " (sink-aware variant)" if spec.has_sinks else ""
    kernel = decode_kernel(spec, arch)
    if kernel is DecodeKernel.FA2:
        return (
            f"{arch}: fp8 KV cache: decode and prefill rows through the FlashInfer FA2 paged "
            f"prefill{variant}, K/V dequantized to the model dtype (XQA would compute in fp8)"
        )
    return f"{arch}: {kernel} decode + FlashInfer FA2 paged prefill{variant}"
