"""The suite's order under pytest-xdist (the repository's root conftest.py), run for real on a
small project of its own with ``make test``'s options: whole modules per worker, the modules
that use the vLLM ``runs`` fixture first, and no change at all without xdist."""

from __future__ import annotations

import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

ROOT_CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"
XDIST = ["-p", "xdist", "-n", "2", "--dist", "loadscope", "--no-loadscope-reorder"]

CONFTEST = f"""
import importlib.util

import pytest

_spec = importlib.util.spec_from_file_location("suite_order", {str(ROOT_CONFTEST)!r})
_split = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_split)
pytest_collection_modifyitems = _split.pytest_collection_modifyitems


@pytest.fixture(scope="session")
def runs():
    return object()
"""

# module -> (uses the runs fixture, tests); each test sleeps so that both workers take work
MODULES = {
    "tests/test_host.py": (False, 6),
    "integrations/vllm/tests/test_generation.py": (True, 3),
    "integrations/vllm/tests/test_refusals.py": (False, 2),
    "integrations/vllm/tests/test_serving.py": (True, 2),
}


@pytest.fixture
def project(tmp_path: Path) -> Path:
    pytest.importorskip("xdist")
    # the suite's own collection order: the host's tests before the vLLM bridge's
    ini = "[pytest]\naddopts = -p no:cacheprovider\ntestpaths = tests integrations\n"
    (tmp_path / "pytest.ini").write_text(ini)
    (tmp_path / "conftest.py").write_text(CONFTEST)
    for module, (uses_runs, count) in MODULES.items():
        arg = "runs" if uses_runs else ""
        body = "import time\n\n" + "".join(
            f"\ndef test_{i}({arg}):\n    time.sleep(0.2)\n" for i in range(count)
        )
        path = tmp_path / module
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body)
    return tmp_path


def pytest_run(project: Path, *args: str) -> str:
    r = subprocess.run(
        [sys.executable, "-m", "pytest", *args], cwd=project, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout


def test_modules_stay_whole_and_runs_modules_go_first(project: Path) -> None:
    out = pytest_run(project, *XDIST, "-v")
    ran = re.findall(r"^\[(gw\d)\] \[\s*\d+%\] PASSED (\S+?)::(test_\d)", out, re.M)
    assert len(ran) == sum(count for _, count in MODULES.values()), out
    workers: dict[str, set[str]] = defaultdict(set)
    for worker, module, _ in ran:
        workers[module].add(worker)
    assert all(len(w) == 1 for w in workers.values()), workers
    first = {m for m, (uses_runs, _) in MODULES.items() if uses_runs}
    assert ran[0][1] in first, "a module that uses the runs starts first"
    assert {w for ws in workers.values() for w in ws} == {"gw0", "gw1"}, "both workers took work"


def test_without_xdist_nothing_moves(project: Path) -> None:
    out = pytest_run(project, "--collect-only", "-q")
    collected = [line.split("::")[0] for line in out.splitlines() if "::" in line]
    assert list(dict.fromkeys(collected)) == list(MODULES)  # testpaths order, then by name
