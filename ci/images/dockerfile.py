"""Dockerfile parsing: instructions, parser directives, and word expansion.

Only what the key and the lint need: instructions with their flags and arguments (line
continuations joined, comments dropped), and the shell-like word rules Docker applies to
``FROM``/``COPY``/``ADD``/``ARG``/``ENV`` arguments (quotes, escapes, ``$VAR``, ``${VAR:-word}``).
Anything the key could not account for (heredocs, unknown instructions, unsupported variable
operators) is an error, never a guess.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .errors import DockerfileError

KEYWORDS = frozenset(
    str.split(
        "ADD ARG CMD COPY ENTRYPOINT ENV EXPOSE FROM HEALTHCHECK LABEL MAINTAINER ONBUILD RUN "
        "SHELL STOPSIGNAL USER VOLUME WORKDIR"
    )
)
DIRECTIVES = frozenset({"syntax", "escape", "check"})
_DIRECTIVE = re.compile(r"^#\s*([A-Za-z][A-Za-z0-9_-]*)\s*=\s*(.*?)\s*$")
_FLAG = re.compile(r"--([A-Za-z][A-Za-z0-9-]*)(?:=(\S*))?")
_HEREDOC = re.compile(r"<<-?\s*[\"']?[A-Za-z_][A-Za-z0-9_]*[\"']?")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# name -> value; None means "declared by ARG without a value" (expands to "").
Env = Mapping[str, "str | None"]


@dataclass(frozen=True, slots=True)
class Instruction:
    """One logical instruction; ``flags`` maps ``--name`` (without dashes) to its raw value."""

    line: int  # 1-based line of the keyword
    keyword: str  # upper case
    flags: tuple[tuple[str, str | None], ...]
    rest: str  # arguments after the flags, raw (continuations joined)
    exec_form: tuple[str, ...] | None  # the JSON-array form, when used

    def flag(self, name: str) -> str | None:
        """The raw value of ``--name=value`` (the last one wins, as in Docker), or None."""
        found = None
        for key, value in self.flags:
            if key == name:
                found = value if value is not None else ""
        return found

    def flag_values(self, name: str) -> list[str]:
        """Every value of a repeatable flag such as ``--mount``."""
        return [v or "" for k, v in self.flags if k == name]

    def where(self) -> str:
        return f"line {self.line} ({self.keyword})"


@dataclass(frozen=True, slots=True)
class Dockerfile:
    path: Path
    directives: Mapping[str, str]  # lower-case directive name -> value
    instructions: tuple[Instruction, ...]

    @property
    def escape(self) -> str:
        return self.directives.get("escape", "\\")


def read(path: Path) -> Dockerfile:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise DockerfileError(f"cannot read Dockerfile {path}: {e}") from e
    return parse(text, path)


def parse(text: str, path: Path = Path("Dockerfile")) -> Dockerfile:
    lines = text.splitlines()
    directives, start = _directives(lines, path)
    escape = directives.get("escape", "\\")
    out: list[Instruction] = []
    i = start
    while i < len(lines):
        stripped = lines[i].strip()
        if not stripped or stripped.startswith("#"):
            i += 1
            continue
        first = i
        logical, i = _logical_line(lines, i, escape)
        out.append(_instruction(logical, first + 1, path))
    return Dockerfile(path, directives, tuple(out))


def _directives(lines: list[str], path: Path) -> tuple[dict[str, str], int]:
    found: dict[str, str] = {}
    for i, line in enumerate(lines):
        m = _DIRECTIVE.match(line.strip())
        if not m or m.group(1).lower() not in DIRECTIVES:
            return found, i
        name = m.group(1).lower()
        if name in found:
            raise DockerfileError(f"{path}:{i + 1}: parser directive {name!r} given twice")
        found[name] = m.group(2)
    if found.get("escape", "\\") not in ("\\", "`"):
        raise DockerfileError(f"{path}: escape directive must be '\\' or '`'")
    return found, len(lines)


def _logical_line(lines: list[str], i: int, escape: str) -> tuple[str, int]:
    """Join continuation lines (Docker drops comment and blank lines inside a continuation)."""
    parts: list[str] = []
    while i < len(lines):
        line = lines[i].rstrip()
        i += 1
        if parts and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.endswith(escape):
            parts.append(line[: -len(escape)])
            continue
        parts.append(line)
        break
    return "".join(parts), i


def _instruction(logical: str, line: int, path: Path) -> Instruction:
    m = re.match(r"(\S+)\s*(.*)", logical.strip(), re.DOTALL)
    keyword, rest = (m.group(1).upper(), m.group(2)) if m else ("", "")
    if keyword not in KEYWORDS:
        raise DockerfileError(f"{path}:{line}: unknown instruction {keyword!r}")
    rest = rest.strip()
    flags: list[tuple[str, str | None]] = []
    if keyword in ("FROM", "COPY", "ADD", "RUN", "HEALTHCHECK"):
        while rest.startswith("--"):
            m = _FLAG.match(rest)
            if not m:
                raise DockerfileError(f"{path}:{line}: cannot parse flag in {rest[:40]!r}")
            flags.append((m.group(1), m.group(2)))
            rest = rest[m.end() :].lstrip()
    exec_form = None
    if rest.startswith("[") and keyword in ("RUN", "CMD", "ENTRYPOINT", "COPY", "ADD", "SHELL"):
        try:
            value = json.loads(rest)
        except json.JSONDecodeError:
            value = None  # Docker falls back to the shell form
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            exec_form = tuple(value)
    if keyword in ("RUN", "COPY", "ADD") and exec_form is None and _HEREDOC.search(rest):
        raise DockerfileError(
            f"{path}:{line}: {keyword} uses a heredoc; the image key does not parse heredocs, "
            "move the content into a file and COPY it"
        )
    return Instruction(line, keyword, tuple(flags), rest, exec_form)


# --- words and variables ---------------------------------------------------------------------


def words(text: str, env: Env, *, escape: str = "\\", strict: bool = False) -> list[str]:
    """Split ``text`` into words the way Docker does for FROM/COPY/ARG/ENV arguments.

    Quotes group and are removed, ``escape`` escapes the next character, variables expand (an
    expanded value is not split again). ``strict``: a variable that no ARG/ENV of this Dockerfile
    defines is an error (it might come from the parent image's environment, which the key cannot
    see).
    """
    return [word(w, env, escape=escape, strict=strict) for w in raw_words(text, escape=escape)]


def word(raw: str, env: Env, *, escape: str = "\\", strict: bool = False) -> str:
    """One raw word (from ``raw_words``) with quotes removed and variables expanded."""
    out = _Lexer(raw, env, escape, strict).words()
    return "".join(out)


def raw_words(text: str, *, escape: str = "\\") -> list[str]:
    """Split on unquoted whitespace, keeping quotes and escapes in each word (not expanded)."""
    out: list[str] = []
    start: int | None = None
    quote = ""
    i = 0
    while i < len(text):
        c = text[i]
        if start is None and not c.isspace():
            start = i
        if quote:
            if c == quote:
                quote = ""
            elif c == escape and quote == '"':
                i += 1
        elif c == escape:
            i += 1
        elif c in "'\"":
            quote = c
        elif c.isspace() and start is not None:
            out.append(text[start:i])
            start = None
        i += 1
    if quote:
        raise DockerfileError(f"unterminated {quote} quote in {text!r}")
    if start is not None:
        out.append(text[start:])
    return out


def expand(text: str, env: Env, *, escape: str = "\\", strict: bool = False) -> str:
    """Expand variables in ``text`` without splitting or removing quotes (JSON-form arguments)."""
    return _Lexer(text, env, escape, strict).expand_only()


class _Lexer:
    def __init__(self, text: str, env: Env, escape: str, strict: bool) -> None:
        self.s, self.env, self.esc, self.strict = text, env, escape, strict
        self.i = 0

    def words(self) -> list[str]:
        out: list[str] = []
        cur: list[str] = []
        have = False
        s = self.s
        while self.i < len(s):
            c = s[self.i]
            if c.isspace():
                if have:
                    out.append("".join(cur))
                    cur, have = [], False
                self.i += 1
            elif c == self.esc and self.i + 1 < len(s):
                cur.append(s[self.i + 1])
                self.i += 2
                have = True
            elif c == "'":
                end = s.find("'", self.i + 1)
                if end < 0:
                    raise DockerfileError(f"unterminated single quote in {s!r}")
                cur.append(s[self.i + 1 : end])
                self.i = end + 1
                have = True
            elif c == '"':
                cur.append(self._double_quoted())
                have = True
            elif c == "$":
                cur.append(self._variable())
                have = True
            else:
                cur.append(c)
                self.i += 1
                have = True
        if have:
            out.append("".join(cur))
        return out

    def expand_only(self) -> str:
        return self._scan(None, ("$",))

    def _double_quoted(self) -> str:
        self.i += 1  # past the opening quote
        return self._scan('"', ('"', "$", self.esc))

    def _scan(self, until: str | None, escapable: tuple[str, ...]) -> str:
        """Copy characters, expanding variables, up to ``until`` (consumed) or the end."""
        s = self.s
        out: list[str] = []
        while self.i < len(s):
            c = s[self.i]
            if c == until:
                self.i += 1
                return "".join(out)
            if c == self.esc and s[self.i + 1 : self.i + 2] in escapable:
                out.append(s[self.i + 1])
                self.i += 2
            elif c == "$":
                out.append(self._variable())
            else:
                out.append(c)
                self.i += 1
        if until is not None:
            raise DockerfileError(f"unterminated {until} quote in {s!r}")
        return "".join(out)

    def _variable(self) -> str:
        s = self.s
        self.i += 1  # past '$'
        if s[self.i : self.i + 1] != "{":
            m = _NAME.match(s, self.i)
            if not m:
                return "$"
            self.i = m.end()
            return self._lookup(m.group(0), None, "")
        m = _NAME.match(s, self.i + 1)
        if not m:
            raise DockerfileError(f"bad variable reference in {s!r}")
        name, self.i = m.group(0), m.end()
        if s[self.i : self.i + 1] == "}":
            self.i += 1
            return self._lookup(name, None, "")
        op = s[self.i : self.i + 2] if s[self.i : self.i + 1] == ":" else s[self.i : self.i + 1]
        if op not in (":-", ":+", ":?", "-", "+", "?"):
            raise DockerfileError(
                f"unsupported variable operator in {s!r}: only ${{V}}, ${{V:-w}}, ${{V-w}}, "
                "${V:+w}, ${V+w}, ${V:?msg} are understood"
            )
        self.i += len(op)
        word = self._braced_word()
        return self._lookup(name, op, word)

    def _braced_word(self) -> str:
        s, depth, start = self.s, 1, self.i
        while self.i < len(s):
            if s[self.i] == "{":
                depth += 1
            elif s[self.i] == "}":
                depth -= 1
                if depth == 0:
                    word = s[start : self.i]
                    self.i += 1
                    return _Lexer(word, self.env, self.esc, self.strict).expand_only()
            self.i += 1
        raise DockerfileError(f"unterminated ${{...}} in {s!r}")

    def _lookup(self, name: str, op: str | None, word: str) -> str:
        declared = name in self.env
        value = self.env.get(name)
        is_set = value is not None
        non_empty = bool(value)
        if op in (":-", "-"):
            use_default = not non_empty if op == ":-" else not is_set
            return word if use_default else str(value)
        if op in (":+", "+"):
            use_alt = non_empty if op == ":+" else is_set
            return word if use_alt else ""
        if op in (":?", "?") and (not non_empty if op == ":?" else not is_set):
            raise DockerfileError(f"${{{name}}} is required: {word or 'not set'}")
        if not declared and self.strict:
            raise DockerfileError(
                f"${name} is not defined by any ARG or ENV of this Dockerfile (it may come from "
                "the parent image, which the image key cannot see); declare it with ARG"
            )
        return value or ""
