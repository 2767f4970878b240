"""The kit's closing summary (which implementations ran, how many cases the backend rejected)
counts the same with pytest-xdist as without: the GPU script runs the kit in 8 workers, and
the first H200 run printed "no op ran" above 198 passed tests while the counts lived in them."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("xdist")
SERIAL: list[str] = []
XDIST = ["-p", "xdist", "-n", "2"]


def summary(backend: str, select: str, workers: list[str], cwd: Path) -> list[str]:
    cmd = [sys.executable, "-m", "pytest", f"--plugin-api-backend={backend}", "-k", select]
    cmd += ["-q", "-p", "no:cacheprovider", *workers]
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    section = r.stdout.split(f"plugin-api conformance: {backend}", 1)[1]
    lines = section.splitlines()[1:]
    return [ln for ln in lines if re.match(r"^(quant|state|gemm|attention)\s", ln)]


def test_op_counts_survive_xdist(tmp_path: Path) -> None:
    serial = summary("reference", "test_group_quant_bit_exact", SERIAL, tmp_path)
    assert len(serial) == 1 and re.match(r"^quant\s+reference:reference x\d+$", serial[0])
    assert summary("reference", "test_group_quant_bit_exact", XDIST, tmp_path) == serial


def test_rejection_counts_survive_xdist(tmp_path: Path) -> None:
    serial = summary("cpu-arm-acl", "test_state", SERIAL, tmp_path)
    assert serial == ["state      5 case(s) rejected by the backend (skipped with reasons)"]
    assert summary("cpu-arm-acl", "test_state", XDIST, tmp_path) == serial
