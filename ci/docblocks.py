"""Fenced blocks and pins blocks of the repository's Markdown, shared by the docs checks
(``docs/checks.py``) and the pin freshness check (``ci.pins``).

A block's info string is a language then flags: ``runnable``, ``pins``, ``file=PATH`` (see
``docs/checks.py``). A pins block is a shell block flagged ``pins`` that holds only
``NAME=value`` lines (optionally ``export``-ed, quoted, with a trailing comment). A pin's name
says its kind, and ``pin_problem`` its format: ``*_DIGEST`` an image digest, ``*_REVISION`` a
40-hex commit, ``*_VERSION`` a release version.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from markdown_it import MarkdownIt
from markdown_it.token import Token
from packaging.version import InvalidVersion, Version

SHELL = frozenset({"bash", "sh", "shell", "console"})
RUNNABLE, PINS = "runnable", "pins"
DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
REVISION = re.compile(r"^[0-9a-f]{40}$")
ASSIGN = re.compile(
    r"""^(?:export\s+)?(?P<name>[A-Z][A-Z0-9_]*)=(?:"(?P<dq>[^"$`\\]*)"|'(?P<sq>[^']*)'|"""
    r"""(?P<bare>[^\s"'$`\\#;&|]*))\s*(?:\#.*)?$"""
)


@dataclass(frozen=True, slots=True)
class Finding:
    path: str  # relative to the checked root, POSIX separators
    line: int
    check: str  # syntax, shellcheck, python, excerpt, pins, digest, link, allow-list
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: [{self.check}] {self.message}"


@dataclass(frozen=True, slots=True)
class Block:
    """One fenced code block: ``line`` is the 1-based line of its opening fence."""

    path: Path
    line: int
    lang: str
    flags: frozenset[str]
    text: str

    @property
    def source(self) -> str | None:
        """The repository file this block quotes (flag ``file=PATH``), if any."""
        return next((f[5:] for f in self.flags if f.startswith("file=")), None)

    @property
    def shell(self) -> bool:
        return self.lang in SHELL

    @property
    def code(self) -> str:
        """The commands: a ``console`` block's lines after ``$ `` (others are output)."""
        if self.lang != "console":
            return self.text
        lines = [ln[2:] if ln.startswith("$ ") else "" for ln in self.text.splitlines()]
        return "\n".join(lines) + "\n"


_MD = MarkdownIt("commonmark").enable("table")


def doc_files(root: Path) -> list[Path]:
    """Every Markdown file under ``root/docs``, then ``root/README.md`` if there is one."""
    files = sorted((root / "docs").rglob("*.md"))
    readme = root / "README.md"
    return [*files, readme] if readme.exists() else files


def parse(path: Path) -> list[Token]:
    return _MD.parse(path.read_text(encoding="utf-8"))


def blocks(path: Path, tokens: Sequence[Token] | None = None) -> list[Block]:
    out = []
    for t in tokens if tokens is not None else parse(path):
        if t.type != "fence" or t.map is None:
            continue
        words = t.info.split()
        lang = words[0].lower() if words else ""
        out.append(Block(path, t.map[0] + 1, lang, frozenset(words[1:]), t.content))
    return out


def pins_blocks(bs: Sequence[Block]) -> list[Block]:
    """The shell blocks flagged ``pins``, in file order."""
    return [b for b in bs if b.shell and PINS in b.flags]


def parse_pins(rel: str, block: Block) -> tuple[dict[str, tuple[int, str]], list[Finding]]:
    """``{NAME: (line in the file, value)}`` of a pins block, and a finding per line that is not
    a ``NAME=value`` pin. Comments and blank lines are skipped."""
    pins: dict[str, tuple[int, str]] = {}
    findings = []
    for i, raw in enumerate(block.text.splitlines()):
        line = block.line + 1 + i
        s = raw.strip()
        if not s or s.startswith("#"):
            continue
        m = ASSIGN.match(s)
        if m is None:
            findings.append(
                Finding(rel, line, "pins", f"not a NAME=value pin (a pins block is data): {s!r}")
            )
            continue
        value = next(v for v in (m["dq"], m["sq"], m["bare"]) if v is not None)
        pins[m["name"]] = (line, value)
    return pins, findings


def pin_problem(name: str, value: str) -> str | None:
    """What is wrong with the format of pin ``name=value`` for its kind (by name), or None."""
    if name.endswith("_DIGEST") and not DIGEST.match(value):
        return f"{name}={value!r} is not sha256: followed by 64 lowercase hex digits"
    if name.endswith("_REVISION") and not REVISION.match(value):
        return f"{name}={value!r} is not a 40-hex-digit commit"
    if name.endswith("_VERSION"):
        try:
            Version(value)
        except InvalidVersion:
            return f"{name}={value!r} is not a version such as 1.2.3"
        if not value[:1].isdigit():
            return f"{name}={value!r} is not a version such as 1.2.3"
    return None
