"""Every portable Triton kernel compiles, to machine code, for the GPUs whose plugins launch it.

The Triton interpreter (tests/triton_kernels) checks what the kernels compute, but it accepts
programs that the compiler rejects: a constexpr ``if`` that returns, followed by a second return
of another type, ran in the interpreter and failed on the first H200 run of the cuda-sm90 kit.
``triton.compile`` with an explicit ``GPUTarget`` needs no GPU (ptxas and the AMD linker ship in
the Triton wheel), so CI compiles each kernel here with the launch table of that GPU.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from plugin_api.triton import attention, cache_write, quant, scaled_mm, state_copy
from plugin_api.triton.launch import lookup

# (target, the launch-table key a device of that kind resolves to, the binary Triton must emit)
TARGETS = {
    "sm90": (GPUTarget("cuda", 90, 32), "cuda:sm_90", "cubin"),
    "gfx942": (GPUTarget("hip", "gfx942", 64), "cuda:gfx942", "hsaco"),
}
POINTER = {
    torch.bfloat16: "*bf16",
    torch.float16: "*fp16",
    torch.float32: "*fp32",
    torch.float8_e4m3fn: "*fp8e4nv",
    torch.int8: "*i8",
    torch.uint8: "*u8",
    torch.int16: "*i16",
    torch.int32: "*i32",
    torch.int64: "*i64",
}


def _signature(
    fn: Any, pointers: dict[str, torch.dtype], constexprs: dict[str, Any], floats: tuple[str, ...]
) -> dict[str, str]:
    """Triton's signature for ``fn``: the named pointers and floats, constexprs, other args i32."""
    sig = {}
    for name in fn.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name in pointers:
            sig[name] = POINTER[pointers[name]]
        else:
            sig[name] = "fp32" if name in floats else "i32"
    named = set(pointers) | set(constexprs) | set(floats)
    assert named <= set(fn.arg_names), f"not parameters of {fn.__name__}: {named}"
    return sig


def _compile(target: str, fn: Any, pointers, constexprs, floats=(), **options) -> Any:
    gpu, _, binary = TARGETS[target]
    src = ASTSource(fn, _signature(fn, pointers, constexprs, floats), constexprs=constexprs)
    kernel = triton.compile(src, target=gpu, options=options or None)
    assert kernel.asm.get(binary), f"no {binary} for {fn.__name__} on {target}"
    return kernel


def _table(target: str):
    return lookup(TARGETS[target][1])


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(
    "out_dtype,ue8m0,group",
    [(torch.int8, False, 128), (torch.int8, True, 4096), (torch.float8_e4m3fn, True, 128)],
    ids=["int8", "int8-ue8m0-two-pass", "fp8-ue8m0"],
)
def test_group_quant_kernel(target: str, out_dtype: torch.dtype, ue8m0: bool, group: int) -> None:
    cfg = _table(target).quant
    block = max(16, min(triton.next_power_of_2(group), cfg.max_block))
    int8 = out_dtype == torch.int8
    pointers = {"x_ptr": torch.bfloat16, "q_ptr": torch.int8 if int8 else torch.uint8}
    pointers["s_ptr"] = torch.float32
    constexprs = dict(
        QMAX=127.0 if int8 else 448.0, INT8=int8, UE8M0=ue8m0, BLOCK=block, SINGLE=group <= block
    )
    _compile(
        target, quant._group_quant_kernel, pointers, constexprs, ("eps",), num_warps=cfg.num_warps
    )


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float8_e4m3fn], ids=["bf16", "fp8"])
def test_cache_write_kernel(target: str, cache_dtype: torch.dtype) -> None:
    cfg = _table(target).copy
    fp8 = cache_dtype == torch.float8_e4m3fn
    pointers = {
        "k_ptr": torch.bfloat16,
        "v_ptr": torch.bfloat16,
        "cache_ptr": torch.uint8 if fp8 else cache_dtype,  # fp8 bits go through a uint8 view
        "slot_ptr": torch.int64,
    }
    constexprs = dict(NUM_KV_HEADS=8, HEAD_SIZE=128, PAGE=16, BLOCK_T=cfg.write_tokens)
    constexprs.update(BLOCK_H=8, BLOCK_D=128, FP8=fp8)
    _compile(
        target,
        cache_write._cache_write_kernel,
        pointers,
        constexprs,
        ("k_scale", "v_scale"),
        num_warps=cfg.num_warps,
    )


