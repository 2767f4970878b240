from __future__ import annotations

import pytest

from plugin_api.backend import Backend


@pytest.fixture(scope="session")
def onednn_backend() -> Backend:
    """cpu-arm-acl as a live backend; skipped with the probe's reasons where it cannot run."""
    from plugin_api.backend import backend_for
    from plugin_api.errors import SelectionError

    try:
        return backend_for("cpu-arm-acl")
    except SelectionError as e:
        pytest.skip(f"cpu-arm-acl cannot run here: {e}")
