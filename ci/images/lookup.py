"""Lookup: is there an image for this key, which one, and what must a build do otherwise.

Order for every build kind: trusted (``base-v2-<key>``), preview (``base-v2-preview-<key>``),
stable alias. A candidate is read by its immutable digest and used as ``repo@digest`` only when
its labels (content hash, schema) match the key. Then, per kind:

- PR builds use any match and never write; a miss means: build, push to the preview tag.
- Main builds use a trusted match; promote a preview match only if the policy accepts it (else
  it is skipped with the reason); backfill a stable match into the trusted tag; a miss means:
  build, push to the trusted tag.

A content tag (trusted or preview) whose labels describe other content is a hard failure. A
stable alias with other labels is stale and skipped. A registry error stops the lookup: it is
never read as a miss, so it never leads to a rebuild or a promotion.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from .errors import ImagesError, RegistryError
from .names import STABLE_TAG, Namespace, build_labels, label_problem, tag_for
from .promote import Policy, Write, check_identity, retag_trusted
from .registry import Registry, State


class Kind(str, enum.Enum):
    MAIN = "main"
    PR = "pr"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, slots=True)
class Step:
    namespace: Namespace
    tag: str
    result: str  # missing | hit | stale | refused
    digest: str | None = None
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "namespace": str(self.namespace),
            "tag": self.tag,
            "result": self.result,
            "digest": self.digest,
            "reason": self.reason,
        }


@dataclass(frozen=True, slots=True)
class Outcome:
    key: str
    kind: Kind
    repo: str  # host/repository
    ref: str | None  # host/repo@sha256:... on a hit
    source: Namespace | None  # where the hit came from
    push_tag: str | None  # on a miss: where the build must push
    stable: str | None  # digest the stable alias read (main builds), for `promote stable --expect`
    writes: tuple[Write, ...] = ()
    trace: tuple[Step, ...] = ()

    @property
    def hit(self) -> bool:
        return self.ref is not None

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "kind": str(self.kind),
            "repo": self.repo,
            "outcome": "hit" if self.hit else "miss",
            "ref": self.ref,
            "source": str(self.source) if self.source else None,
            "push_tag": self.push_tag,
            "labels": build_labels(self.key) if not self.hit else None,
            "stable": self.stable,
            "writes": [w.to_dict() for w in self.writes],
            "trace": [s.to_dict() for s in self.trace],
        }


@dataclass
class _Lookup:
    client: Registry
    repo: str
    key: str
    kind: Kind
    policy: Policy
    platform: str
    stable_tag: str
    trace: list[Step] = field(default_factory=list)

    def run(self) -> Outcome:
        stable = None
        if self.kind is Kind.MAIN:
            stable = self._digest(self.stable_tag)
        for namespace in Namespace:
            hit = self._candidate(namespace)
            if hit is not None:
                digest, writes = hit
                return self._outcome(self.client.ref(self.repo, digest), namespace, stable, writes)
        push = Namespace.TRUSTED if self.kind is Kind.MAIN else Namespace.PREVIEW
        return self._outcome(None, None, stable, (), push_tag=tag_for(push, self.key))

    def _candidate(self, namespace: Namespace) -> tuple[str, tuple[Write, ...]] | None:
        tag = tag_for(namespace, self.key, stable_tag=self.stable_tag)
        digest = self._digest(tag)
        if digest is None:
            self.trace.append(Step(namespace, tag, "missing"))
            return None
        facts = self.client.image_facts(self.repo, digest, platform=self.platform)
        if namespace is Namespace.STABLE:
            problem = label_problem(facts.labels, self.key)
            if problem:
                self.trace.append(Step(namespace, tag, "stale", digest, problem))
                return None
        check_identity(facts, self.key, f"{self.repo}:{tag}")
        writes: tuple[Write, ...] = ()
        reason = "labels match"
        if self.kind is Kind.MAIN and namespace is Namespace.PREVIEW:
            verdict = self.policy.judge(facts, self.key)
            if not verdict.ok:
                self.trace.append(Step(namespace, tag, "refused", digest, verdict.reason))
                return None
            reason = verdict.reason
        if self.kind is Kind.MAIN and namespace is not Namespace.TRUSTED:
            writes = (
                retag_trusted(self.client, self.repo, self.key, digest, namespace, self.platform),
            )
        self.trace.append(Step(namespace, tag, "hit", digest, reason))
        return digest, writes

    def _digest(self, tag: str) -> str | None:
        res = self.client.lookup_tag(self.repo, tag)
        if res.state is State.ERROR:
            raise RegistryError(
                f"looking up {self.repo}:{tag}: {res.detail}. Not building, not promoting: "
                "a registry error is not a miss"
            )
        return res.digest

    def _outcome(
        self,
        ref: str | None,
        source: Namespace | None,
        stable: str | None,
        writes: tuple[Write, ...],
        *,
        push_tag: str | None = None,
    ) -> Outcome:
        return Outcome(
            key=self.key,
            kind=self.kind,
            repo=f"{self.client.host}/{self.repo}",
            ref=ref,
            source=source,
            push_tag=push_tag,
            stable=stable,
            writes=writes,
            trace=tuple(self.trace),
        )


def find_image(
    client: Registry,
    repo: str,
    key: str,
    kind: Kind,
    policy: Policy | None = None,
    *,
    platform: str = "linux/amd64",
    stable_tag: str = STABLE_TAG,
) -> Outcome:
    """Find the image for ``key``; raises ``RegistryError`` / ``IdentityMismatch`` (with
    ``.trace`` set to the steps taken so far) instead of ever answering "miss" on doubt."""
    job = _Lookup(client, repo, key, kind, policy or Policy(), platform, stable_tag)
    try:
        return job.run()
    except ImagesError as e:
        e.trace = tuple(job.trace)
        raise
