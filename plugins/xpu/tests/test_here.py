"""On a machine without an Intel GPU: what a user sees from doctor and from the kit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from plugin_api.device_info import read_device_info

REPO = Path(__file__).resolve().parents[3]
if read_device_info().accelerators_of("intel"):
    pytest.skip("this machine has an Intel GPU: the kit runs for real", allow_module_level=True)


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLUGIN_API_")}
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=env, cwd=REPO, timeout=300
    )


def test_doctor_lists_xpu_unavailable_with_what_it_would_provide():
    r = _run("-m", "plugin_api", "doctor", "--json")
    assert r.returncode == 0, r.stderr
    xpu = next(p for p in json.loads(r.stdout)["plugins"] if p["id"] == "xpu")
    assert xpu["state"] == "unavailable"
    assert any("torch.xpu.is_available() is False" in reason for reason in xpu["reasons"])
    assert xpu["families"] == ["attention", "gemm", "quant", "state"]
    assert xpu["device_kinds"] == ["xpu"]


def test_kit_targeting_xpu_skips_with_the_probe_reason():
    """Skipping a backend unavailable here takes --plugin-api-skip-unavailable; without it the
    kit stops with exit 4 and the probe's reason (a CI typo must not pass as a skipped run)."""
    kit = ("-m", "pytest", "--plugin-api-backend=xpu", "-q", "-p", "no:cacheprovider")
    r = _run(*kit, "--plugin-api-skip-unavailable")
    assert r.returncode == 0, r.stdout[-3000:]
    assert " passed" not in r.stdout and " failed" not in r.stdout
    assert "backend 'xpu' is unavailable on this machine" in r.stdout
    assert "torch.xpu.is_available() is False" in r.stdout
    assert "no op ran: every test was skipped" in r.stdout
    stopped = _run(*kit)
    assert stopped.returncode == 4
    assert "backend 'xpu' is unavailable on this machine" in stopped.stdout + stopped.stderr
