"""The host's Triton kernels through the host ops, on a real backend made for the tests.

Where the kernels run: on the CPU under ``TRITON_INTERPRET=1`` (``make test`` runs this directory
that way, in its own process), else on the accelerator torch sees. This conftest never sets the
variable: triton reads it when it decorates a kernel, so setting it here would turn every later
triton user of the process into an interpreted one. Without either, the tests skip and say how
to run them; with ``TRITON_INTERPRET=1`` and no triton installed, collection fails.

The backend is a fixture distribution (``fx-triton-kernels``) installed into a temporary
directory on ``sys.path``: its implementations are the host's ``TritonAttention``/
``TritonScaledMm`` (int8 GEMM only)/``TritonQuant``/``TritonState`` on that device. It exists
only here; the product has no Triton-on-CPU backend.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest
import torch

from plugin_api.backend import Backend, backend_for
from plugin_api.settings import Settings

from ..distributions import write_plugin

BACKEND = "fx-triton-kernels"
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
if INTERPRET:
    import triton  # noqa: F401  (asked for the interpreter: a missing triton is an error)

DESCRIPTOR = """
from plugin_api.contract import BackendDescriptor
DESCRIPTOR = BackendDescriptor(
    id={id!r}, host_api=">=1.0,<2", priority=50,
    families=("attention", "gemm", "quant", "state"),
    device_kinds=("any",), hooks={hooks!r}, summary="test fixture: the host's Triton kernels",
)
"""

HOOKS = """
from plugin_api import Availability, hookimpl
from plugin_api.contract.decision import Decision
DEVICE = {device!r}
TRITONS = ("triton", "pytorch-triton-xpu", "pytorch-triton-rocm")
@hookimpl
def plugin_api_probe(info):
    return Availability.validated(DEVICE, "test fixture: the host's Triton kernels on " + DEVICE)
def no_capture(info):
    return Decision.reject("test fixture: no graph is captured")
@hookimpl
def plugin_api_implementations(family):
    from plugin_api.triton.impl import (
        TritonAttention, TritonQuant, TritonScaledMm, TritonState, TritonTarget,
    )
    impl = dict(
        attention=TritonAttention, gemm=TritonScaledMm, quant=TritonQuant, state=TritonState
    )[str(family)]
    return (impl(TritonTarget(DEVICE, TRITONS, no_capture)),)
"""


def kernel_device() -> torch.device | None:
    if INTERPRET:
        return torch.device("cpu")
    accelerator = getattr(torch, "accelerator", None)
    return accelerator.current_accelerator() if accelerator is not None else None


@pytest.fixture(scope="session")
def triton_device() -> torch.device:
    pytest.importorskip("triton", reason="the triton extra is not installed")
    device = kernel_device()
    if device is None:
        pytest.skip(
            "no accelerator, and TRITON_INTERPRET is not 1: run "
            "`TRITON_INTERPRET=1 pytest tests/triton_kernels` (make test does)"
        )
    return device


@pytest.fixture(scope="session")
def triton_backend(
    triton_device: torch.device, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Backend]:
    """The fixture backend, strict: any fallback to the reference is an error."""
    root = tmp_path_factory.mktemp("site")
    write_plugin(
        root,
        dist=BACKEND,
        backend_id=BACKEND,
        package="fx_triton_kernels",
        descriptor=DESCRIPTOR,
        hooks=HOOKS,
        fields={"device": triton_device.type},
    )
    sys.path.insert(0, str(root))
    try:
        yield backend_for(BACKEND, settings=Settings(strict=True, plugins=frozenset({BACKEND})))
    finally:
        sys.path.remove(str(root))
        for name in [m for m in sys.modules if m.startswith("fx_triton_kernels")]:
            del sys.modules[name]
