"""Lint: the Dockerfile steps whose inputs can change while the image key stays the same.

The key hashes the recipe; these rules find the places where the recipe does not pin what it
fetches. ``error`` findings make the lint fail; ``warning`` findings are reported only (apt
versions disappear from rolling mirrors, so pinning them is a judgement call, and a checksum
check inside a download pipeline cannot be recognised reliably).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from . import dockerfile as dfp
from .key import PINNED_IMAGE

Severity = Literal["error", "warning"]
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_SEPARATORS = re.compile(r"&&|\|\||;|\||\n")
_PIP_VALUE_OPTIONS = frozenset(
    str.split(
        "-r --requirement -c --constraint -e --editable -i --index-url --extra-index-url -f "
        "--find-links -t --target --prefix --root --src --platform --python-version "
        "--implementation --abi --progress-bar --cache-dir --log --trusted-host "
        "--config-settings -C --global-option --no-binary --only-binary --upgrade-strategy "
        "--report --python --proxy --retries --timeout --exists-action --cert --client-cert "
        "--group"
    )
)
_APT_VALUE_OPTIONS = frozenset(str.split("-o --option -t --target-release -c --config-file"))


@dataclass(frozen=True, slots=True)
class Finding:
    line: int
    rule: str
    severity: Severity
    message: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        return f"line {self.line}: {self.severity} [{self.rule}] {self.message}"


def lint(path: Path) -> list[Finding]:
    return lint_dockerfile(dfp.read(path))


def lint_dockerfile(df: dfp.Dockerfile) -> list[Finding]:
    out: list[Finding] = []
    syntax = df.directives.get("syntax")
    if syntax is not None and not PINNED_IMAGE.match(syntax):
        out.append(
            _error(1, "syntax-unpinned", f"# syntax={syntax}: frontend image without digest")
        )
    env: dict[str, str | None] = {}  # ARG defaults, to resolve ${VAR} in FROM and git refs
    stages: set[str] = set()
    for ins in df.instructions:
        if ins.keyword == "ARG":
            for w in dfp.raw_words(ins.rest, escape=df.escape):
                name, eq, value = w.partition("=")
                env[name] = dfp.word(value, env, escape=df.escape) if eq else env.get(name)
        elif ins.keyword == "FROM":
            out += _from(ins, env, stages, df.escape)
        elif ins.keyword in ("COPY", "ADD"):
            out += _copy_add(ins, env, stages)
        elif ins.keyword == "RUN":
            text = " ".join(ins.exec_form) if ins.exec_form is not None else ins.rest
            out += _run(ins.line, text, env)
            out += _mounts(ins, stages)
    return out


def _from(
    ins: dfp.Instruction, env: dict[str, str | None], stages: set[str], escape: str
) -> list[Finding]:
    ws = dfp.words(ins.rest, env, escape=escape)
    if not ws:
        return [_error(ins.line, "from-unpinned", "FROM without an image")]
    image = ws[0]
    earlier_stage = image.lower() in stages
    if len(ws) == 3:
        stages.add(ws[2].lower())
    if image == "scratch" or earlier_stage or PINNED_IMAGE.match(image):
        return []
    return [_error(ins.line, "from-unpinned", f"FROM {image}: no @sha256 digest; a tag can move")]


def _copy_add(ins: dfp.Instruction, env: dict[str, str | None], stages: set[str]) -> list[Finding]:
    out = []
    source = ins.flag("from")
    external = source is not None and source.lower() not in stages and not source.isdigit()
    if external and not PINNED_IMAGE.match(dfp.word(source or "", env)):
        out.append(_error(ins.line, "from-unpinned", f"--from={source}: image without digest"))
    if ins.keyword == "ADD":
        for w in ins.exec_form or tuple(dfp.raw_words(ins.rest)):
            if "://" not in w and not w.startswith("git@"):
                continue
            git = w.startswith("git@") or w.split("#")[0].endswith(".git")
            if git and not re.search(r"#[0-9a-f]{40}$", w):
                out.append(_error(ins.line, "add-unpinned", f"ADD {w}: git ref without a commit"))
            elif not git and not (ins.flag("checksum") or "").startswith("sha256:"):
                out.append(_error(ins.line, "add-unpinned", f"ADD {w}: no --checksum=sha256:"))
    return out


def _mounts(ins: dfp.Instruction, stages: set[str]) -> list[Finding]:
    out = []
    for mount in ins.flag_values("mount"):
        opts = dict(kv.partition("=")[::2] for kv in mount.split(",") if kv)
        image = opts.get("from")
        if (
            image
            and image.lower() not in stages
            and not image.isdigit()
            and not PINNED_IMAGE.match(image)
        ):
            out.append(_error(ins.line, "from-unpinned", f"--mount from={image}: no digest"))
    return out


def _run(line: int, text: str, env: dict[str, str | None]) -> list[Finding]:
    commands = [c for c in (_split(part) for part in _SEPARATORS.split(text)) if c]
    out: list[Finding] = []
    pinned_checkout = any(_checks_out_commit(c, env) for c in commands)
    downloads = False
    for cmd in commands:
        prog = Path(cmd[0]).name
        if prog in ("curl", "wget"):
            downloads = True
        if prog == "git" and "clone" in cmd[1:3] and not pinned_checkout:
            url = next((a for a in cmd[cmd.index("clone") + 1 :] if not a.startswith("-")), "?")
            out.append(
                _error(
                    line,
                    "git-unpinned",
                    f"git clone {url}: no `git checkout <commit>` (40 hex) in the same RUN",
                )
            )
        for req in _pip_requirements(cmd):
            out.append(_error(line, "pip-unpinned", req))
        for pkg in _apt_packages(cmd):
            out.append(_warning(line, "apt-unpinned", f"apt-get install {pkg}: no =version"))
    if downloads and "sha256sum" not in text and "--checksum" not in text:
        out.append(_warning(line, "download-unchecked", "curl/wget without a sha256sum check"))
    return out


def _split(command: str) -> list[str]:
    try:
        return shlex.split(command, comments=False)
    except ValueError:  # unbalanced quotes in a fragment: nothing we can read reliably
        return command.split()


def _checks_out_commit(cmd: list[str], env: dict[str, str | None]) -> bool:
    if not cmd or Path(cmd[0]).name != "git":
        return False
    args = cmd[1:]
    while args[:1] == ["-C"] or (args and args[0].startswith("-c")):
        args = args[2:] if args[0] in ("-C", "-c") else args[1:]
    if not args or args[0] not in ("checkout", "reset", "switch", "fetch"):
        return False
    return any(_COMMIT.match(dfp.word(a, env)) for a in args[1:] if not a.startswith("-"))


def _pip_requirements(cmd: list[str]) -> Iterator[str]:
    """Messages for each unpinned requirement of a `pip install` command (empty if not pip)."""
    try:
        i = next(n for n, a in enumerate(cmd) if a == "install")
    except StopIteration:
        return
    head = [Path(a).name for a in cmd[:i]]
    if not any(h == "pip" or re.fullmatch(r"pip3(\.\d+)?", h) for h in head):
        return
    args = cmd[i + 1 :]
    require_hashes = "--require-hashes" in args
    n = 0
    while n < len(args):
        a = args[n]
        if a in _PIP_VALUE_OPTIONS:
            value = args[n + 1] if n + 1 < len(args) else ""
            if a in ("-r", "--requirement") and not require_hashes:
                yield f"pip install -r {value}: the lint does not read it; use --require-hashes"
            if a in ("-e", "--editable"):
                yield from _pip_requirement(value)
            n += 2
            continue
        if not a.startswith("-"):
            yield from _pip_requirement(a)
        n += 1


def _pip_requirement(req: str) -> Iterator[str]:
    # pip reads an argument with a path separator (and no URL scheme) as a local path
    if req.startswith((".", "/")) or ("/" in req and "://" not in req):
        return  # a local path: its content is a COPY input, covered by the key
    if "://" in req:
        if req.startswith("git+") and re.search(r"@[0-9a-f]{40}(#|$)", req):
            return
        if "#sha256=" in req:
            return
        yield f"pip install {req}: URL without a commit or #sha256= hash"
        return
    spec = req.split(";")[0]
    if re.search(r"===?\s*[^=*,\s]+$", spec) and "," not in spec and "*" not in spec:
        return
    yield f"pip install {req}: not pinned with =="


def _apt_packages(cmd: list[str]) -> Iterator[str]:
    if not cmd or Path(cmd[0]).name not in ("apt-get", "apt") or "install" not in cmd:
        return
    args = cmd[cmd.index("install") + 1 :]
    n = 0
    while n < len(args):
        a = args[n]
        if a in _APT_VALUE_OPTIONS:
            n += 2
            continue
        if not a.startswith("-") and "=" not in a:
            yield a
        n += 1


def _error(line: int, rule: str, message: str) -> Finding:
    return Finding(line, rule, "error", message)


def _warning(line: int, rule: str, message: str) -> Finding:
    return Finding(line, rule, "warning", message)
