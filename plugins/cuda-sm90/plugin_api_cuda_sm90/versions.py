"""FlashInfer versions: the validated range, the only FlashInfer version gate of this plugin.

Pure functions of ``DeviceInfo.libraries`` (never an import of flashinfer), so that what-if
planning can ask "would FlashInfer 0.7.3 serve this?" without it.
"""

from __future__ import annotations

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from plugin_api.contract.decision import Decision
from plugin_api.device_info import DeviceInfo

DISTRIBUTION = "flashinfer-python"
# The versions whose API this plugin binds its calls against (tests/test_flashinfer_calls.py)
# and whose kernels the GPU script checks. Widen only after both have passed on the new version.
# No feature is gated on a version inside it: ragged speculative decode (XQA q_cu_seq_lens,
# 0.6.16.post1) and the SM90 per-draft-row sliding window (0.6.17) predate its floor; widening
# the floor below 0.6.17 would need those gates back.
VALIDATED = SpecifierSet(">=0.7.4,<0.7.5")


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
