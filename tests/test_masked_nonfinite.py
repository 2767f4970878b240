"""A NaN or Inf that a query cannot see never reaches its output (issue 30, item 8), on every
installed CPU backend: the sum runs over visible keys only."""

from __future__ import annotations

import pytest

import plugin_api as pa
from plugin_api.errors import SelectionError

from .masked_values import poisoned_case, run_and_check, specs

BACKENDS = ["reference", "cpu-arm-acl"]


def _backend(backend_id: str) -> pa.Backend:
    try:
        return pa.backend_for(backend_id)
    except SelectionError as e:
        pytest.skip(f"{backend_id} cannot run here: {e}")


@pytest.mark.parametrize("backend_id", BACKENDS)
@pytest.mark.parametrize("name", list(specs()))
def test_masked_non_finite_values_do_not_reach_visible_rows(backend_id: str, name: str) -> None:
    spec = specs()[name]
    attn = pa.attention(spec, _backend(backend_id))
    if attn.provenance.fallback:
        pytest.skip(f"{backend_id} does not serve {spec.describe()} (the reference would)")
    run_and_check(attn, poisoned_case(spec, "cpu"))


def test_oracle_sums_visible_keys_only() -> None:
    """The kit's dense oracle, on its own: poisoned rows aside, every row is finite."""
    for spec in specs().values():
        p = poisoned_case(spec, "cpu")
        expected = p.case.expected()
        assert expected[~p.sees_poison].isfinite().all(), spec.describe()
