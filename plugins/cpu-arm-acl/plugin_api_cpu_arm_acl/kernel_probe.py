"""Which oneDNN implementation the plugin's matmuls get on this machine, asked of oneDNN itself.

The CPU flags say what the hardware can do; they do not say what the oneDNN found will do with
it. An ACL built without ``fixed_format_kernels=1`` (Debian's, for one) has no kernel for
bf16 weights in oneDNN's packed layout, so oneDNN serves every bf16 matmul with its C++
reference gemm, with no error. So the machine facts carry, per problem kind, the implementation
that oneDNN's own primitive-descriptor creation picks (through its C API with ``ctypes``: no
compiler, no primitive, no weights; a few milliseconds), and the GEMM decisions read them
(``onednn_serves``): a kind served by reference code goes to the panel kernels or the
reference backend, with the reason in the report.

The descriptors mirror what ``csrc/matmul.cpp`` asks for (dense rows, weights format ``any``,
user scratchpad, ``MatmulForm``); a test compares the two on the machine it runs on.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path

from plugin_api.device_info import DeviceInfo

from .isa import ARM, bf16_matmul
from .matmul_form import MatmulForm, reference_kernel

FACT_PREFIX = "cpu-arm-acl.kernel."
FACT_ERROR = "cpu-arm-acl.kernel_probe_error"
NO_KERNEL = "none"  # no implementation at all (e.g. bf16 on AVX2: "unsupported isa")
M, N, K = 16, 4096, 4096  # the shape whose kernel is reported (gemm.PACK_M rows)

# oneDNN C API values (dnnl_common_types.h / dnnl_types.h, unchanged across 3.x; a test reads
# them back from the headers of the oneDNN found)
F16, BF16, F32, S8 = 1, 2, 3, 5  # dnnl_data_type_t
FORMAT_ANY = 1  # dnnl_format_tag_any
ENGINE_CPU = 1  # dnnl_cpu
SCRATCHPAD_USER = 1  # dnnl_scratchpad_mode_user
QUERY_IMPL_INFO_STR = 8  # dnnl_query_impl_info_str
QUERY_WEIGHTS_MD = 131  # dnnl_query_weights_md
ARG_WEIGHTS = 33  # DNNL_ARG_WEIGHTS
MAX_NDIMS = 12  # DNNL_MAX_NDIMS
Dims = ctypes.c_int64 * MAX_NDIMS


@dataclass(frozen=True, slots=True)
class Kind:
    """One problem kind: src/weights type, dst type, bias, per-channel weight scales."""

    name: str
    ab: int
    c: int
    bias: bool = False
    scales: bool = False


def kinds(form: MatmulForm) -> tuple[Kind, ...]:
    """The kinds ``OneDnnGemm`` asks for under ``form``."""
    bias = form.bias  # fp32 bias in the primitive (else a torch add on its fp32 dst)
    return (
        Kind("bf16->f32", BF16, F32, bias),
        Kind("bf16->bf16", BF16, BF16, bias),
        Kind("f32->f32", F32, F32, bias),
        Kind("s8->f32", S8, F32, scales=form.weight_scales),
    )


KIND_NAMES = tuple(k.name for k in kinds(MatmulForm()))


def probe_kernels(library: Path, form: MatmulForm) -> dict[str, str]:
    """``{kind name: oneDNN implementation name or NO_KERNEL}`` for the library at ``library``."""
    lib = ctypes.CDLL(str(library))
    lib.dnnl_primitive_desc_query_md.restype = ctypes.c_void_p  # a pointer, not an int
    engine = ctypes.c_void_p()
    _check(lib, "dnnl_engine_create", ctypes.byref(engine), ENGINE_CPU, ctypes.c_size_t(0))
    try:
        return {kind.name: _impl(lib, engine, kind) for kind in kinds(form)}
    finally:
        lib.dnnl_engine_destroy(engine)


def facts(library: Path, form: MatmulForm) -> dict[str, str]:
    """Machine facts: one per kind, or the error that stopped the probe (shown by the probe)."""
    try:
        found = probe_kernels(library, form)
    except (OSError, AttributeError, RuntimeError) as e:  # not loadable, or not a oneDNN 3
        return {FACT_ERROR: f"{library}: {e}"}
    return {FACT_PREFIX + name: impl for name, impl in found.items()}


def onednn_kernel(info: DeviceInfo, kind: str) -> str | None:
    """The implementation oneDNN picks for ``kind`` on the machine ``info`` describes, if known
    (a what-if ``DeviceInfo`` carries no such facts)."""
    return info.fact(FACT_PREFIX + kind)


def onednn_serves(info: DeviceInfo, kind: str) -> bool:
    """False when the facts show oneDNN has no kernel, or only reference code, for ``kind``."""
    impl = onednn_kernel(info, kind)
    return impl is None or (impl != NO_KERNEL and not reference_kernel(impl, info.machine))


def slow_bf16(info: DeviceInfo) -> str | None:
    """The first bf16 kind (f32 dst, bf16 dst) the facts show oneDNN serving without an
    optimised kernel, if any."""
    return next((k for k in ("bf16->f32", "bf16->bf16") if not onednn_serves(info, k)), None)


def onednn_bf16(info: DeviceInfo) -> bool:
    """Whether oneDNN runs bf16 matmuls (f32 and bf16 dst) in optimised kernels here: the CPU
    has the instructions (``isa.bf16_matmul``) and, where known, the oneDNN found uses them."""
    return bf16_matmul(info) and slow_bf16(info) is None


def why_not(info: DeviceInfo, kind: str) -> str:
    """Why ``onednn_serves(info, kind)`` is False, for a decision's reason."""
    impl = onednn_kernel(info, kind)
    got = "no kernel" if impl == NO_KERNEL else f"only its reference kernel {impl!r}"
    hint = (
        " (an ACL built without fixed_format_kernels=1 has no kernel for packed bf16 weights)"
        if info.machine in ARM and kind.startswith("bf16")
        else ""
    )
    return f"the oneDNN found has {got} for {kind} matmuls here{hint}"


