"""``plugin-api check``: the conformance kit against the selected backend, with progress."""

from __future__ import annotations

import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

import pytest

from ..conformance.plugin import KIT_DIR, OPTION, SEED_OPTION, kit_seed


@dataclass
class KitResults:
    """pytest plugin: counts outcomes per kit module and draws a progress bar on stderr."""

    show_progress: bool = True
    total: int = 0
    done: int = 0
    outcomes: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    failures: list[dict[str, str]] = field(default_factory=list)
    skips: Counter[str] = field(default_factory=Counter)
    paths: dict[str, dict[str, int]] = field(default_factory=dict)
    seed: int | None = None  # the sampled cases' seed (``--plugin-api-seed`` repeats them)

    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        self.total = len(items)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        family = report.nodeid.split("test_", 1)[-1].split(".py")[0]
        if report.when == "call" or (report.when == "setup" and not report.passed):
            outcome = report.outcome
            self.outcomes[family][outcome] += 1
            self.done += 1
            if report.failed:
                self.failures.append({"test": report.nodeid, "error": _last_line(report)})
            if report.skipped and isinstance(report.longrepr, tuple):
                self.skips[str(report.longrepr[2]).removeprefix("Skipped: ")] += 1
            self._draw()

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        self.seed = kit_seed(session.config)
        cov = session.config.pluginmanager.get_plugin("plugin-api-coverage")
        if cov is not None:
            self.paths = {f: dict(c) for f, c in cov.paths.items()}
        if self.show_progress and sys.stderr.isatty():
            sys.stderr.write("\n")

    def _draw(self) -> None:
        if not self.show_progress or not self.total:
            return
        width = 40
        filled = int(width * self.done / self.total)
        bad = sum(c["failed"] for c in self.outcomes.values())
        bar = f"  [{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total}  failed {bad}"
        if sys.stderr.isatty():
            sys.stderr.write("\r" + bar)
        elif self.done == self.total or self.done % max(1, self.total // 4) == 0:
            sys.stderr.write(bar + "\n")  # a log gets a few lines, not a carriage-return blur
        sys.stderr.flush()


def _last_line(report: pytest.TestReport) -> str:
    text = str(report.longrepr).strip().splitlines()
    errors = [ln for ln in text if ln.startswith("E ")]
    return (errors[0] if errors else text[-1] if text else "failed")[:300]


def run_kit(
    backend_id: str,
    *,
    progress: bool = True,
    seed: int | None = None,
    cases: str | None = None,
) -> tuple[int, KitResults]:
    """Run the kit in this process; the exit code is pytest's, as
    ``pytest --plugin-api-backend=ID`` would return it (see ``conformance.plugin``).
    ``cases``: a pytest ``-k`` expression choosing a subset (e.g. ``"gemm or quant"``)."""
    results = KitResults(show_progress=progress)
    # Our own output replaces pytest's; the caller's ini options must not leak in.
    args = [
        str(KIT_DIR),
        f"{OPTION}={backend_id}",
        "-o",
        "addopts=",
        "-p",
        "no:terminal",
        "-p",
        "no:cacheprovider",
        "--import-mode=importlib",
        f"--rootdir={KIT_DIR}",
    ]
    if seed is not None:
        args.append(f"{SEED_OPTION}={seed}")
    if cases is not None:
        args += ["-k", cases]
    code = pytest.main(args, plugins=[results])
    return int(code), results


def results_dict(
    backend_id: str, code: int, r: KitResults, cases: str | None = None
) -> dict[str, Any]:
    return {
        "backend": backend_id,
        "cases": cases,  # the -k subset; None: the whole kit
        "passed": code == 0,
        "exit_code": code,
        "families": {f: dict(c) for f, c in sorted(r.outcomes.items())},
        "paths": r.paths,
        "failures": r.failures,
        "skip_reasons": dict(r.skips),
        "seed": r.seed,
    }


def results_text(data: dict[str, Any]) -> str:
    subset = f" (only the cases matching -k {data['cases']!r})" if data.get("cases") else ""
    lines = [f"conformance kit on {data['backend']}{subset}:"]
    lines.append("  family      passed  failed  skipped")
    for f, c in data["families"].items():
        lines.append(
            f"  {f:<10} {c.get('passed', 0):>7} {c.get('failed', 0):>7} {c.get('skipped', 0):>8}"
        )
    lines.append("  implementation paths exercised:")
    for f, paths in sorted(data["paths"].items()):
        lines.append(f"    {f:<10} " + ", ".join(f"{k} x{n}" for k, n in sorted(paths.items())))
    for reason, n in data["skip_reasons"].items():
        lines.append(f"  skipped x{n}: {reason}")
    for fail in data["failures"]:
        lines.append(f"  FAILED {fail['test']}: {fail['error']}")
    if data["failures"] and data.get("seed") is not None:
        lines.append(
            f"  sampled cases drawn with --seed {data['seed']} (repeats this run's sample)"
        )
    if data["exit_code"] == pytest.ExitCode.NO_TESTS_COLLECTED:
        lines.append(f"  no kit case matches -k {data['cases']!r}")
    lines.append("result: " + ("PASS" if data["passed"] else f"FAIL (exit {data['exit_code']})"))
    return "\n".join(lines)
