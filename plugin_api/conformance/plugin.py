"""The pytest plugin behind ``pytest --plugin-api-backend=<id>`` (entry point ``pytest11``).

With the option and no test paths, pytest runs the kit; with paths, the kit runs beside them.
The device comes from the backend (its probe's ``device_type``), never from probing a
particular vendor's runtime. At the end the summary shows, per op family, which kinds of
implementation the run exercised, so a run that only reached a fallback says so.

A backend the kit cannot check (not installed, failed to load, claimed by two distributions,
excluded, unavailable on this machine) stops the session before any test with exit code
``BACKEND_UNUSABLE`` (4) and one line naming the cause; ``plugin-api check`` exits the same way.
Only "unavailable on this machine" may instead skip the kit, with ``--plugin-api-skip-unavailable``.
"""

from __future__ import annotations

import difflib
import random
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from ..errors import PluginApiError

if TYPE_CHECKING:
    from ..backend import Backend

KIT_DIR = Path(__file__).parent
OPTION = "--plugin-api-backend"
SKIP_UNAVAILABLE = "--plugin-api-skip-unavailable"
SEED_OPTION = "--plugin-api-seed"
DRAWS_OPTION = "--plugin-api-gemm-draws"
KIT_PLUGIN = "plugin-api-kit"
# Exit codes, the same for ``pytest --plugin-api-backend=ID`` and ``plugin-api check``: 0 passed,
# 1 a case failed, BACKEND_UNUSABLE the backend cannot be checked here (pytest's usage error: the
# ID names no backend this machine can check); pytest's other codes (2 interrupted or a
# collection error, 3 internal error, 5 nothing collected) pass through ``plugin-api check``.
BACKEND_UNUSABLE = int(pytest.ExitCode.USAGE_ERROR)
REJECTED: Counter[str] = Counter()  # op family -> cases the backend rejected in this session
_SEED = pytest.StashKey[int]()
_WORKER_SEED = "plugin_api_kit_seed"  # the controller's seed, handed to pytest-xdist workers


class KitBackendUnusable(PluginApiError):
    """The conformance kit cannot check ``backend``; the message is one line naming the cause.

    ``unavailable_here``: the plugin loaded and its probe says it cannot run on this machine
    (the only cause ``--plugin-api-skip-unavailable`` turns into a skip)."""

    def __init__(self, backend_id: str, message: str, *, unavailable_here: bool = False) -> None:
        super().__init__(message, backend=backend_id)
        self.unavailable_here = unavailable_here


def kit_backend(backend_id: str) -> Backend:
    """The backend the kit checks; ``KitBackendUnusable`` with the cause when it cannot."""
    from ..backend import backend_for

    try:
        return backend_for(backend_id)
    except PluginApiError as e:
        raise _unusable(backend_id, e) from e


def _one_line(text: str) -> str:
    return "; ".join(part.strip(" -") for part in str(text).splitlines() if part.strip(" -"))


def _unusable(backend_id: str, error: PluginApiError) -> KitBackendUnusable:
    """Classify why ``backend_for(backend_id)`` raised ``error``, from the registry's records."""
    from ..registry import load_plugins
    from ..settings import read_settings

    def unusable(what: str, **kw: bool) -> KitBackendUnusable:
        return KitBackendUnusable(backend_id, f"backend {backend_id!r} {what}", **kw)

    try:
        records = load_plugins(read_settings()).records
    except PluginApiError:  # the settings themselves are wrong: the error says which
        return unusable(f"cannot be selected: {_one_line(str(error))}")
    mine = [r for r in records if r.id == backend_id]
    if not mine:
        ids = sorted({r.id for r in records})
        close = difflib.get_close_matches(backend_id, ids, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return unusable(f"is not installed (installed: {', '.join(ids)}){hint}")
    conflict = next((r.failure for r in mine if r.failure and r.failure.stage == "discover"), None)
    if conflict is not None:
        return unusable(f"is not loaded: {_one_line(conflict.message)}")
    rec = mine[0]
    if rec.excluded:
        return unusable("is excluded by PLUGIN_API_PLUGINS; add it to the list")
    if rec.failure is not None:
        return unusable(f"failed to load at {rec.failure.stage}: {_one_line(rec.failure.message)}")
    if rec.state == "unavailable":
        reasons = "; ".join(_one_line(r) for r in rec.reasons) or "no reason given"
        return unusable(
            f"is unavailable on this machine: {reasons} ({SKIP_UNAVAILABLE} skips the kit instead)",
            unavailable_here=True,
        )
    return unusable(f"cannot be selected: {_one_line(str(error))}")


def kit_seed(config: pytest.Config) -> int:
    """This run's seed for the sampled cases: ``--plugin-api-seed``, else the xdist controller's,
    else a fresh one (printed in the header, and with every sampled case that fails)."""
    if _SEED not in config.stash:
        given = config.getoption(SEED_OPTION, None)
        worker = getattr(config, "workerinput", {}).get(_WORKER_SEED)
        seed = given if given is not None else worker
        config.stash[_SEED] = int(seed) if seed is not None else random.randrange(1_000_000)
    return config.stash[_SEED]


@contextmanager
def reproducible(config: pytest.Config) -> Iterator[None]:
    """Around a sampled case: a failure carries the seed that reproduces the sample."""
    seed = kit_seed(config)
    try:
        yield
    except Exception as e:
        e.add_note(f"sampled case: rerun with {SEED_OPTION}={seed} to repeat this run's sample")
        raise


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
        help="run the plugin-api conformance kit against backend ID (e.g. reference); a "
        f"backend that cannot be checked here stops the run with exit {BACKEND_UNUSABLE}",
    )
    group.addoption(
        SKIP_UNAVAILABLE,
        action="store_true",
        help="skip the kit (exit 0) when the backend's probe says it cannot run on this "
        "machine; not installed, failed to load or claimed twice still fail",
    )
    group.addoption(
        SEED_OPTION,
        metavar="N",
        type=int,
        default=None,
        help="seed of the sampled GEMM cases (default: a fresh one, printed on failure)",
    )
    group.addoption(
        DRAWS_OPTION,
        metavar="N",
        type=int,
        default=1,
        help="sampled GEMM cases per M band value and op (default 1); more widens the sample",
    )


