"""Host-side bookkeeping for paged attention's KV blocks (pure Python, any device).

``KVBlockPool`` owns the block ids, ``KVCacheManager`` keeps each sequence's block table and
turns a step's work into a ``Step`` (its ``AttentionBatch`` with ``Step.attention_batch()``),
``PrefixCache`` keeps full blocks for reuse. The manager never touches tensors: it reports the
copy-on-write copies the engine runs (``tensors.copy_kv_blocks``). See docs/engine-guide.md.
"""

from .errors import KVCacheError, OutOfKVBlocks
from .manager import KVCacheManager, Released, Step
from .pool import KVBlockPool
from .prefix import PrefixCache

__all__ = [
    "KVBlockPool",
    "KVCacheError",
    "KVCacheManager",
    "OutOfKVBlocks",
    "PrefixCache",
    "Released",
    "Step",
]
