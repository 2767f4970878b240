"""Named benchmark cases per op family, with real model shapes, and the bytes and FLOPs each one
moves and computes (hand-derivable; docs/benchmarks.md writes the formulas out).

Bytes are the problem's compulsory traffic (every operand read once, every result written once),
not what a particular implementation happens to move, so that backends are judged alike.
Cases are plain data; ``workloads.py`` allocates their tensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Protocol

import torch

Family = Literal["gemm", "quant", "attention", "state"]
FAMILIES: tuple[Family, ...] = ("gemm", "quant", "attention", "state")
BF16, FP32, INT8, FP8 = torch.bfloat16, torch.float32, torch.int8, torch.float8_e4m3fn
_SHORT = {BF16: "bf16", FP32: "fp32", INT8: "int8", FP8: "fp8"}


def size_of(dtype: torch.dtype) -> int:
    return dtype.itemsize


class Case(Protocol):
    family: ClassVar[Family]

    @property
    def name(self) -> str: ...

    def nbytes(self) -> int: ...

    def flops(self) -> int: ...

    def params(self) -> dict[str, Any]: ...


# ---- GEMM ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GemmCase:
    """``y[M, N] = x[M, K] @ W[N, K]^T``: bf16 weights through ``mm``; int8 weights as a W8A8
    layer runs them: the bf16 ``x`` quantized per token (``per_token_group_quant``, one group of
    K), then ``scaled_mm`` (per-token scales ``[M]``, per-channel weight scales ``[N]``, fp32)."""

    family: ClassVar[Family] = "gemm"
    layer: str
    m: int
    n: int
    k: int
    weight_dtype: torch.dtype
    out_dtype: torch.dtype
    usage: Literal["linear", "lm_head"] = "linear"

    @property
    def name(self) -> str:
        kind = f"{_SHORT[self.weight_dtype]}->{_SHORT[self.out_dtype]}"
        return f"{self.layer} K={self.k} N={self.n} M={self.m} {kind}"

    @property
    def scaled(self) -> bool:
        return self.weight_dtype == INT8

    def nbytes(self) -> int:
        w = size_of(self.weight_dtype)
        moved = (
            self.m * self.k * 2 + self.n * self.k * w + self.m * self.n * size_of(self.out_dtype)
        )
        if self.scaled:
            moved += self.m * self.k + 4 * (self.m + self.n)  # x_q written, fp32 scales
        return moved

    def flops(self) -> int:
        return 2 * self.m * self.n * self.k

    def params(self) -> dict[str, Any]:
        return {
            "layer": self.layer,
            "M": self.m,
            "N": self.n,
            "K": self.k,
            "weight_dtype": _SHORT[self.weight_dtype],
            "out_dtype": _SHORT[self.out_dtype],
            "usage": self.usage,
        }


LM_HEAD_K = 4096
LM_HEAD_N = (32000, 64128, 128256)  # Llama-2 vocab, Llama-3 vocab at TP=2, Llama-3 vocab
LM_HEAD_M = (1, 2, 4, 8, 9, 16, 64, 256)
# Llama-3-8B linear layers as (name, K, N)
LLAMA3_8B_LINEAR = (
    ("qkv_proj", 4096, 6144),
    ("o_proj", 4096, 4096),
    ("gate_up_proj", 4096, 28672),
    ("down_proj", 14336, 4096),
)
LINEAR_M = (1, 16, 256)
PREFILL_M = 2048  # one prefill chunk (vLLM's CPU default budget per step is 2048-4096 tokens)


def gemm_cases() -> tuple[GemmCase, ...]:
    # Ordered so that cases sharing a weight are neighbours (workloads keep one weight alive).
    cases = [
        GemmCase("lm_head", m, n, LM_HEAD_K, BF16, out, "lm_head")
        for n in LM_HEAD_N
        for out in (FP32, BF16)
        for m in LM_HEAD_M
    ]
    cases += [
        GemmCase(layer, m, n, k, w, BF16)
        for layer, k, n in LLAMA3_8B_LINEAR
        for w in (BF16, INT8)
        # the prefill chunk in bf16 only: int8 without a native int8 matmul takes minutes a call
        for m in ((*LINEAR_M, PREFILL_M) if w == BF16 else LINEAR_M)
    ]
    return tuple(cases)


# ---- quantization ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QuantCase:
    """``per_token_group_quant`` of bf16 ``x[M, K]`` to int8/fp8 ``q[M, K]`` with fp32 scales
    ``[M, K / group]`` (row- or column-major)."""

    family: ClassVar[Family] = "quant"
    m: int
    k: int
    group: int
    dtype: torch.dtype
    column_major: bool
    in_dtype: torch.dtype = BF16

    @property
    def name(self) -> str:
        layout = "col" if self.column_major else "row"
        return f"M={self.m} K={self.k} group={self.group} {_SHORT[self.dtype]} {layout}-major"

    @property
    def groups(self) -> int:
        return self.k // self.group

    def nbytes(self) -> int:
        elems = self.m * self.k
        return (
            elems * size_of(self.in_dtype) + elems * size_of(self.dtype) + 4 * self.m * self.groups
        )

    def flops(self) -> int:
        # per element: one step of the abs-max reduction and one division; per group: the scale
        # (round, clamp and cast are not counted as FLOPs)
        return 2 * self.m * self.k + self.m * self.groups

    def params(self) -> dict[str, Any]:
        return {
            "M": self.m,
            "K": self.k,
            "group_size": self.group,
            "dtype": _SHORT[self.dtype],
            "column_major_scales": self.column_major,
            "in_dtype": _SHORT[self.in_dtype],
        }


QUANT_SHAPES = ((32, 128), (64, 256), (16, 512), (1024, 7168), (4096, 7168), (8192, 7168))


def quant_cases() -> tuple[QuantCase, ...]:
    return tuple(
        QuantCase(m, k, g, dtype, col)
        for m, k in QUANT_SHAPES
        for g in (64, 128)
        for dtype in (INT8, FP8)
        for col in (False, True)
    )


# ---- attention ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AttentionCase:
    """One layer's paged attention step: ``batch`` sequences of ``context`` cached tokens, the
    last ``q_len`` of which are this step's queries (written to the cache by the call).

    ``kind``: ``decode`` (1 query token), ``spec-decode`` (``q_len`` tokens, decodes with
    ``q_len - 1`` speculative tokens) or ``prefill`` (``q_len == context``). Causal.
    """

    family: ClassVar[Family] = "attention"
    kind: Literal["decode", "spec-decode", "prefill"]
    batch: int
    context: int
    q_len: int
    num_heads: int = 32
    num_kv_heads: int = 8
    head_size: int = 128
    block_size: int = 16
    dtype: torch.dtype = BF16
    kv_cache_dtype: torch.dtype | None = None  # None: the model dtype

    @property
    def cache_dtype(self) -> torch.dtype:
        return self.dtype if self.kv_cache_dtype is None else self.kv_cache_dtype

    @property
    def name(self) -> str:
        ctx = f"{self.context // 1024}k" if self.context % 1024 == 0 else str(self.context)
        q = f" q={self.q_len}" if self.kind != "decode" else ""
        block = f" block={self.block_size}" if self.block_size != 16 else ""
        kv = f" kv={_SHORT[self.cache_dtype]}" if self.cache_dtype != self.dtype else ""
        return f"{self.kind} batch={self.batch} context={ctx}{q}{block}{kv}"

    def visible_pairs(self) -> int:
        """(query, key) pairs per head and sequence under the causal mask: the query at
        position ``p`` sees ``p + 1`` keys; positions run from ``context - q_len``."""
        first = self.context - self.q_len + 1  # keys seen by the first query
        return self.q_len * (first + self.context) // 2

    def nbytes(self) -> int:
        e, c = size_of(self.dtype), size_of(self.cache_dtype)
        d = self.head_size
        kv_cache_read = self.batch * self.context * self.num_kv_heads * d * 2 * c
        tokens = self.batch * self.q_len
        q_and_out = 2 * tokens * self.num_heads * d * e
        new_kv = tokens * self.num_kv_heads * d * 2 * (e + c)  # read K/V inputs, write the cache
        return kv_cache_read + q_and_out + new_kv

    def flops(self) -> int:
        # Q.K^T and P.V: 2 * head_size FLOPs each per visible (query, key) pair and query head
        return 4 * self.head_size * self.num_heads * self.batch * self.visible_pairs()

    def params(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "batch": self.batch,
            "context": self.context,
            "q_len": self.q_len,
            "num_heads": self.num_heads,
            "num_kv_heads": self.num_kv_heads,
            "head_size": self.head_size,
            "block_size": self.block_size,
            "dtype": _SHORT[self.dtype],
            "kv_cache_dtype": _SHORT[self.cache_dtype],
        }


def attention_cases() -> tuple[AttentionCase, ...]:
    cases = [AttentionCase("decode", b, ctx, 1) for b in (1, 8, 16) for ctx in (1024, 4096, 8192)]
    # 32-token blocks: each (block, KV head) is one 8 KB run instead of two 4 KB ones, which
    # random reads on CPUs reward; the best CPU stack's decode figures were taken at 32
    cases += [AttentionCase("decode", b, 4096, 1, block_size=32) for b in (8, 16)]
    # an fp8 e4m3 cache (per-layer scales) halves the bytes a decode step reads
    cases += [AttentionCase("decode", b, 4096, 1, kv_cache_dtype=FP8) for b in (8, 16)]
    cases.append(AttentionCase("prefill", 4, 512, 512))
    cases.append(AttentionCase("prefill", 4, 512, 512, kv_cache_dtype=FP8))
    cases.append(AttentionCase("spec-decode", 8, 4096, 3))
    return tuple(cases)


# ---- recurrent state ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StateCase:
    """``copy_state_blocks`` of ``blocks`` blocks in a pool of one Mamba2 layer's states: a conv
    state ``[conv_dim, d_conv - 1]`` and an SSM state ``[n_heads, head_dim, d_state]``."""

    family: ClassVar[Family] = "state"
    model: str
    conv: tuple[int, int]
    ssm: tuple[int, int, int]
    blocks: int
    conv_dtype: torch.dtype = BF16
    ssm_dtype: torch.dtype = FP32

    @property
    def name(self) -> str:
        return f"copy {self.model} blocks={self.blocks}"

    @property
    def pool_blocks(self) -> int:
        return 2 * self.blocks  # sources and destinations are distinct blocks

    def block_bytes(self) -> int:
        c, s = self.conv, self.ssm
        return c[0] * c[1] * size_of(self.conv_dtype) + s[0] * s[1] * s[2] * size_of(self.ssm_dtype)

    def nbytes(self) -> int:
        return 2 * self.blocks * self.block_bytes()  # read each source block, write its copy

    def flops(self) -> int:
        return 0

    def params(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "conv_state": list(self.conv),
            "ssm_state": list(self.ssm),
            "conv_dtype": _SHORT[self.conv_dtype],
            "ssm_dtype": _SHORT[self.ssm_dtype],
            "blocks": self.blocks,
            "block_bytes": self.block_bytes(),
        }


# Mamba2 layers: conv_dim = d_inner + 2 * d_state (one group), d_conv = 4, head_dim 64, d_state 128
MAMBA2 = (
    ("mamba2-370m", (2304, 3), (32, 64, 128)),
    ("mamba2-2.7b", (5376, 3), (80, 64, 128)),
)
STATE_BLOCKS = (1, 16, 128)


def state_cases() -> tuple[Case, ...]:
    copies = tuple(
        StateCase(name, conv, ssm, b) for name, conv, ssm in MAMBA2 for b in STATE_BLOCKS
    )
    return copies  # the manager's per-step cost is measured apart: see state_manager.py


# ---- selection ------------------------------------------------------------------------------

ALL: dict[Family, tuple[Case, ...]] = {
    "gemm": gemm_cases(),
    "quant": quant_cases(),
    "attention": attention_cases(),
    "state": state_cases(),
}

# --quick: a few cases per family, chosen to fit the run in minutes on a 2-core CPU while keeping
# each family's headline problem (the Llama-3 LM head GEMV, the 16 x 8k decode).
QUICK: dict[Family, tuple[Case, ...]] = {
    "gemm": (
        GemmCase("lm_head", 1, 128256, LM_HEAD_K, BF16, FP32, "lm_head"),
        GemmCase("lm_head", 1, 128256, LM_HEAD_K, BF16, BF16, "lm_head"),
        GemmCase("o_proj", 1, 4096, 4096, BF16, BF16),
        GemmCase("o_proj", 1, 4096, 4096, INT8, BF16),
    ),
    "quant": (
        QuantCase(32, 128, 64, INT8, False),
        QuantCase(1024, 7168, 128, INT8, False),
        QuantCase(1024, 7168, 128, FP8, True),
    ),
    "attention": (
        AttentionCase("decode", 1, 1024, 1),
        AttentionCase("decode", 16, 8192, 1),
        AttentionCase("prefill", 4, 512, 512),
        AttentionCase("spec-decode", 8, 4096, 3),
    ),
    "state": (StateCase("mamba2-2.7b", (5376, 3), (80, 64, 128), 16),),
}


def select(families: tuple[Family, ...], quick: bool) -> tuple[Case, ...]:
    table = QUICK if quick else ALL
    return tuple(c for f in families for c in table[f])
