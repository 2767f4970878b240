"""The group quant's NEON path (csrc/group_quant.cpp) on an emulated Arm CPU: a static aarch64
driver (group_quant_driver.cpp, no torch) built twice, with the NEON path and with the scalar
one only (PA_GROUP_QUANT_SCALAR), runs under qemu-aarch64 on the same edge cases; the two must
agree bit for bit, and with the reference backend."""

from __future__ import annotations

import shutil
import struct
import subprocess
from pathlib import Path

import pytest
import torch

from plugin_api.ops.quant import QuantSpec, scales_like
from plugin_api.reference.quant import ReferenceQuant

CXX, QEMU = "aarch64-linux-gnu-g++", "qemu-aarch64"
CSRC = Path(__file__).resolve().parents[1] / "plugin_api_cpu_arm_acl" / "csrc"
DRIVER = Path(__file__).with_name("group_quant_driver.cpp")
FP8 = torch.float8_e4m3fn
DT_CODES = {torch.float32: 1, torch.bfloat16: 2, torch.float16: 4}  # kernels.h's Dt

pytestmark = pytest.mark.skipif(
    shutil.which(CXX) is None or shutil.which(QEMU) is None,
    reason=f"needs {CXX} (Debian: g++-aarch64-linux-gnu) and {QEMU} (Debian: qemu-user)",
)


@pytest.fixture(scope="module")
def drivers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The driver for aarch64, as the plugin's build compiles the kernel (no fp contraction)."""
    folder = tmp_path_factory.mktemp("group-quant-arm")
    built = {}
    for path, defines in (("neon", []), ("scalar", ["-DPA_GROUP_QUANT_SCALAR"])):
        exe = folder / f"driver-{path}"
        cmd = [CXX, "-std=c++17", "-static", "-O2", "-ffp-contract=off", *defines]
        done = subprocess.run(
            [*cmd, f"-I{CSRC}", str(DRIVER), "-o", str(exe)], capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr[-3000:]
        built[path] = exe
    return built


def _values(m: int, k: int, group: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Rows at many magnitudes with every edge case the kernel branches on: zeros, -0.0, ties,
    fp8's fixed-point range next to a large value, subnormal inputs (a subnormal scale), NaN,
    +-inf, values at the clamp bounds; the last group of each row also ends in the scalar tail
    when group % 8 != 0."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * torch.logspace(-3, 3, m).unsqueeze(1)
    x[0] = 0.0
    x[1, ::2] = -0.0
    x[2, :16] = torch.tensor([127.0, -63.5, 0.5, 1.5, -2.5, 3.5, 2.0**-9, -(2.0**-10)] * 2)[
        : min(16, k)
    ]
    x[3, : k // 2] = 1e-4 * torch.randn(k // 2, generator=g)
    x[3, 0] = 448.0
    tiny = {torch.float32: 1e-39, torch.bfloat16: 1e-39, torch.float16: 3e-6}[dtype]
    x[4] = torch.randn(k, generator=g) * tiny  # subnormal in the input dtype
    x[5, group // 2] = float("nan")
    x[6, min(k - 1, group + 1)] = float("inf")
    x[6, k - 1] = -float("inf")
    x[7, k - 1] = float("nan")  # the last element: the scalar tail where group % 8 != 0
    x[7, 0] = -float("nan")
    return x.to(dtype)


CASES = [
    (dtype, qdtype, group, k, ue8m0, col)
    for dtype in (torch.bfloat16, torch.float16, torch.float32)
    for qdtype in (torch.int8, FP8)
    for group, k, ue8m0, col in (
        (128, 512, False, False),
        (8, 64, False, True),
        (12, 96, True, False),
        (100, 300, False, True),
        (7, 21, False, False),
        (64, 256, True, True),
    )
]


def _run(exe: Path, payload: bytes) -> tuple[str, bytes]:
    done = subprocess.run([QEMU, str(exe)], input=payload, capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    return done.stderr.decode().strip(), done.stdout


def test_neon_path_matches_scalar_and_reference(drivers):
    m = 12
    payload, inputs = b"", []
    for seed, (dtype, qdtype, group, k, ue8m0, col) in enumerate(CASES):
        x = _values(m, k, group, dtype, seed)
        header = (DT_CODES[dtype], m, k, group, int(qdtype == FP8), int(ue8m0), int(col))
        payload += (
            struct.pack("<7qd", *header, 1e-10) + x.contiguous().view(torch.uint8).numpy().tobytes()
        )
        inputs.append(x)
    isa, neon = _run(drivers["neon"], payload)
    assert isa == "neon"
    isa, scalar = _run(drivers["scalar"], payload)
    assert isa == "scalar"
    assert len(neon) == len(scalar)
    assert neon == scalar, "the NEON path's codes or scales differ from the scalar path's"
    at = 0
    for x, (dtype, qdtype, group, k, ue8m0, col) in zip(inputs, CASES, strict=True):
        q = torch.frombuffer(bytearray(neon[at : at + m * k]), dtype=torch.uint8).view(m, k)
        at += m * k
        n = m * (k // group)
        s = torch.frombuffer(bytearray(neon[at : at + 4 * n]), dtype=torch.float32).view(m, -1)
        at += 4 * n
        spec = QuantSpec(k, group, dtype, qdtype, col, ue8m0)
        want_q = torch.empty(m, k, dtype=qdtype)
        want_s = scales_like(m, k // group, col, torch.device("cpu"))
        ReferenceQuant().quantize(spec, x, 1e-10, want_q, want_s)
        case = f"{dtype} -> {qdtype}, group {group}, ue8m0={ue8m0}"
        want = want_q.view(torch.uint8).clone()
        if qdtype == FP8:
            # inf / inf: the NaN an invalid operation makes is negative on x86 (where the
            # reference ran) and positive on Arm: only its sign may differ
            made = x.float().isinf() & s.isinf().repeat_interleave(group, dim=1)
            assert ((want[made] & 0x7F) == 0x7F).all(), case
            want[made] = (want[made] & 0x7F) | (q[made] & 0x80)
        assert torch.equal(q, want), case
        assert torch.equal(s.isnan(), want_s.isnan()), case
        assert torch.equal(s.nan_to_num(), want_s.nan_to_num()), case
    assert at == len(neon)
