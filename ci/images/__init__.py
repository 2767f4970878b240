"""Content-addressed reuse of the plugin base images (CI only; not part of the installed host).

``key``: the image key of a Dockerfile build; ``lint``: unpinned inputs; ``registry``: a small OCI
distribution client; ``lookup``: trusted -> preview -> stable, per build kind; ``promote``:
preview -> trusted under a policy, and the stable alias by compare-and-swap. See
docs/ci-images.md.
"""

from .errors import (
    DockerfileError,
    IdentityMismatch,
    ImagesError,
    InputError,
    PromotionRefused,
    RegistryError,
    StableConflict,
)
from .key import ImageKey, compute
from .lookup import Kind, Outcome, find_image
from .names import Namespace, tag_for
from .promote import Mode, Policy, move_stable, promote_preview
from .registry import Registry, State, TagLookup

__all__ = [
    "DockerfileError",
    "IdentityMismatch",
    "ImageKey",
    "ImagesError",
    "InputError",
    "Kind",
    "Mode",
    "Namespace",
    "Outcome",
    "Policy",
    "PromotionRefused",
    "Registry",
    "RegistryError",
    "StableConflict",
    "State",
    "TagLookup",
    "compute",
    "find_image",
    "move_stable",
    "promote_preview",
    "tag_for",
]