def describe(info: DeviceInfo) -> str | None:
    """One line for the probe: each kind's implementation, reference ones marked."""
    found = {name: onednn_kernel(info, name) for name in KIND_NAMES}
    if all(v is None for v in found.values()):
        return None
    parts = []
    for name, impl in found.items():
        mark = " (reference code)" if impl and reference_kernel(impl, info.machine) else ""
        parts.append(f"{name} {impl or '?'}{mark}")
    return f"oneDNN kernels at M={M} N=K={N}: " + ", ".join(parts)


def _impl(lib: ctypes.CDLL, engine: ctypes.c_void_p, kind: Kind) -> str:
    """As ``csrc/matmul.cpp`` does: a descriptor with weights format ``any`` and an f32 dst
    picks the packed layout (``pack_weights``), then the kind's own descriptor over that
    layout is the primitive that runs (``make_matmul``); its implementation is the answer."""
    made: list[ctypes.c_void_p] = []

    def desc(rows: int, cols: int, dtype: int, *, any_format: bool = False) -> ctypes.c_void_p:
        md = ctypes.c_void_p()
        dims = Dims(rows, cols)
        if any_format:
            _check(lib, "dnnl_memory_desc_create_with_tag", ctypes.byref(md), 2, dims, dtype,
                   FORMAT_ANY)  # fmt: skip
        else:  # dense rows, as the plugin always passes them
            _check(lib, "dnnl_memory_desc_create_with_strides", ctypes.byref(md), 2, dims,
                   dtype, Dims(cols, 1))  # fmt: skip
        made.append(md)
        return md

    attr, packing, pd = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
    try:
        _check(lib, "dnnl_primitive_attr_create", ctypes.byref(attr))
        _check(lib, "dnnl_primitive_attr_set_scratchpad_mode", attr, SCRATCHPAD_USER)
        if kind.scales:
            _check(lib, "dnnl_primitive_attr_set_scales_mask", attr, ARG_WEIGHTS, 1 << 1)
        src, f32_dst = desc(M, K, kind.ab), desc(M, N, F32)
        create = lib.dnnl_matmul_primitive_desc_create
        weights = desc(K, N, kind.ab, any_format=True)
        if create(ctypes.byref(packing), engine, src, weights, None, f32_dst, attr) != 0:
            return NO_KERNEL  # dnnl_unimplemented: no implementation takes the problem
        packed = ctypes.c_void_p(lib.dnnl_primitive_desc_query_md(packing, QUERY_WEIGHTS_MD, 0))
        bias = desc(1, N, F32) if kind.bias else None
        dst = desc(M, N, kind.c)
        if create(ctypes.byref(pd), engine, src, packed, bias, dst, attr) != 0:
            return NO_KERNEL
        name = ctypes.c_char_p()
        _check(lib, "dnnl_primitive_desc_query", pd, QUERY_IMPL_INFO_STR, 0, ctypes.byref(name))
        return (name.value or b"").decode()
    finally:
        for handle in (pd, packing):
            if handle:
                lib.dnnl_primitive_desc_destroy(handle)
        if attr:
            lib.dnnl_primitive_attr_destroy(attr)
        for md in made:
            lib.dnnl_memory_desc_destroy(md)


def _check(lib: ctypes.CDLL, fn: str, *args: object) -> None:
    status = getattr(lib, fn)(*args)
    if status != 0:
        raise RuntimeError(f"{fn} returned dnnl_status_t {status}")
