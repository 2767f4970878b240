"""tools/attention_check.py (what arm64_emulated.sh runs on an emulated Arm CPU) on this
machine's variant: its cases still fit the conformance kit's tables, and all of them pass."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

from plugin_api.device_info import read_device_info
from plugin_api_cpu_arm_acl import _attention_ext as ext

TOOLS = Path(__file__).resolve().parents[1] / "tools"


def load_tool(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, TOOLS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(
    ext.isa_path(read_device_info()) is None, reason="this CPU has no supported vector ISA"
)
def test_attention_check_passes_on_this_machine(tmp_path):
    tool = load_tool("attention_check")
    report = tmp_path / "check.json"
    rc = tool.main(["--threads", "2", "--matrix", "off", "--json", str(report)])
    summary = json.loads(report.read_text())
    assert rc == 0, summary["failures"]
    assert summary["failed"] == 0 and summary["passed"] + summary["skipped"] == len(
        list(tool.cases())
    )
    assert summary["passed"] > 100
