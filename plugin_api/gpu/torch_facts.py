"""What the installed torch does on a platform's device: facts read on the real machine into
``DeviceInfo.facts``, and read back as decisions by probes and ``supports``.

A GPU plugin declares ``TorchFacts(<its id>, <its platform>)`` once, reads the facts it needs
from its ``plugin_api_machine_facts`` hook (``facts.read(GRAPH_CAPTURE, ...)``) and asks
``facts.graph_capture(info)`` and the like when deciding. Values are ``"yes: <detail>"`` or
``"no: <detail>"`` under ``"<backend id>.<name>"``. A what-if ``DeviceInfo`` carries none, so
each decision then rejects and says the fact is read on the real machine: nothing is claimed
that the installed torch has not shown. Light: the trials (and torch) load inside ``read``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..contract.decision import Decision
from ..device_info import DeviceInfo
from .platforms import Platform
from .triton_target import TritonTarget

GRAPH_CAPTURE = "graph_capture"  # a graph captures and replays work on the device
MM_OUT_DTYPE = "mm_out_dtype"  # torch.mm(bf16, bf16, out_dtype=torch.float32) runs there
INT_MM = "int_mm"  # torch._int_mm computes an exact int8 product there
NAMES = (GRAPH_CAPTURE, MM_OUT_DTYPE, INT_MM)


@dataclass(frozen=True, slots=True)
class TorchFacts:
    backend: str  # the plugin's id: the facts' namespace
    platform: Platform

    def key(self, name: str) -> str:
        if name not in NAMES:
            raise ValueError(f"TorchFacts: unknown fact {name!r}; known: {', '.join(NAMES)}")
        return f"{self.backend}.{name}"

    def read(self, *names: str) -> dict[str, str]:
        """Run the trials for ``names`` on this machine (for ``plugin_api_machine_facts``)."""
        keys = {name: self.key(name) for name in names}
        from .device_trials import trial

        return {key: trial(name, self.platform) for name, key in keys.items()}

    def decision(self, info: DeviceInfo, name: str, what: str) -> Decision:
        """Accept or reject by the fact ``name`` in ``info``; the reason starts with ``what``."""
        key = self.key(name)
        value = info.fact(key)
        if value is None:
            return Decision.reject(
                f"{what}: not established for this machine description (fact {key!r} is read "
                "from the installed torch on the real machine)"
            )
        verdict, _, detail = value.partition(": ")
        return Decision(verdict == "yes", (f"{what}: {detail or verdict}",))

    def graph_capture(self, info: DeviceInfo) -> Decision:
        return self.decision(info, GRAPH_CAPTURE, f"{self.platform.graph_name} capture")

    def mm_out_dtype(self, info: DeviceInfo) -> Decision:
        where = self.platform.name
        return self.decision(info, MM_OUT_DTYPE, f"torch.mm(out_dtype=float32) on {where}")

    def int_mm(self, info: DeviceInfo) -> Decision:
        return self.decision(info, INT_MM, f"torch._int_mm on {self.platform.name}")

    def triton_target(self) -> TritonTarget:
        """Where the host's Triton kernels run for this plugin, graph capture from the facts."""
        return self.platform.triton_target(self.graph_capture)
