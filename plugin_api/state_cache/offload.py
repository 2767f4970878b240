"""What an offload connector may copy out of a request's table, by position.

A connector records "slots ``< n`` of this request are offloaded" and issues the copies
asynchronously, later. That is only sound when a complete slot's block keeps its state until
the request is freed: a positionally stable mode. In ``align`` retired slots are nulled (their
blocks reused) and accepted drafts swap blocks around; in ``none`` the one slot is rewritten
every step. Those modes are refused, by their declared property.
"""

from __future__ import annotations

from collections.abc import Hashable

from .errors import StateCacheError
from .manager import StateCacheManager
from .pool import check_count


def completed_states(
    manager: StateCacheManager, req_id: Hashable, first_slot: int = 0
) -> tuple[tuple[int, int], ...]:
    """``(num_tokens, block)`` for every complete slot from ``first_slot`` on: the state after
    ``num_tokens = (slot + 1) * block_size`` tokens, committed and never changed again."""
    check_count("first_slot", first_slot)
    if not manager.mode.positionally_stable:
        raise StateCacheError(
            f"completed_states: mode {manager.mode.value!r} is not positionally stable "
            "(retired slots are nulled, blocks are relocated); offload by position needs 'all'"
        )
    bs = manager.block_size
    complete = manager.computed(req_id) // bs  # slots whose end the committed state reached
    blocks = manager.table(req_id, first_slot, max(first_slot, complete))
    return tuple(((first_slot + i + 1) * bs, b) for i, b in enumerate(blocks))
