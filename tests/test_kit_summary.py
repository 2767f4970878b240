"""The kit's closing summary (which implementations ran, how many cases the backend rejected):

- it counts the same with pytest-xdist as without: the GPU script runs the kit in 8 workers,
  and the first H200 run printed "no op ran" above 198 passed tests while the counts lived in
  them; the sampled GEMM cases are the same in every worker (one seed, the controller's);
- the summary that docs/writing-a-plugin.md quotes for the worked example is the one a run of
  the kit against the installed example prints, line for line.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from .test_example_plugin import copy_example, pip_install
from .test_example_plugin import run as run_with_example

ROOT = Path(__file__).resolve().parent.parent
GUIDE = ROOT / "docs" / "writing-a-plugin.md"
SERIAL: list[str] = []
XDIST = ["-p", "xdist", "-n", "2"]


@pytest.fixture
def xdist() -> None:
    pytest.importorskip("xdist")


def summary(backend: str, select: str, workers: list[str], cwd: Path) -> list[str]:
    cmd = [sys.executable, "-m", "pytest", f"--plugin-api-backend={backend}", "-k", select]
    cmd += ["-q", "-p", "no:cacheprovider", *workers]
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    section = r.stdout.split(f"plugin-api conformance: {backend}", 1)[1]
    lines = section.splitlines()[1:]
    return [ln for ln in lines if re.match(r"^(quant|state|gemm|attention)\s", ln)]


@pytest.mark.usefixtures("xdist")
def test_op_counts_survive_xdist(tmp_path: Path) -> None:
    serial = summary("reference", "test_group_quant_bit_exact", SERIAL, tmp_path)
    assert len(serial) == 1 and re.match(r"^quant\s+reference:reference x\d+$", serial[0])
    assert summary("reference", "test_group_quant_bit_exact", XDIST, tmp_path) == serial


@pytest.mark.usefixtures("xdist")
def test_rejection_counts_survive_xdist(tmp_path: Path) -> None:
    serial = summary("cpu-arm-acl", "test_state", SERIAL, tmp_path)
    assert serial == ["state      5 case(s) rejected by the backend (skipped with reasons)"]
    assert summary("cpu-arm-acl", "test_state", XDIST, tmp_path) == serial


@pytest.mark.usefixtures("xdist")
def test_sampled_gemm_cases_are_the_same_in_every_worker(tmp_path: Path) -> None:
    """No ``--plugin-api-seed``: the controller draws one and hands it to its workers (each
    drawing its own would collect different tests, which pytest-xdist refuses)."""
    serial = summary("reference", "test_mm_bands", SERIAL, tmp_path)
    assert len(serial) == 1 and re.match(r"^gemm\s+reference:reference x\d+$", serial[0])
    assert summary("reference", "test_mm_bands", XDIST, tmp_path) == serial


# ---- the summary the guide quotes ------------------------------------------------------------

HEADER = "plugin-api conformance: example"


def quoted_summary(text: str) -> list[str]:
    """The ``text`` block of the guide that shows the kit's summary for the example."""
    found = [b for b in re.findall(r"^```text\n(.*?)^```", text, re.M | re.S) if HEADER in b]
    assert len(found) == 1, f"{GUIDE.name} should quote the example's kit summary once"
    return found[0].splitlines()


def printed_summary(stdout: str) -> list[str]:
    """The kit's summary section through pytest's closing counts, without the timing."""
    lines = stdout.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("=") and HEADER in ln)
    end = max(i for i, ln in enumerate(lines) if re.match(r"^\d+ (passed|failed|skipped)", ln))
    closing = re.sub(r" in [\d.]+s( \([\d:]+\))?$", "", lines[end])
    return [*lines[start:end], closing]


def drift(quoted: list[str], printed: list[str]) -> str | None:
    """Why the guide's quoted summary is not the printed one (``None``: they agree)."""
    if quoted == printed:
        return None
    return (
        "docs/writing-a-plugin.md quotes a kit summary for the example that a run does not "
        "print; replace the block with what the run printed:\n" + "\n".join(printed)
    )


RUN = """\
..........sss
======================= plugin-api conformance: example ========================
quant      torch:example:chunked-int8 x17
gemm       154 case(s) rejected by the backend (skipped with reasons)
17 passed, 298 skipped in 5.70s
"""


def test_the_drift_check_sees_a_stale_count_and_ignores_the_timing() -> None:
    printed = printed_summary(RUN)
    assert printed[-1] == "17 passed, 298 skipped" and printed[0].startswith("=")
    assert drift(printed, printed) is None
    stale = [ln.replace("x17", "x15") for ln in printed]
    assert drift(stale, printed) and "x17" in str(drift(stale, printed))
    assert drift(printed[:-1], printed)  # a line left out is drift too


def test_the_guide_quotes_the_summary_a_kit_run_prints(tmp_path: Path) -> None:
    site = tmp_path / "site"
    pip_install(copy_example(tmp_path / "src"), site)
    work = tmp_path / "work"
    work.mkdir()
    r = run_with_example(site, "-m", "pytest", "--plugin-api-backend=example", "-q",
                         "-p", "no:cacheprovider", env={"COLUMNS": "80"}, cwd=work)  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    problem = drift(quoted_summary(GUIDE.read_text(encoding="utf-8")), printed_summary(r.stdout))
    assert problem is None, problem
