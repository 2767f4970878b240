"""What a oneDNN matmul primitive can be asked for without landing on oneDNN's reference code.

oneDNN picks the first implementation that accepts a problem; its last resort is a portable C++
loop (``ref:any``) orders of magnitude slower, chosen without an error. Which problems the fast
kernels accept differs by build, so the plugin asks only for forms they take and checks the
implementation each primitive got (``reference_kernel``):

- Dense src and dst, always: oneDNN 3.2's x86 ``brg`` kernels reject a row stride larger than the
  row (measured: every strided bf16, f32 and s8 problem got ``ref:any``). The plugin stages a
  strided operand through a dense buffer (one copy of M rows, small beside the weight read).
- On Arm (``MatmulForm.for_machine``): oneDNN's ACL kernels take no bias for floating types
  (``gemm:acl``) and no scales with an f32 dst (``lowp_gemm:acl``), so bias and the weight scales
  run in the torch epilogue on the fp32 dst.
"""

from __future__ import annotations

from dataclasses import dataclass

from .isa import ARM


@dataclass(frozen=True, slots=True)
class MatmulForm:
    """Which parts of a GEMM beyond the product the primitive itself does; the rest runs as one
    torch epilogue on its fp32 dst (so a 16-bit output is still rounded once)."""

    bias: bool = True  # bias added by the primitive
    weight_scales: bool = True  # int8: per-channel weight scales applied by the primitive

    @staticmethod
    def for_machine(machine: str) -> MatmulForm:
        return ACL if machine in ARM else FULL


FULL = MatmulForm()
ACL = MatmulForm(bias=False, weight_scales=False)


def reference_kernel(impl: str, machine: str) -> bool:
    """Whether oneDNN's implementation name ``impl`` (``impl_info_str``) is reference code.

    ``ref:any``/``ref_int8:any`` everywhere. On aarch64 also ``gemm:jit*``: oneDNN's gemm-based
    matmul there runs its C++ reference gemm (there is no aarch64 jit sgemm or s8 gemm) under
    the x86 name.
    """
    return impl.startswith("ref") or (machine in ARM and impl.startswith("gemm:jit"))
