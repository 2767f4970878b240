"""Pin freshness: do the digests pinned in the docs still match the tags they follow?

``pinned``: the images the docs' pins blocks pin; ``freshness``: one registry lookup per pin
and its verdict; ``cli``: ``python -m ci.pins check`` and its exit codes. See docs/ci-images.md.
"""

from .freshness import Result, Status, check, check_all
from .pinned import PinnedImage, locate, read

__all__ = ["PinnedImage", "Result", "Status", "check", "check_all", "locate", "read"]
