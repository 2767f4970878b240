"""Builder attestations: who pushed an image, bound to the exact manifest by an HMAC.

Labels are self-declared: any build can write any label. An attestation is a pair of manifest
annotations, ``builder`` and ``attestation = hmac-sha256:<hex>``, where the MAC is keyed with a
secret only that builder holds and covers the builder id, the content hash and the *subject*:
the sha256 of the manifest's canonical JSON without these two annotations. The subject pins the
config (and so the labels) and every layer, so an attestation copied onto other content, or a
builder id claimed without the key, does not verify.

Keys are shared secrets (the standard library has no public-key signatures): the verifier (main
builds) and each trusted builder hold that builder's key, untrusted builds hold none.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .names import ANNOTATION_ATTESTATION, ANNOTATION_BUILDER

PREFIX = "hmac-sha256:"
_BUILDER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@-]{0,127}$")
KEYS_ENV = "CI_IMAGES_ATTESTATION_KEYS"


@dataclass(frozen=True, slots=True)
class Keyring:
    """builder id -> secret key bytes."""

    keys: Mapping[str, bytes]

    @classmethod
    def parse(cls, text: str | None) -> Keyring:
        """``id=hexkey[,id=hexkey...]`` (the format of ``CI_IMAGES_ATTESTATION_KEYS``)."""
        keys: dict[str, bytes] = {}
        for item in (text or "").split(","):
            if not item.strip():
                continue
            builder, eq, hexkey = item.strip().partition("=")
            if not eq or not _BUILDER.match(builder):
                raise ValueError(f"{KEYS_ENV}: expected id=hexkey, got {item.strip()[:40]!r}")
            try:
                secret = bytes.fromhex(hexkey)
            except ValueError:
                raise ValueError(f"{KEYS_ENV}: key of {builder!r} is not hex") from None
            if len(secret) < 16:
                raise ValueError(f"{KEYS_ENV}: key of {builder!r} is shorter than 16 bytes")
            keys[builder] = secret
        return cls(keys)


def subject(manifest: Mapping[str, Any]) -> str:
    """sha256 of the manifest's canonical JSON without the attestation annotations."""
    doc = dict(manifest)
    notes = {
        k: v
        for k, v in (doc.pop("annotations", None) or {}).items()
        if k not in (ANNOTATION_BUILDER, ANNOTATION_ATTESTATION)
    }
    if notes:
        doc["annotations"] = notes
    canonical = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


def mac(manifest: Mapping[str, Any], builder: str, content_hash: str, secret: bytes) -> str:
    message = f"plugin-api-ci-attestation/1\n{builder}\n{content_hash}\n{subject(manifest)}"
    return PREFIX + hmac.new(secret, message.encode(), hashlib.sha256).hexdigest()


def attach(manifest: Mapping[str, Any], builder: str, content_hash: str, secret: bytes) -> bytes:
    """The manifest bytes with ``builder`` and its attestation added (config and layers kept)."""
    if not _BUILDER.match(builder):
        raise ValueError(f"builder id {builder!r}: use letters, digits and ._:/@-")
    doc = dict(manifest)
    notes = dict(doc.get("annotations") or {})
    notes[ANNOTATION_BUILDER] = builder
    notes[ANNOTATION_ATTESTATION] = mac(manifest, builder, content_hash, secret)
    doc["annotations"] = notes
    return json.dumps(doc, separators=(",", ":")).encode()


def verifies(manifest: Mapping[str, Any], content_hash: str, secret: bytes) -> bool:
    """Does the manifest carry a valid attestation of ``content_hash`` under ``secret``?"""
    notes = manifest.get("annotations") or {}
    builder, claimed = notes.get(ANNOTATION_BUILDER), notes.get(ANNOTATION_ATTESTATION)
    if not isinstance(builder, str) or not isinstance(claimed, str):
        return False
    return hmac.compare_digest(claimed, mac(manifest, builder, content_hash, secret))
