"""FlashInfer versions: the validated range and the features gated on a version.

Pure functions of ``DeviceInfo.libraries`` (never an import of flashinfer), so that what-if
planning can ask "would FlashInfer 0.6.16 serve ragged speculative decode?" without it.
"""

from __future__ import annotations

from dataclasses import dataclass

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from plugin_api.contract.decision import Decision
from plugin_api.device_info import DeviceInfo

DISTRIBUTION = "flashinfer-python"
# The versions whose API this plugin binds its calls against (tests/test_flashinfer_calls.py)
# and whose kernels the GPU script checks. Widen only after both have passed on the new version.
VALIDATED = SpecifierSet(">=0.7.4,<0.7.5")


@dataclass(frozen=True, slots=True)
class VersionGate:
    """A feature that exists, or is only known to be right, in some FlashInfer versions."""

    feature: str
    requires: SpecifierSet
    why: str


# Each gate names where its range comes from; a spec using the feature is refused outside it.
RAGGED_DECODE = VersionGate(
    "ragged speculative decode (XQA q_cu_seq_lens)",
    SpecifierSet(">=0.6.16.post1"),
    "q_cu_seq_lens first appears in FlashInfer 0.6.16.post1",
)
SM90_SLIDING_WINDOW = VersionGate(
    "sliding window on the SM90 XQA decode",
    SpecifierSet(">=0.6.17"),
    "per-draft-row windows landed in FlashInfer 0.6.17; older versions mask windows wrongly",
)
FP8_QUERY_WINDOW = VersionGate(
    "sliding window with fp8 queries",
    SpecifierSet("==0.6.17"),
    "validated upstream only on FlashInfer 0.6.17; other versions were never checked",
)


def installed(info: DeviceInfo) -> Version | None:
    """The FlashInfer version ``info`` records, or None when absent or unparsable."""
    raw = info.library(DISTRIBUTION)
    if raw is None:
        return None
    try:
        return Version(raw)
    except InvalidVersion:
        return None


def check_installed(info: DeviceInfo) -> Decision:
    """Accept when a FlashInfer inside ``VALIDATED`` is installed, else say what is wrong."""
    raw = info.library(DISTRIBUTION)
    if raw is None:
        return Decision.reject(
            f"{DISTRIBUTION} is not installed; install plugin-api-cuda-sm90[flashinfer] "
            f"({DISTRIBUTION}{VALIDATED})"
        )
    v = installed(info)
    if v is None:
        return Decision.reject(f"{DISTRIBUTION} version {raw!r} cannot be parsed")
    if not VALIDATED.contains(v, prereleases=True):
        return Decision.reject(
            f"{DISTRIBUTION} {v} is outside the validated range {VALIDATED}; "
            f"install {DISTRIBUTION}{VALIDATED}"
        )
    return Decision.accept(f"{DISTRIBUTION} {v} (validated range {VALIDATED})")


def check_gate(gate: VersionGate, info: DeviceInfo) -> Decision:
    v = installed(info)
    if v is not None and gate.requires.contains(v, prereleases=True):
        return Decision.accept()
    shown = "not installed" if v is None else str(v)
    return Decision.reject(
        f"{gate.feature} needs {DISTRIBUTION}{gate.requires} ({gate.why}); installed: {shown}"
    )
