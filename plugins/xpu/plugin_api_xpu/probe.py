"""Does torch reach an Intel GPU here, and what does the installed stack offer it?

Everything is a pure function of ``DeviceInfo``. What only the real machine can tell (graph
capture in the installed torch, ``torch.mm(out_dtype=...)`` on XPU, whether IPEX imports) is
read by ``facts.read`` into ``DeviceInfo.facts`` first; a what-if description without those
facts gets the conservative answer, with the reason.
"""

from __future__ import annotations

from plugin_api.contract import Availability
from plugin_api.device_info import DeviceInfo

from . import facts

VALIDATED_FAMILIES = {"pvc": "Data Center GPU Max", "bmg": "Arc B-series", "dg2": "Arc A-series"}

# The host's portable kernels serve attention, quantization and state copies on XPU; whether
# they run in graphs (torch.xpu.XPUGraph) is the xpu.graph_capture fact.
TRITON = facts.FACTS.triton_target()


def ipex_status(info: DeviceInfo) -> str:
    """IPEX is never required and no op routes through it; this only reports what is there."""
    ipex = info.library(facts.IPEX)
    if ipex is None:
        return "IPEX not installed (optional; upstream torch.xpu + Triton serve every op)"
    torch_v = info.torch.version if info.torch else "?"
    if facts.minor(ipex) != facts.minor(torch_v):
        return (
            f"IPEX {ipex} is built for torch {facts.minor(ipex)}, not {torch_v}: not used "
            "(it would fail to load; IPEX development has ended)"
        )
    imported = info.fact(facts.IPEX_IMPORT)
    if imported is not None and not imported.startswith("yes"):
        return f"IPEX {ipex} matches torch {torch_v} but does not import ({imported}): not used"
    return (
        f"IPEX {ipex} matches torch {torch_v}: optional, and no op of this plugin routes "
        "through it (upstream torch.xpu + Triton serve every op)"
    )


def probe(info: DeviceInfo) -> Availability:
    if info.torch is None:
        return Availability.unavailable("torch is not installed")
    if not info.torch.xpu:
        return Availability.unavailable(
            f"torch {info.torch.version} was built without XPU support "
            "(torch.xpu.is_available() is False)"
        )
    gpus = info.accelerators_of("intel")
    if not gpus:
        return Availability.unavailable(
            "torch.xpu.is_available() is False: no Intel GPU visible to this XPU build"
        )
    gpu = gpus[0]
    kernels = TRITON.probe_line(info, "attention, quant and state")
    family = VALIDATED_FAMILIES.get(gpu.arch)
    if family is not None:
        return Availability.validated("xpu", f"{gpu.name} ({family})", kernels, ipex_status(info))
    return Availability.experimental(
        "xpu",
        f"{gpu.name}: an Intel GPU outside the validated families",
        kernels,
        ipex_status(info),
    )
