"""Promotion: preview -> trusted under a policy, and moving the stable alias by compare-and-swap.

Preview images come from PR builds, so a label match alone never makes one trusted. The policy
is ``never`` (the default: main builds its own image) or ``attested``: the preview's manifest
must carry a builder id from the allow-list and an attestation that verifies under that builder's
key (``attest.py``). Promotion re-puts the identical manifest bytes under the trusted tag, so the
digest cannot change, then re-reads the tag and its labels. An existing trusted tag is never
moved.

The stable alias is moved in a separate step. The OCI distribution API has no conditional tag
write, so the swap is made safe with timing (Fischer's mutual exclusion over a register): read
the alias and compare it with the digest the caller expects, write within ``window_s`` of that
read (the write's timeout is what is left of the window; no retries), wait ``window_s``, then
read it again. Any promoter whose read saw the expected digest writes before the others verify,
so of several concurrent promoters only the last writer sees its own digest: it wins, the others
fail with ``StableConflict``. A promoter that cannot keep inside the window writes nothing.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import attest
from .errors import IdentityMismatch, PromotionRefused, RegistryError, StableConflict
from .names import (
    ANNOTATION_BUILDER,
    STABLE_TAG,
    Namespace,
    label_problem,
    tag_for,
)
from .registry import ImageFacts, Registry, State

MIN_WRITE_S = 0.05  # below this much of the window left, do not start the write


class Mode(str, enum.Enum):
    NEVER = "never"
    ATTESTED = "attested"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, slots=True)
class Verdict:
    ok: bool
    reason: str


@dataclass(frozen=True, slots=True)
class Policy:
    """Which preview images a main build may promote to trusted."""

    mode: Mode = Mode.NEVER
    allowed_builders: frozenset[str] = frozenset()
    keyring: attest.Keyring = field(default_factory=lambda: attest.Keyring({}))

    def __post_init__(self) -> None:
        if self.mode is Mode.ATTESTED and not self.allowed_builders:
            raise ValueError("policy 'attested' needs at least one allowed builder")

    def judge(self, facts: ImageFacts, key: str) -> Verdict:
        if self.mode is Mode.NEVER:
            return Verdict(False, "promotion policy is 'never': preview images are not promoted")
        builder = facts.annotations.get(ANNOTATION_BUILDER)
        if not builder:
            return Verdict(False, "no builder attestation on the manifest")
        if builder not in self.allowed_builders:
            allowed = ", ".join(sorted(self.allowed_builders))
            return Verdict(False, f"builder {builder!r} is not in the allow-list ({allowed})")
        secret = self.keyring.keys.get(builder)
        if secret is None:
            return Verdict(False, f"no key for builder {builder!r} ({attest.KEYS_ENV})")
        if not attest.verifies(facts.manifest.document(), key, secret):
            return Verdict(False, f"attestation of {builder!r} does not verify for this manifest")
        return Verdict(True, f"attested by {builder!r}")


@dataclass(frozen=True, slots=True)
class Write:
    """One tag this tool wrote, and how it was checked."""

    tag: str
    digest: str
    previous: str | None
    source: str  # where the digest came from: a namespace, or "attest"

    def to_dict(self) -> dict[str, Any]:
        return {
            "tag": self.tag,
            "digest": self.digest,
            "previous": self.previous,
            "source": self.source,
        }


def check_identity(facts: ImageFacts, key: str, where: str) -> None:
    problem = label_problem(facts.labels, key)
    if problem:
        raise IdentityMismatch(
            f"{where} -> {facts.digest}: {problem}. A content tag must describe exactly its "
            "content; fix or delete the tag (nothing was built or promoted)"
        )


def found_digest(client: Registry, repo: str, tag: str) -> str | None:
    """The digest ``tag`` points at, None if it does not exist; registry trouble raises."""
    res = client.lookup_tag(repo, tag)
    if res.state is State.ERROR:
        raise RegistryError(f"{repo}:{tag}: {res.detail}")
    return res.digest


def retag_trusted(
    client: Registry, repo: str, key: str, digest: str, source: Namespace, platform: str
) -> Write:
    """Give ``digest`` (already checked by the caller) the trusted tag of ``key``; verify."""
    tag = tag_for(Namespace.TRUSTED, key)
    current = found_digest(client, repo, tag)
    if current is not None and current != digest:
        raise PromotionRefused(
            f"{repo}:{tag} already points at {current}; trusted tags are never moved"
        )
    client.add_tag(repo, digest, tag)
    check_identity(client.image_facts(repo, digest, platform=platform), key, f"{repo}:{tag}")
    return Write(tag, digest, current, str(source))


def promote_preview(
    client: Registry, repo: str, key: str, policy: Policy, *, platform: str = "linux/amd64"
) -> Write:
    """Explicit preview -> trusted promotion; refused unless the policy accepts the image."""
    tag, facts = _preview(client, repo, key, platform, "nothing to promote")
    verdict = policy.judge(facts, key)
    if not verdict.ok:
        raise PromotionRefused(f"{repo}:{tag} -> {facts.digest} not promoted: {verdict.reason}")
    return retag_trusted(client, repo, key, facts.digest, Namespace.PREVIEW, platform)


def attest_preview(
    client: Registry, repo: str, key: str, builder: str, keyring: attest.Keyring, platform: str
) -> Write:
    """Record ``builder``'s attestation on the preview image of ``key`` (manifest re-put)."""
    secret = keyring.keys.get(builder)
    if secret is None:
        raise PromotionRefused(f"no key for builder {builder!r} in {attest.KEYS_ENV}")
    tag, facts = _preview(client, repo, key, platform, "push the preview image first")
    raw = attest.attach(facts.manifest.document(), builder, key, secret)
    new = client.put_manifest(repo, tag, raw, facts.manifest.media_type)
    if found_digest(client, repo, tag) != new:
        raise RegistryError(f"after attesting, {repo}:{tag} does not point at {new}")
    return Write(tag, new, facts.digest, "attest")


