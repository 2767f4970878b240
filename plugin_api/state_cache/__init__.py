"""Host-side bookkeeping for Mamba-style recurrent state blocks (pure Python, any device).

``BlockPool`` owns the block ids, ``StateCacheManager`` keeps each request's block table,
``PrefixCache`` keeps boundary states for reuse. The manager never touches tensors: it reports
which blocks the caller must zero (``zero_fresh_blocks``) or copy. See docs/state-cache.md.
"""

from .errors import OutOfStateBlocks, StateCacheError
from .manager import Commit, Released, StateCacheManager, StepBlocks
from .modes import CacheMode, ModeTraits
from .pool import NULL_BLOCK, BlockPool
from .prefix import PrefixCache, PrefixHit

__all__ = [
    "NULL_BLOCK",
    "BlockPool",
    "CacheMode",
    "Commit",
    "ModeTraits",
    "OutOfStateBlocks",
    "PrefixCache",
    "PrefixHit",
    "Released",
    "StateCacheError",
    "StateCacheManager",
    "StepBlocks",
]
