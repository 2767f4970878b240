"""Is a pinned digest still what its tag reads? One registry lookup per pinned image.

The answer is one of: ``current`` (the tag reads the pinned digest), ``stale`` (the tag moved:
the pin must be updated), ``missing`` (the tag no longer exists), ``registry-error`` (no usable
answer after the client's retries: unknown, never ``current``), ``placeholder`` (the guide marks
the digest as one; not looked up) or ``invalid`` (the pins cannot be checked as written).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

from ci.docblocks import Finding
from ci.images.registry import Registry, State

from .pinned import PinnedImage, locate


class Status(str, enum.Enum):
    CURRENT = "current"
    STALE = "stale"
    MISSING = "missing"
    ERROR = "registry-error"
    PLACEHOLDER = "placeholder"
    INVALID = "invalid"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, slots=True)
class Result:
    """The verdict on one pin; ``doc:line`` is the line to edit (the digest pin)."""

    status: Status
    doc: str
    line: int
    name: str  # the pins' prefix, e.g. IMAGE ("" for a line that is no pin)
    ref: str  # repo:tag as pinned ("" when unreadable)
    pinned: str | None  # the pinned digest
    tag_digest: str | None  # the digest the tag reads now (current, stale)
    registry: str | None  # the registry URL asked (None when none was)
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"status": self.status.value}


def invalid(finding: Finding) -> Result:
    return Result(
        Status.INVALID, finding.path, finding.line, "", "", None, None, None, finding.message
    )


def check(image: PinnedImage, registry: str | None, client: Callable[[str], Registry]) -> Result:
    """Look ``image``'s tag up in ``registry`` (or the one its repo names) via ``client(url)``."""

    def result(status: Status, url: str | None, now: str | None, detail: str) -> Result:
        return Result(
            status, image.doc, image.line, image.name, image.ref, image.digest, now, url, detail
        )

    if image.placeholder:
        return result(
            Status.PLACEHOLDER,
            None,
            None,
            f"{image.name}_DIGEST_IS_PLACEHOLDER=1: not looked up; pin a published image",
        )
    try:
        url, path = locate(image.repo, registry)
        found = client(url).lookup_tag(path, image.tag)
    except ValueError as e:  # a repository, tag or URL the client refuses
        return result(Status.INVALID, None, None, str(e))
    if found.state is State.ERROR:
        return result(Status.ERROR, url, None, found.detail)
    if found.state is State.MISSING:
        return result(Status.MISSING, url, None, f"tag {image.tag} is gone: {found.detail}")
    if found.digest == image.digest:
        return result(Status.CURRENT, url, found.digest, "the tag reads the pinned digest")
    fix = f"update {image.name}_DIGEST at {image.doc}:{image.line} to {found.digest}"
    return result(
        Status.STALE, url, found.digest, f"tag {image.tag} moved from {image.digest}; {fix}"
    )


def check_all(
    images: Iterable[PinnedImage], registry: str | None, client: Callable[[str], Registry]
) -> list[Result]:
    """``check`` each image, with one client per registry URL."""
    clients: dict[str, Registry] = {}

    def cached(url: str) -> Registry:
        if url not in clients:
            clients[url] = client(url)
        return clients[url]

    return [check(image, registry, cached) for image in images]
