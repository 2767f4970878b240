"""``tools/host_time.py`` runs where no GPU is (its figures are the CPU-side record of issue
34's host path): it must keep working as the plugin changes. Checks the output's shape only;
timings are the tool's to report, not a test's to judge."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parents[1] / "tools" / "host_time.py"


def test_host_time_reports_every_part_for_both_shapes() -> None:
    r = subprocess.run(
        [sys.executable, str(TOOL), "--json"], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr[-2000:]
    rows = json.loads(r.stdout)["rows"]
    assert [(row["batch"], row["context"]) for row in rows] == [(1, 1024), (16, 8192)]
    for row in rows:
        for key in ("plan_us", "decode_call_us", "run_checks_us", "run_checks_full_us"):
            assert math.isfinite(row[key]) and row[key] > 0, (key, row)
