"""The order in which the suite's modules go to pytest-xdist workers (``make test`` runs ``-n
$(TEST_WORKERS)``, 2 by default, ``--dist loadscope --no-loadscope-reorder``: a module is one
unit of work, so its module-scoped fixtures are built once, and units go out in collection
order). Without xdist nothing here changes a run.

Longest first: the vLLM modules that use the session's generate runs (the ``runs`` fixture,
most of the vLLM tests' time: ``test_generation`` alone is about half of it), then the other vLLM
modules (each starts engines or servers of its own), then the rest in collection order. A
``runs`` module that lands on the other worker repeats there the runs it asks for (``runs`` is
per process); those are one-model runs, so it costs less than leaving the whole-suite time to
chance. (``--dist loadgroup`` would keep them together, but pytest 9 ignores the node-id suffix
that pytest-xdist 3.8 uses for its groups.)
"""

from __future__ import annotations

import pytest

VLLM_TESTS = "integrations/vllm/"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not hasattr(config, "workerinput"):  # only xdist workers collect, and only they have it
        return
    uses_runs = {_module(i) for i in items if "runs" in getattr(i, "fixturenames", ())}

    def rank(item: pytest.Item) -> int:
        module = _module(item)
        return 0 if module in uses_runs else 1 if module.startswith(VLLM_TESTS) else 2

    # stable, collection order within a rank: every worker collects the same order, as xdist needs
    items.sort(key=rank)


def _module(item: pytest.Item) -> str:
    return item.nodeid.split("::")[0]  # the test file, relative to the rootdir
