"""Checks that keep the docs honest: every fenced block, every pin, every relative link.

``python docs/checks.py`` prints every finding (exit 1 if any); ``tests/test_docs.py`` runs the
same checks in CI, runs the blocks marked runnable, and proves each check fails on planted
mistakes. What is checked, per Markdown file under ``docs/`` plus ``README.md``:

- shell blocks (info ``bash``, ``sh``, ``shell``, ``console``): ``bash -n`` each, and
  ``shellcheck`` all of a file's shell blocks as one script (the reader runs them in one shell,
  so a variable set in one block and used in a later one is fine), minus ``ALLOW``;
  ``docs/**/*.sh`` get the same two checks;
- Python blocks: compiled; those marked ``python runnable`` are run (``run_python``);
- pins: a block marked ``pins`` holds only ``NAME=value`` lines. ``*_DIGEST`` is
  ``sha256:`` + 64 hex digits, ``*_REVISION`` 40 hex digits; ``<DIST>_VERSION`` for a
  distribution of this repository (``PLUGIN_API_VERSION`` for ``plugin-api``) equals the version
  in its pyproject.toml, any other ``*_VERSION`` is a PEP 440 version. Every pin is used by a
  later command, and no command repeats a pinned value instead of naming it. Guides under
  ``docs/deploy/`` have exactly one pins block. Any ``sha256:`` followed by letters or digits
  anywhere is 64 lowercase hex digits (``sha256:<digest>``, ``sha256:...`` describe the format);
- relative links and images resolve to a file, and ``#anchors`` to a heading.

Info-string words after the language are flags: ``runnable`` (executed by the tests, shell
ones in order in one ``bash`` against stub CLIs; see ``run_shell``), ``pins``, and
``file=PATH`` (the block is an excerpt of that repository file and must appear in it verbatim,
so a guide cannot drift from the code it quotes). ``plugin=PATH`` marks a block as the whole file
PATH of the plugin that docs/writing-a-plugin.md writes out in full; a Python one is compiled
here like any other, and ``tests/test_plugin_guide_example.py`` installs the plugin built from
these blocks and runs the conformance kit on it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import tomllib  # Python 3.11+: the docs checks run on the CI interpreter
from markdown_it.token import Token

_ROOT = Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:  # run as ``python docs/checks.py``: ci/ lives at the root
    sys.path.insert(0, str(_ROOT))

# The parsing is shared with ``ci.pins`` (one place: ci/docblocks.py).
from ci.docblocks import (  # noqa: E402
    ASSIGN,
    PINS,
    RUNNABLE,
    Block,
    Finding,
    blocks,
    doc_files,
    parse,
    parse_pins,
    pin_problem,
    pins_blocks,
)

PYTHON = frozenset({"python", "py"})
TIMEOUT = 300  # seconds for one runnable file or block


@dataclass(frozen=True, slots=True)
class Allow:
    """A reviewed exception: shellcheck ``code`` is accepted in ``path``, for ``why``."""

    path: str
    code: str
    why: str


# Reviewed allow-list: (file, shellcheck code, why). Empty today: every block passes as written.
# An entry that no longer suppresses anything is itself a finding.
ALLOW: tuple[Allow, ...] = ()


def _rel(root: Path, path: Path) -> str:
    return path.relative_to(root).as_posix()


# ---- shell ---------------------------------------------------------------------------------------


def _bash_n(code: str) -> str | None:
    r = subprocess.run(["bash", "-n"], input=code, capture_output=True, text=True, timeout=30)
    if r.returncode == 0:
        return None
    return r.stderr.strip() or f"bash -n exited {r.returncode}"


def _shellcheck(code: str) -> list[dict]:
    if shutil.which("shellcheck") is None:
        raise RuntimeError("shellcheck is not installed: apt-get install -y shellcheck")
    r = subprocess.run(
        ["shellcheck", "--shell=bash", "--format=json1", "-"],
        input=code,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if r.returncode not in (0, 1):
        raise RuntimeError(f"shellcheck failed: {r.stderr.strip()}")
    return list(json.loads(r.stdout)["comments"])


def check_shell_source(
    rel: str, pieces: Sequence[tuple[int, str]], allow: Sequence[Allow], used: set[Allow]
) -> list[Finding]:
    """``pieces``: (line in ``rel`` of the code's first line, code). Each piece gets ``bash -n``;
    all of them, joined in order, one shellcheck run whose findings map back to ``rel`` lines."""
    findings = []
    joined: list[str] = []
    origin: list[int] = []  # origin[i]: line in rel of joined line i + 1
    for first, code in pieces:
        err = _bash_n(code)
        if err:
            findings.append(Finding(rel, first, "syntax", err.replace("bash: line", "line")))
        lines = code.splitlines() or [""]
        joined.extend(lines)
        origin.extend(range(first, first + len(lines)))
    if findings:  # shellcheck on broken syntax only repeats it
        return findings
    for c in _shellcheck("\n".join(joined) + "\n"):
        code = f"SC{c['code']}"
        hit = next((a for a in allow if a.path == rel and a.code == code), None)
        if hit is not None:
            used.add(hit)
            continue
        line = origin[c["line"] - 1] if 0 < c["line"] <= len(origin) else pieces[0][0]
        findings.append(Finding(rel, line, "shellcheck", f"{code} ({c['level']}): {c['message']}"))
    return findings


# ---- python --------------------------------------------------------------------------------------


def check_python(rel: str, block: Block) -> list[Finding]:
    try:
        compile(textwrap.dedent(block.text), f"{rel}:{block.line}", "exec")
    except SyntaxError as e:
        return [Finding(rel, block.line + (e.lineno or 0), "python", f"SyntaxError: {e.msg}")]
    return []


def run_python(root: Path, rel: str, block: Block) -> list[Finding]:
    """Run a ``python runnable`` block in a fresh interpreter, from ``root``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLUGIN_API_")}
    r = subprocess.run(
        [sys.executable, "-c", block.text],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    if r.returncode:
        tail = "\n".join(r.stderr.strip().splitlines()[-5:])
        return [Finding(rel, block.line, "python", f"runnable block exited {r.returncode}: {tail}")]
    return []


def check_excerpt(root: Path, rel: str, block: Block) -> list[Finding]:
    src = block.source
    if src is None:
        return []
    target = root / src
    if not target.is_file():
        return [Finding(rel, block.line, "excerpt", f"file={src} does not exist")]
    if block.text.strip() not in target.read_text(encoding="utf-8"):
        return [Finding(rel, block.line, "excerpt", f"differs from {src}; copy it again")]
    return []


# ---- pins ----------------------------------------------------------------------------------------

_ANY_DIGEST = re.compile(r"sha256:([0-9A-Za-z]*)")


def repo_versions(root: Path) -> dict[str, str]:
    """``{PIN_NAME: version}`` for every distribution in this repository, e.g.
    ``PLUGIN_API_VERSION`` for ``plugin-api``."""
    out = {}
    found = [root / "pyproject.toml", *root.glob("plugins/*/pyproject.toml")]
    found += root.glob("docs/examples/*/pyproject.toml")
    found += root.glob("integrations/*/pyproject.toml")
    for p in (p for p in found if p.exists()):
        project = tomllib.loads(p.read_text(encoding="utf-8")).get("project", {})
        if "name" in project and "version" in project:
            name = re.sub(r"[^A-Za-z0-9]+", "_", project["name"]).upper()
            out[f"{name}_VERSION"] = str(project["version"])
    return out


def check_pin_values(
    rel: str, pins: Mapping[str, tuple[int, str]], versions: Mapping[str, str]
) -> list[Finding]:
    findings = []
    for name, (line, value) in pins.items():
        problem = pin_problem(name, value)
        if problem is None and name in versions and value != versions[name]:
            problem = f"{name}={value!r} but the repository's pyproject.toml says {versions[name]}"
        if problem:
            findings.append(Finding(rel, line, "pins", problem))
    return findings


def check_pin_use(
    rel: str, pins: Mapping[str, tuple[int, str]], commands: Sequence[Block]
) -> list[Finding]:
    """Every pin is named by some command; no command repeats a pinned value literally."""
    findings = []
    text = "\n".join(b.code for b in commands)
    for name, (line, value) in pins.items():
        if not re.search(rf"\$\{{?{name}\b", text):
            findings.append(Finding(rel, line, "pins", f"pin {name} is not used by any command"))
        literal = name.endswith(("_DIGEST", "_REVISION", "_VERSION")) or len(value) >= 6
        for b in commands:
            if literal and value and value in b.code:
                findings.append(
                    Finding(rel, b.line, "pins", f"repeats the value of {name}; use ${name}")
                )
    return findings


def check_digests(rel: str, text: str) -> list[Finding]:
    findings = []
    for i, line in enumerate(text.splitlines(), start=1):
        for m in _ANY_DIGEST.finditer(line):
            # "sha256:<digest>" or "sha256:..." describe the format; anything that starts
            # like a digest must be one.
            if m[1] and not re.fullmatch(r"[0-9a-f]{64}", m[1]):
                findings.append(
                    Finding(rel, i, "digest", f"'{m[0]}' is not sha256: + 64 lowercase hex digits")
                )
    return findings


# ---- links ---------------------------------------------------------------------------------------

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def slug(text: str) -> str:
    """GitHub's heading anchor: lowercase, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(tokens: Sequence[Token]) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for i, t in enumerate(tokens):
        if t.type != "heading_open":
            continue
        inline = tokens[i + 1]
        text = "".join(
            c.content for c in inline.children or [] if c.type in ("text", "code_inline")
        )
        base = slug(text)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(tokens: Sequence[Token]) -> Iterable[tuple[int, str]]:
    for t in tokens:
        if t.type != "inline" or t.map is None:
            continue
        line = t.map[0] + 1
        for c in t.children or []:
            if c.type in ("softbreak", "hardbreak"):
                line += 1
            target = c.attrGet("href") if c.type == "link_open" else None
            if c.type == "image":
                target = c.attrGet("src")
            if isinstance(target, str):
                yield line, target


def check_links(root: Path, path: Path, tokens: Sequence[Token]) -> list[Finding]:
    rel = _rel(root, path)
    findings = []
    for line, target in links(tokens):
        if _SCHEME.match(target) or target.startswith("//"):
            continue  # external: not checked here (no network in CI)
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            findings.append(Finding(rel, line, "link", f"{target}: {file_part} does not exist"))
            continue
        if anchor and dest.suffix == ".md" and anchor not in anchors(parse(dest)):
            findings.append(Finding(rel, line, "link", f"{target}: no heading #{anchor}"))
    return findings


# ---- the whole tree ------------------------------------------------------------------------------


def check_tree(
    root: Path, *, allow: Sequence[Allow] = ALLOW, run_python_blocks: bool = True
) -> list[Finding]:
    """Every check except running shell blocks (that needs stubs: ``run_shell``)."""
    root = root.resolve()
    versions = repo_versions(root)
    used: set[Allow] = set()
    findings: list[Finding] = []
    for path in doc_files(root):
        rel = _rel(root, path)
        tokens = parse(path)
        bs = blocks(path, tokens)
        shell = [b for b in bs if b.shell]
        if shell:
            pieces = [(b.line + 1, b.code) for b in shell]
            findings += check_shell_source(rel, pieces, allow, used)
        for b in bs:
            findings += check_excerpt(root, rel, b)
            if b.lang in PYTHON:
                found = check_python(rel, b)
                findings += found
                if not found and RUNNABLE in b.flags and run_python_blocks:
                    findings += run_python(root, rel, b)
        pin_blocks = pins_blocks(shell)
        if rel.startswith("docs/deploy/") and len(pin_blocks) != 1:
            findings.append(
                Finding(
                    rel,
                    1,
                    "pins",
                    f"a deployment guide has one pins block, found {len(pin_blocks)}",
                )
            )
        elif len(pin_blocks) > 1:
            findings.append(Finding(rel, pin_blocks[1].line, "pins", "more than one pins block"))
        for pb in pin_blocks[:1]:
            pins, bad = parse_pins(rel, pb)
            findings += bad + check_pin_values(rel, pins, versions)
            findings += check_pin_use(rel, pins, [b for b in shell if PINS not in b.flags])
        findings += check_digests(rel, path.read_text(encoding="utf-8"))
        findings += check_links(root, path, tokens)
    for script in sorted((root / "docs").rglob("*.sh")):
        rel = _rel(root, script)
        findings += check_shell_source(rel, [(1, script.read_text(encoding="utf-8"))], allow, used)
        findings += check_digests(rel, script.read_text(encoding="utf-8"))
    for a in allow:
        if a not in used:
            findings.append(
                Finding(a.path, 1, "allow-list", f"{a.code} is allowed but never reported; drop it")
            )
    return findings


# ---- running shell blocks ------------------------------------------------------------------------


def runnable_shell(path: Path) -> list[Block]:
    return [b for b in blocks(path) if b.shell and RUNNABLE in b.flags]


def with_pins(block: Block, overrides: Mapping[str, str]) -> str:
    """The pins block's code with ``overrides`` replacing assigned values (what-if runs)."""
    left = dict(overrides)
    lines = []
    for raw in block.code.splitlines():
        m = ASSIGN.match(raw.strip())
        if m and m["name"] in left:
            raw = f'{m["name"]}="{left.pop(m["name"])}"'
        lines.append(raw)
    if left:
        raise KeyError(f"not pinned in {block.path.name}: {sorted(left)}")
    return "\n".join(lines) + "\n"


def run_shell(
    root: Path,
    path: Path,
    *,
    stubs: Path,
    env: Mapping[str, str] | None = None,
    pins: Mapping[str, str] | None = None,
    workdir: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``path``'s runnable shell blocks, in order, as one ``bash -eu -o pipefail`` script.

    PATH is ``stubs`` (stand-ins for external services' CLIs), then this interpreter's bin
    directory (``plugin-api``, ``pytest``), then ``/usr/bin:/bin``. The working directory is a
    fresh one whose entries link to ``root``'s top level, so relative paths in the docs resolve
    and whatever the blocks write stays out of the repository. ``pins`` overrides pinned values.
    """
    root, path = root.resolve(), path.resolve()
    parts = []
    for b in runnable_shell(path):
        code = with_pins(b, pins or {}) if PINS in b.flags else b.code
        parts.append(f"# ---- {_rel(root, path)}:{b.line}\n{code}")
    if not parts:
        raise ValueError(f"{path} has no runnable shell blocks")
    work = workdir or Path(tempfile.mkdtemp(prefix="doc-run-"))
    for entry in root.iterdir():
        if not entry.name.startswith(".") and not (work / entry.name).exists():
            (work / entry.name).symlink_to(entry)
    home = work / ".home"
    home.mkdir(exist_ok=True)
    base = {k: v for k, v in os.environ.items() if not k.startswith("PLUGIN_API_")}
    path_var = os.pathsep.join([str(stubs), str(Path(sys.executable).parent), "/usr/bin", "/bin"])
    full_env = base | {"PATH": path_var, "HOME": str(home)} | dict(env or {})
    return subprocess.run(
        ["bash", "-eu", "-o", "pipefail", "-c", "\n".join(parts)],
        cwd=work,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    root = Path(args[0]) if args else Path(__file__).resolve().parent.parent
    findings = check_tree(root)
    for f in findings:
        print(f)
    print(f"{len(findings)} finding(s) in {len(doc_files(root))} Markdown files", file=sys.stderr)
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
