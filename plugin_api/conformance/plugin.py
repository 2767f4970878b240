"""The pytest plugin behind ``pytest --plugin-api-backend=<id>`` (entry point ``pytest11``).

With the option and no test paths, pytest runs the kit; with paths, the kit runs beside them.
The device comes from the backend (its probe's ``device_type``), never from probing a
particular vendor's runtime. At the end the summary shows, per op family, which kinds of
implementation the run exercised, so a run that only reached a fallback says so.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from ..backend import Backend

KIT_DIR = Path(__file__).parent
OPTION = "--plugin-api-backend"
REJECTED: Counter[str] = Counter()  # op family -> cases the backend rejected in this session


def own_or_skip(backend: Backend, family: Any, spec: Any) -> Any:
    """The backend's own implementation for ``spec``; skip (counted) when it rejects the spec.

    A rejection is fine: the kit then checks that the backend does not run the spec silently.
    """
    r = backend.explain(family, spec)
    if r.provenance is None or r.provenance.fallback:
        REJECTED[str(family)] += 1
        own = [c.reason for c in r.trace if c.backend == backend.id]
        pytest.skip(f"rejected by {backend.id}: {'; '.join(own) or 'no implementation'}")
    return r


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("plugin-api", "plugin-api conformance kit")
    group.addoption(
        OPTION,
        metavar="ID",
        default=None,
        help="run the plugin-api conformance kit against backend ID (e.g. reference)",
    )


def pytest_configure(config: pytest.Config) -> None:
    backend_id = config.getoption(OPTION)
    if not backend_id:
        return
    kit = str(KIT_DIR)
    explicit = config.args_source == pytest.Config.ArgsSource.ARGS
    if not explicit:
        config.args[:] = [kit]
    elif not any(Path(a).resolve() == KIT_DIR for a in config.args):
        config.args.append(kit)
    config.pluginmanager.register(Coverage(backend_id), "plugin-api-coverage")


# The key under which each test's report carries its counts: a report reaches the process that
# prints the summary also when pytest-xdist ran the test in a worker (module state would not).
OPS_PROPERTY = "plugin-api-ops"


class Coverage:
    """Collects the provenance of every op call per test, and summarises it."""

    def __init__(self, backend_id: str) -> None:
        self.backend_id = backend_id
        self.paths: dict[str, Counter[str]] = defaultdict(Counter)
        self.rejected: Counter[str] = Counter()

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Iterator[None]:
        from ..contract.provenance import record_ops

        rejected_before = REJECTED.copy()
        with record_ops() as calls:
            try:
                return (yield)
            finally:
                ran = Counter(
                    (p.family, f"{'fallback' if p.fallback else p.path}:{p.impl}") for p in calls
                )
                item.user_properties.append(
                    (
                        OPS_PROPERTY,
                        {
                            "ran": [[str(f), k, n] for (f, k), n in ran.items()],
                            "rejected": dict(REJECTED - rejected_before),
                        },
                    )
                )

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "call":  # the teardown report carries the same properties again
            return
        for name, value in report.user_properties:
            if name != OPS_PROPERTY or not isinstance(value, dict):
                continue
            for family, kind, n in value["ran"]:
                self.paths[family][kind] += n
            self.rejected.update(value["rejected"])

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        tr = terminalreporter
        tr.section(f"plugin-api conformance: {self.backend_id}")
        if not self.paths:
            tr.write_line("no op ran: every test was skipped (see the skip reasons above)")
        for family in sorted(self.paths):
            counts = self.paths[family]
            parts = ", ".join(f"{k} x{n}" for k, n in sorted(counts.items()))
            only_fallback = all(k.startswith("fallback:") for k in counts)
            warn = "  <- only fallbacks ran" if only_fallback else ""
            tr.write_line(f"{family:<10} {parts}{warn}")
        for family, n in sorted(self.rejected.items()):
            tr.write_line(
                f"{family:<10} {n} case(s) rejected by the backend (skipped with reasons)"
            )


@pytest.fixture(scope="session")
def plugin_api_backend(request: pytest.FixtureRequest) -> Backend:
    """The backend under test; the whole kit skips with the probe's reasons if it cannot run."""
    from ..backend import backend_for
    from ..errors import SelectionError

    backend_id = request.config.getoption(OPTION)
    if not backend_id:
        pytest.skip(f"the conformance kit needs {OPTION}=<id>")
    try:
        return backend_for(backend_id)
    except SelectionError as e:
        pytest.skip(f"backend {backend_id!r} cannot run here: {e}")


@pytest.fixture(scope="session")
def kit_device(plugin_api_backend: Backend) -> Any:
    import torch

    return torch.device(plugin_api_backend.device_type)
