"""Model-shaped example layers: what ``plugin-api doctor`` resolves to show the op table."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

import torch

from ..contract import OpFamily
from ..ops.attention import AttentionSpec
from ..ops.gemm import GemmSpec
from ..ops.quant import QuantSpec
from ..ops.state import StateSpec

BF16, FP8 = torch.bfloat16, torch.float8_e4m3fn


@dataclass(frozen=True, slots=True)
class Layer:
    name: str
    family: OpFamily
    spec: Hashable


@dataclass(frozen=True, slots=True)
class ModelExample:
    name: str
    layers: tuple[Layer, ...]
    num_speculative_tokens: int = 0


A, G, Q, S = OpFamily.ATTENTION, OpFamily.GEMM, OpFamily.QUANT, OpFamily.STATE

MODELS: tuple[ModelExample, ...] = (
    ModelExample(
        "llama-3-8b",
        (
            Layer("attention", A, AttentionSpec(32, 8, 128, BF16, block_size=16)),
            Layer("qkv_proj", G, GemmSpec(6144, 4096, BF16, BF16)),
            Layer("down_proj (w8a8)", G, GemmSpec(4096, 14336, torch.int8, BF16)),
            Layer("activation quant (w8a8)", Q, QuantSpec(14336, 14336, BF16, torch.int8)),
            Layer("lm_head", G, GemmSpec(128256, 4096, BF16, torch.float32, "lm_head")),
        ),
    ),
    ModelExample(
        "gpt-oss-20b (sinks, sliding window, 3 draft tokens)",
        (
            Layer(
                "sliding attention",
                A,
                AttentionSpec(
                    64,
                    8,
                    64,
                    BF16,
                    block_size=16,
                    sliding_window=128,
                    has_sinks=True,
                    num_speculative_tokens=3,
                ),
            ),
            Layer(
                "full attention",
                A,
                AttentionSpec(
                    64, 8, 64, BF16, block_size=16, has_sinks=True, num_speculative_tokens=3
                ),
            ),
        ),
        num_speculative_tokens=3,
    ),
    ModelExample(
        "gemma-3n (KV sharing)",
        (
            Layer(
                "attention", A, AttentionSpec(8, 2, 256, BF16, block_size=16, sliding_window=512)
            ),
            Layer(
                "kv-shared attention",
                A,
                AttentionSpec(8, 2, 256, BF16, block_size=16, sliding_window=512, kv_sharing=True),
            ),
        ),
    ),
    ModelExample(
        "deepseek-v3 (fp8 block quant)",
        (Layer("activation group quant", Q, QuantSpec(7168, 128, BF16, FP8, True, True)),),
    ),
    ModelExample(
        "mamba2-2.7b",
        (Layer("ssm state", S, StateSpec(((5376, 3), (80, 64, 128)), (BF16, torch.float32))),),
    ),
)
