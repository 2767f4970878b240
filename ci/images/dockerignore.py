""".dockerignore rules: which context paths the builder never sends (so the key skips them too).

Semantics follow Docker's pattern matcher: patterns are cleaned and anchored at the context
root, ``*`` and ``?`` stay within one path element, ``**`` spans any number of them, ``!``
re-includes, the last matching pattern wins, and a pattern that matches a directory matches
everything below it. BuildKit reads ``<Dockerfile>.dockerignore`` beside the Dockerfile first,
then ``<context>/.dockerignore``.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Rule:
    pattern: str
    exclude: bool  # False for a "!" exception
    regex: re.Pattern[str]


@dataclass(frozen=True, slots=True)
class IgnoreRules:
    rules: tuple[Rule, ...] = ()
    source: str | None = None  # the file the rules came from, relative to the context

    def excluded(self, rel: str) -> bool:
        """Is the context-relative POSIX path ``rel`` left out of the build context?"""
        parents = _parents(rel)
        verdict = False
        for rule in self.rules:
            if rule.regex.match(rel) or any(rule.regex.match(p) for p in parents):
                verdict = rule.exclude
        return verdict

    def has_exceptions(self) -> bool:
        return any(not r.exclude for r in self.rules)


def load(dockerfile: Path, context: Path) -> IgnoreRules:
    for candidate in (
        dockerfile.with_name(dockerfile.name + ".dockerignore"),
        context / ".dockerignore",
    ):
        if candidate.is_file():
            rel = candidate.resolve().relative_to(context.resolve()).as_posix()
            return parse(candidate.read_text(encoding="utf-8"), rel)
    return IgnoreRules()


def parse(text: str, source: str | None = None) -> IgnoreRules:
    rules = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        exclude = not line.startswith("!")
        if not exclude:
            line = line[1:].strip()
        pattern = posixpath.normpath(line)
        if len(pattern) > 1 and pattern.startswith("/"):
            pattern = pattern[1:]
        rules.append(Rule(pattern, exclude, compile_pattern(pattern, double_star=True)))
    return IgnoreRules(tuple(rules), source)


def compile_pattern(pattern: str, *, double_star: bool) -> re.Pattern[str]:
    """Anchored regex for a Docker path pattern (``double_star``: ``**`` spans directories)."""
    out = ["^"]
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "*":
            if double_star and pattern[i + 1 : i + 2] == "*":
                i += 2
                if pattern[i : i + 1] == "/":
                    i += 1
                out.append(".*" if i >= len(pattern) else "(.*/)?")
                continue
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            end = pattern.find("]", i + 1)
            if end < 0:
                raise ValueError(f"unterminated '[' in pattern {pattern!r}")
            body = pattern[i + 1 : end].replace("\\", "\\\\")
            out.append("[" + ("^" + body[1:] if body.startswith("^") else body) + "]")
            i = end
        elif c == "\\" and i + 1 < len(pattern):
            i += 1
            out.append(re.escape(pattern[i]))
        else:
            out.append(re.escape(c))
        i += 1
    out.append("$")
    return re.compile("".join(out))


def has_magic(pattern: str) -> bool:
    return any(c in pattern for c in "*?[")


def _parents(rel: str) -> list[str]:
    parts = rel.split("/")
    return ["/".join(parts[:n]) for n in range(1, len(parts))]
