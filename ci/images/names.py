"""The names shared by builders and lookups: schema version, tags, labels, annotations.

An image's identity lives in two places. Config labels (``content-hash``, ``schema``) are set
at build time (``docker buildx build --label``) and say which inputs the image claims to be built
from; they are self-declared. Manifest annotations (``builder``, ``attestation``) are added after
the push by ``attest`` and bind a builder identity to the exact manifest (see ``attest.py``).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping

SCHEMA_VERSION = 2  # bump when the key record changes meaning; it is part of every tag

LABEL_HASH = "org.plugin-api.ci.content-hash"
LABEL_SCHEMA = "org.plugin-api.ci.schema"
ANNOTATION_BUILDER = "org.plugin-api.ci.builder"
ANNOTATION_ATTESTATION = "org.plugin-api.ci.attestation"

STABLE_TAG = f"base-v{SCHEMA_VERSION}-stable"
_KEY = re.compile(r"^[0-9a-f]{64}$")


class Namespace(str, enum.Enum):
    """Where an image tag lives, in lookup order."""

    TRUSTED = "trusted"  # base-v2-<key>: written only by main builds
    PREVIEW = "preview"  # base-v2-preview-<key>: written by PR builds, untrusted
    STABLE = "stable"  # base-v2-stable: moved by main after its checks (compare-and-swap)

    def __str__(self) -> str:
        return self.value


def tag_for(namespace: Namespace, key: str, *, stable_tag: str = STABLE_TAG) -> str:
    if namespace is Namespace.STABLE:
        return stable_tag
    if not _KEY.match(key):
        raise ValueError(f"image key must be 64 lower-case hex digits, got {key!r}")
    middle = "-preview" if namespace is Namespace.PREVIEW else ""
    return f"base-v{SCHEMA_VERSION}{middle}-{key}"


def build_labels(key: str) -> dict[str, str]:
    """The labels a build of ``key`` must carry (pass each as ``--label NAME=VALUE``)."""
    return {LABEL_HASH: key, LABEL_SCHEMA: str(SCHEMA_VERSION)}


def label_problem(labels: Mapping[str, str], key: str) -> str | None:
    """Why ``labels`` do not identify a build of ``key`` (None when they do)."""
    have_hash, have_schema = labels.get(LABEL_HASH), labels.get(LABEL_SCHEMA)
    if have_schema != str(SCHEMA_VERSION):
        return f"label {LABEL_SCHEMA}={have_schema!r}, expected {SCHEMA_VERSION!r}"
    if have_hash != key:
        return f"label {LABEL_HASH}={have_hash!r}, expected {key!r}"
    return None