def _preview(
    client: Registry, repo: str, key: str, platform: str, if_missing: str
) -> tuple[str, ImageFacts]:
    """The preview tag of ``key`` and its image, whose labels must match ``key``."""
    tag = tag_for(Namespace.PREVIEW, key)
    digest = found_digest(client, repo, tag)
    if digest is None:
        raise PromotionRefused(f"{repo}:{tag} does not exist: {if_missing}")
    facts = client.image_facts(repo, digest, platform=platform)
    check_identity(facts, key, f"{repo}:{tag}")
    return tag, facts


def move_stable(
    client: Registry,
    repo: str,
    key: str,
    expected: str | None,
    *,
    window_s: float = 10.0,
    stable_tag: str = STABLE_TAG,
    platform: str = "linux/amd64",
    sleep: Callable[[float], None] = time.sleep,
) -> Write:
    """Point the stable alias at the trusted image of ``key`` if it still reads ``expected``.

    ``expected`` is the digest the caller saw (None: the alias must not exist yet).
    """
    trusted = tag_for(Namespace.TRUSTED, key)
    target = found_digest(client, repo, trusted)
    if target is None:
        raise PromotionRefused(f"{repo}:{trusted} does not exist; stable only takes trusted images")
    check_identity(client.image_facts(repo, target, platform=platform), key, f"{repo}:{trusted}")
    manifest = client.manifest(repo, target)

    start = time.monotonic()
    current = found_digest(client, repo, stable_tag)
    if current != expected:
        raise StableConflict(
            f"{repo}:{stable_tag} reads {current or 'absent'}, expected {expected or 'absent'}: "
            "another promotion moved it; nothing was written"
        )
    if current == target:
        return Write(stable_tag, target, current, str(Namespace.TRUSTED))
    left = window_s - (time.monotonic() - start)
    if left < MIN_WRITE_S:
        raise StableConflict(
            f"reading {repo}:{stable_tag} took longer than the {window_s:g} s window; "
            "nothing was written, try again"
        )
    try:
        client.put_manifest(
            repo, stable_tag, manifest.raw, manifest.media_type, retries=0, timeout=left
        )
    except RegistryError as e:
        raise RegistryError(
            f"writing {repo}:{stable_tag} failed ({e}); the alias may or may not have moved: "
            "read it and run the promotion again with --expect set to what it reads"
        ) from e
    took = time.monotonic() - start
    if took > window_s:
        raise StableConflict(
            f"the write of {repo}:{stable_tag} finished {took:.2f} s after the check, past the "
            f"{window_s:g} s window: exclusivity is not guaranteed; check who holds the alias"
        )
    sleep(window_s)
    after = found_digest(client, repo, stable_tag)
    if after != target:
        raise StableConflict(
            f"{repo}:{stable_tag} now reads {after or 'absent'}: a concurrent promotion wrote "
            f"after us and won; ours ({target}) is not the stable image"
        )
    return Write(stable_tag, target, current, str(Namespace.TRUSTED))