ATTENTION_FEATURES = {
    "bf16-causal": (torch.bfloat16, torch.bfloat16, dict(CAUSAL=True)),
    "bf16-fp8kv-window-sinks-softcap": (
        torch.bfloat16,
        torch.float8_e4m3fn,
        dict(CAUSAL=True, WINDOW=True, SINKS=True, SOFT_CAP=True),
    ),
    "fp16-noncausal": (torch.float16, torch.float16, dict(CAUSAL=False)),
    "fp32-causal": (torch.float32, torch.float32, dict(CAUSAL=True)),
}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("feature", ATTENTION_FEATURES)
def test_paged_attention_kernel(target: str, feature: str) -> None:
    dtype, cache_dtype, flags = ATTENTION_FEATURES[feature]
    cfg = _table(target).attention
    group = 4
    block_m = max(cfg.block_m, group)
    i32 = torch.int32
    sinks = torch.float32 if flags.get("SINKS") else dtype  # without sinks: the query, unread
    pointers = {"q_ptr": dtype, "o_ptr": dtype, "cache_ptr": cache_dtype, "sinks_ptr": sinks}
    pointers.update(
        tile_seq_ptr=i32, tile_q0_ptr=i32, qsl_ptr=i32, seq_lens_ptr=i32, block_table_ptr=i32
    )
    constexprs: dict[str, Any] = dict(
        GROUP=group,
        HEAD_SIZE=128,
        PAGE=16,
        BLOCK_M=block_m,
        BLOCK_Q=block_m // group,
        BLOCK_N=cfg.block_n,
        BLOCK_D=128,
        CAUSAL=False,
        WINDOW=False,
        SOFT_CAP=False,
        SINKS=False,
    )
    constexprs.update(flags)
    # the launcher's own choice of dot operand types for a GPU (any non-CPU device type)
    constexprs.update(attention._dot_types(dtype, cache_dtype, torch.device("cuda")))
    _compile(
        target,
        attention._paged_attention_kernel,
        pointers,
        constexprs,
        ("scale", "k_scale", "v_scale", "soft_cap"),
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("zero", [False, True], ids=["copy", "zero"])
def test_block_copy_kernel(target: str, zero: bool) -> None:
    cfg = _table(target).copy
    pointers = {"t_ptr": torch.int16, "src_ptr": torch.int32, "dst_ptr": torch.int32}
    _compile(
        target,
        state_copy._block_copy_kernel,
        pointers,
        dict(ZERO=zero, BLOCK=cfg.block),
        num_warps=cfg.num_warps,
    )


# fused multiply-adds of fp32 values in each target's assembly (the int8 MMAs are not these)
FP32_FMA = {"sm90": ("fma.rn.f32",), "gfx942": ("v_fma_f32", "v_fmac_f32", "v_pk_fma_f32")}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("tier", ["decode", "prefill"])
@pytest.mark.parametrize(
    "out_dtype,bias,even_k",
    [(torch.bfloat16, True, False), (torch.float16, False, True), (torch.float32, True, True)],
    ids=["bf16-bias", "fp16-even-k", "fp32-bias-even-k"],
)
def test_scaled_mm_kernel(
    target: str, tier: str, out_dtype: torch.dtype, bias: bool, even_k: bool
) -> None:
    """Both tiles of the launch table, with the launcher's compile options: no fp32 FMA in the
    epilogue (an FMA would round ``t * w_scale + bias`` once where the reference rounds twice)."""
    tile = getattr(_table(target).scaled_mm, tier)
    bf16 = out_dtype == torch.bfloat16
    pointers = {"x_ptr": torch.int8, "w_ptr": torch.int8, "xs_ptr": torch.float32}
    pointers.update(ws_ptr=torch.float32, bias_ptr=torch.float32)
    pointers["out_ptr"] = out_dtype
    constexprs = dict(HAS_BIAS=bias, OUT_BF16=bf16, EVEN_K=even_k, BLOCK_M=tile.block_m)
    constexprs.update(BLOCK_N=tile.block_n, BLOCK_K=tile.block_k)
    kernel = _compile(
        target,
        scaled_mm._scaled_mm_kernel,
        pointers,
        constexprs,
        num_warps=tile.num_warps,
        num_stages=tile.num_stages,
        **scaled_mm.COMPILE_OPTIONS,
    )
    assembly = kernel.asm["ptx" if target == "sm90" else "amdgcn"]
    fused = [op for op in FP32_FMA[target] if op in assembly]
    assert not fused, f"fp32 FMAs {fused} in the {tier} kernel for {target}"