def pytest_configure(config: pytest.Config) -> None:
    backend_id = config.getoption(OPTION)
    if not backend_id:
        return
    if config.getoption(DRAWS_OPTION) < 1:
        raise pytest.UsageError(f"{DRAWS_OPTION} must be at least 1")
    kit = str(KIT_DIR)
    explicit = config.args_source == pytest.Config.ArgsSource.ARGS
    if not explicit:
        config.args[:] = [kit]
    elif not any(Path(a).resolve() == KIT_DIR for a in config.args):
        config.args.append(kit)
    config.pluginmanager.register(Kit(backend_id, config.getoption(SKIP_UNAVAILABLE)), KIT_PLUGIN)
    config.pluginmanager.register(Coverage(backend_id), "plugin-api-coverage")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """pytest-xdist: every worker samples with the controller's seed (same tests collected)."""
    node.workerinput[_WORKER_SEED] = kit_seed(node.config)


class Kit:
    """Resolves the backend once, before any test: one that cannot be checked stops the run."""

    def __init__(self, backend_id: str, skip_unavailable: bool) -> None:
        self.backend_id = backend_id
        self.skip_unavailable = skip_unavailable
        self.backend: Backend | None = None
        self.skip_reason: str | None = None

    @pytest.hookimpl(tryfirst=True)  # before pytest-xdist starts workers, before any output
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        try:
            self.backend = kit_backend(self.backend_id)
        except KitBackendUnusable as e:
            if not (e.unavailable_here and self.skip_unavailable):
                # pytest prints it as one line, "ERROR: ...", and exits with BACKEND_UNUSABLE
                raise pytest.UsageError(f"plugin-api conformance kit: {e}") from e
            hint = f" ({SKIP_UNAVAILABLE} skips the kit instead)"
            self.skip_reason = f"{str(e).removesuffix(hint)} (skipped: {SKIP_UNAVAILABLE})"

    def pytest_report_header(self, config: pytest.Config) -> str:
        seed = kit_seed(config)
        return f"plugin-api kit: {self.backend_id}, {SEED_OPTION}={seed} repeats its GEMM sample"


# The key under which each test's report carries its counts: a report reaches the process that
# prints the summary also when pytest-xdist ran the test in a worker (module state would not).
OPS_PROPERTY = "plugin-api-ops"
SAMPLED_PROPERTY = "plugin-api-sampled"  # (op family, seed) of a sampled case


def mark_sampled(request: pytest.FixtureRequest, family: str) -> None:
    """Record on the test's report that it is a sampled case of ``family`` (for the summary)."""
    request.node.user_properties.append((SAMPLED_PROPERTY, (family, kit_seed(request.config))))


class Coverage:
    """Collects the provenance of every op call per test, and summarises it."""

    def __init__(self, backend_id: str) -> None:
        self.backend_id = backend_id
        self.paths: dict[str, Counter[str]] = defaultdict(Counter)
        self.rejected: Counter[str] = Counter()
        self.sampled_failures: Counter[str] = Counter()  # op family -> sampled cases failed
        self.seed: int | None = None

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
            if name == SAMPLED_PROPERTY and report.failed and isinstance(value, list | tuple):
                family, seed = value
                self.sampled_failures[str(family)] += 1
                self.seed = int(seed)
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
        for family, n in sorted(self.sampled_failures.items()):
            tr.write_line(
                f"{family:<10} {n} sampled case(s) failed: {SEED_OPTION}={self.seed} "
                "repeats this run's sample"
            )


@pytest.fixture(scope="session")
def plugin_api_backend(request: pytest.FixtureRequest) -> Backend:
    """The backend under test, resolved at session start (``Kit``); with
    ``--plugin-api-skip-unavailable`` and a backend unavailable here, every test skips with the
    probe's reasons."""
    kit = request.config.pluginmanager.get_plugin(KIT_PLUGIN)
    if not isinstance(kit, Kit):
        pytest.skip(f"the conformance kit needs {OPTION}=<id>")
    if kit.skip_reason is not None:
        pytest.skip(kit.skip_reason)
    if kit.backend is None:  # sessionstart stops the run first; this is a broken invariant
        raise RuntimeError(f"the kit's backend {kit.backend_id!r} was not resolved at start")
    return kit.backend


@pytest.fixture(scope="session")
def kit_device(plugin_api_backend: Backend) -> Any:
    import torch

    return torch.device(plugin_api_backend.device_type)
