"""The images that the docs' pins blocks pin, read with the docs checks' parser.

Every ``<P>_DIGEST`` pin in a pins block is an image digest, and needs two sibling pins in the
same block: ``<P>_REPO`` (``[host[:port]/]path``) and ``<P>_TAG`` (the tag whose digest the pin
follows). ``<P>_DIGEST_IS_PLACEHOLDER`` (``0`` or ``1``) marks a digest that names no published
image yet. A digest that cannot be checked (a sibling missing, a malformed value) is a
``Finding``, never skipped. So is any other pin whose value is not of its kind
(``ci.docblocks.pin_problem``: a ``*_VERSION`` that is no release version, a ``*_REVISION``
that is no 40-hex commit): those are not looked up anywhere, but a guide's pins are checked
as a whole.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ci.docblocks import DIGEST, Finding, blocks, parse_pins, pin_problem, pins_blocks

SUFFIX = "_DIGEST"
PLACEHOLDER_SUFFIX = "_DIGEST_IS_PLACEHOLDER"


@dataclass(frozen=True, slots=True)
class PinnedImage:
    """One pinned image. ``line`` is the 1-based line of ``<name>_DIGEST`` in ``doc``."""

    doc: str  # the Markdown file, as reported (relative to the working directory if under it)
    line: int
    name: str  # the pins' common prefix, e.g. IMAGE for IMAGE_REPO / IMAGE_DIGEST / IMAGE_TAG
    repo: str  # as pinned: [host[:port]/]path
    tag: str
    digest: str  # sha256:<64 hex>
    placeholder: bool

    @property
    def ref(self) -> str:
        return f"{self.repo}:{self.tag}"


def markdown_files(paths: Sequence[Path]) -> list[Path]:
    """Files as given; directories expanded to the Markdown files below them, sorted."""
    out: list[Path] = []
    for p in paths:
        out += sorted(p.rglob("*.md")) if p.is_dir() else [p]
    return out


def read(files: Iterable[Path]) -> tuple[list[PinnedImage], list[Finding]]:
    """Every pinned image of every pins block in ``files``, and why any digest pin cannot be
    checked."""
    images: list[PinnedImage] = []
    findings: list[Finding] = []
    for path in files:
        doc = shown(path)
        for block in pins_blocks(blocks(path)):
            pins, bad = parse_pins(doc, block)
            findings += bad
            for name, (line, value) in pins.items():
                problem = None if name.endswith(SUFFIX) else pin_problem(name, value)
                if problem:  # a digest's own problems are _image's, with its siblings'
                    findings.append(Finding(doc, line, "pins", problem))
            for name in sorted(n[: -len(SUFFIX)] for n in pins if n.endswith(SUFFIX)):
                image = _image(doc, name, pins)
                if isinstance(image, Finding):
                    findings.append(image)
                else:
                    images.append(image)
    return images, findings


def _image(doc: str, name: str, pins: dict[str, tuple[int, str]]) -> PinnedImage | Finding:
    line, digest = pins[name + SUFFIX]
    lacking = [name + s for s in ("_REPO", "_TAG") if not pins.get(name + s, (0, ""))[1]]
    if lacking:
        why = f"{name}{SUFFIX} has no {' or '.join(lacking)} in its pins block: cannot check it"
        return Finding(doc, line, "pins", why)
    if not DIGEST.match(digest):
        return Finding(doc, line, "pins", f"{name}{SUFFIX}={digest!r} is not sha256:<64 hex>")
    marker_line, marker = pins.get(name + PLACEHOLDER_SUFFIX, (line, "0"))
    if marker not in ("0", "1"):
        why = f"{name}{PLACEHOLDER_SUFFIX}={marker!r}: expected 0 or 1"
        return Finding(doc, marker_line, "pins", why)
    repo, tag = pins[name + "_REPO"][1], pins[name + "_TAG"][1]
    return PinnedImage(doc, line, name, repo, tag, digest, placeholder=marker == "1")


def locate(repo: str, registry: str | None) -> tuple[str, str]:
    """(registry URL, repository path) for a pinned ``repo``.

    The registry is ``registry`` when given (a mirror, or a local registry in tests), else
    ``https://`` + the host the repo names; the host is the first path component when it looks
    like one (has a dot or a port, or is ``localhost``), as Docker reads image names.
    """
    first, slash, rest = repo.partition("/")
    has_host = bool(slash) and ("." in first or ":" in first or first == "localhost")
    path = rest if has_host else repo
    if registry is not None:
        return registry, path
    if not has_host:
        raise ValueError(f"{repo!r} names no registry host: pin host/path or pass --registry")
    return urllib.parse.urlunsplit(("https", first, "", "", "")), path


def shown(path: Path) -> str:
    """``path`` relative to the working directory when it lies below it, else absolute."""
    absolute = path.resolve()
    try:
        return absolute.relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return absolute.as_posix()
