"""Small runs on the real device that tell what the installed torch does there.

Each trial returns a fact value, ``"yes: <detail>"`` or ``"no: <detail>"``, and touches the
device only when torch is built for the platform and sees a device of it (a ROCm plugin installed
beside a CUDA torch never runs anything). Read through ``TorchFacts.read``; never for what-if.
"""

from __future__ import annotations

import torch

from ..device_info import TorchBuild
from ..reference.gemm import has_out_dtype_mm
from . import device_graphs
from .platforms import Platform

# torch._int_mm on CUDA/ROCm wants more than 16 rows and K, N multiples of 8
_INT_MM_SHAPE = (32, 64, 32)  # M, K, N


def _torch_build() -> TorchBuild:
    return TorchBuild(
        torch.__version__,
        cuda=torch.version.cuda,
        hip=torch.version.hip,
        xpu=bool(getattr(torch._C, "_has_xpu", False)),
    )


def unreachable(platform: Platform) -> str | None:
    """Why no trial can run for ``platform`` here (a ``"no: ..."`` value), or None."""
    v = torch.__version__
    if not platform.built_into(_torch_build()):
        return f"no: torch {v} is not built for {platform.name}"
    if not device_graphs.graph_module(platform.device_type).is_available():
        return f"no: no {platform.name} device visible to torch {v}"
    return None


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}".rstrip(": ")


def graph_capture(platform: Platform) -> str:
    """Capture an in-place add in a graph, replay it, and check that the replay repeated it."""
    v, dt = torch.__version__, platform.device_type
    cls = device_graphs.GRAPH_CLASSES[dt]
    if not hasattr(device_graphs.graph_module(dt), cls):
        return f"no: torch {v} has no torch.{dt}.{cls}"
    x = torch.zeros(8, device=dt)

    def step() -> None:
        x.add_(1.0)

    try:
        graph = device_graphs.capture(step, dt)  # eager warm-up + capture: x == 1
        graph.replay()
        device_graphs.synchronize(dt)
    except Exception as e:  # any failure means "no", with the error as the detail
        return f"no: capturing a {platform.graph_name} failed ({_first_line(e)})"
    if x.cpu().tolist() != [2.0] * 8:
        return f"no: a replayed {platform.graph_name} did not repeat its work (torch {v})"
    return f"yes: torch {v} captures and replays {platform.graph_name}s (torch.{dt}.{cls})"


def mm_out_dtype_on(device: torch.device, where: str) -> str:
    """Does ``torch.mm(bf16, bf16, out_dtype=torch.float32)`` run on ``device``?"""
    v = torch.__version__
    if has_out_dtype_mm(device):
        return f"yes: torch {v} computes it"
    return f"no: torch {v} raises for it on {where}"


def int_mm_on(device: torch.device, where: str) -> str:
    """Does ``torch._int_mm`` compute an exact int8 product on ``device``? The weight is read
    through a transposed view, as ``scaled_mm`` passes it."""
    v = torch.__version__
    if not hasattr(torch, "_int_mm"):
        return f"no: torch {v} has no torch._int_mm"
    m, k, n = _INT_MM_SHAPE
    g = torch.Generator().manual_seed(0)
    a = torch.randint(-128, 128, (m, k), generator=g, dtype=torch.int8)
    w = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8)
    try:
        got = torch._int_mm(a.to(device), w.to(device).t()).cpu()
    except Exception as e:  # any failure means "no", with the error as the detail
        return f"no: torch._int_mm raised on {where} ({_first_line(e)})"
    if not torch.equal(got, a.int() @ w.int().t()):
        return f"no: torch._int_mm on {where} gave a wrong product (torch {v})"
    return f"yes: torch {v} computes it"


GEMM_TRIALS = {"mm_out_dtype": mm_out_dtype_on, "int_mm": int_mm_on}  # on any device


def trial(name: str, platform: Platform) -> str:
    """The fact ``name`` (``graph_capture`` or a key of ``GEMM_TRIALS``) for ``platform``."""
    if (why := unreachable(platform)) is not None:
        return why
    if name == "graph_capture":
        return graph_capture(platform)
    return GEMM_TRIALS[name](torch.device(platform.device_type), platform.name)
