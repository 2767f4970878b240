"""The image key: sha256 over a canonical record of everything a Dockerfile build reads.

The record holds the schema version, the platform and target, every effective build arg (ARG
defaults overridden by the given ``--build-arg``), every parent and ``--from`` image as
``repo@sha256:...``, pinned remote ``ADD`` sources, and every context file the build reads
(the Dockerfile, everything ``COPY``/``ADD`` or a bind mount takes from the context) with its
path, type, permission bits and sha256. Inputs are found by parsing the Dockerfile, so there is
no hand-kept list to forget: a source that does not exist, leaves the context or is excluded by
.dockerignore is an error, as are tag-only images and variables the key cannot resolve.

The key covers inputs, not output bytes: a ``RUN`` that fetches unpinned content gives the same
key for different images (``lint`` reports such steps).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import dockerfile as dfp
from . import dockerignore
from .errors import DockerfileError, InputError
from .names import SCHEMA_VERSION

# Proxy settings change how bytes travel, not what is built: accepted, never recorded.
TRANSPORT_ARGS = frozenset(
    n for p in ("HTTP", "HTTPS", "FTP", "NO", "ALL") for n in (f"{p}_PROXY", f"{p.lower()}_proxy")
)
PINNED_IMAGE = re.compile(
    r"^(?P<repo>[^@\s]+?)(?::[\w][\w.-]{0,127})?@sha256:(?P<hex>[0-9a-f]{64})$"
)
_COMMIT_URL = re.compile(r"#[0-9a-f]{40}$")
_AUTOMATIC = frozenset({"TARGETPLATFORM", "TARGETOS", "TARGETARCH", "TARGETVARIANT"})


@dataclass(frozen=True, slots=True)
class ImageKey:
    key: str  # sha256 hex of canonical(record)
    record: Mapping[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "record": self.record}


def compute(
    dockerfile: Path,
    context: Path,
    build_args: Mapping[str, str] | None = None,
    *,
    platform: str = "linux/amd64",
    target: str | None = None,
) -> ImageKey:
    """Parse ``dockerfile``, collect its inputs from ``context``, and hash the record."""
    ctx = context.resolve()
    path = dockerfile.resolve()
    if not ctx.is_dir():
        raise InputError(f"build context {context} is not a directory")
    if not path.is_relative_to(ctx):
        raise InputError(f"Dockerfile {dockerfile} is outside the build context {ctx}")
    walker = _Walker(dfp.read(path), ctx, dict(build_args or {}), platform)
    walker.run()
    walker.add_file(path)
    if target is not None and target.lower() not in walker.stage_names:
        raise InputError(
            f"--target {target!r} names no stage; stages: {sorted(walker.stage_names)}"
        )
    record = {
        "schema": SCHEMA_VERSION,
        "dockerfile": path.relative_to(ctx).as_posix(),
        "platform": platform,
        "target": target,
        "args": sorted(walker.args, key=lambda a: (a["scope"], a["name"])),
        "parents": walker.parents,
        "images": sorted(set(walker.images)),
        "remote": sorted(walker.remote, key=lambda r: r["url"]),
        "inputs": [walker.inputs[k] for k in sorted(walker.inputs)],
    }
    return ImageKey(digest(record), record)


def canonical(record: Mapping[str, Any]) -> bytes:
    """One byte string per record: sorted keys, no whitespace, ASCII only."""
    return json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def digest(record: Mapping[str, Any]) -> str:
    return hashlib.sha256(canonical(record)).hexdigest()


def pinned(ref: str, where: str) -> str:
    """``ref`` as ``repo@sha256:<hex>``; a tag-only (or malformed) reference is an error."""
    m = PINNED_IMAGE.match(ref)
    if not m:
        raise InputError(
            f"{where}: image {ref!r} is not pinned; write it as repo@sha256:<digest> "
            "(a tag can move, so the key could not describe what is pulled)"
        )
    return f"{m.group('repo')}@sha256:{m.group('hex')}"


def platform_args(platform: str) -> dict[str, str | None]:
    """BuildKit's automatic TARGET* args for ``platform`` (``os/arch[/variant]``)."""
    parts = platform.split("/")
    if len(parts) not in (2, 3) or not all(parts):
        raise InputError(f"platform must be os/arch[/variant], got {platform!r}")
    return {
        "TARGETPLATFORM": platform,
        "TARGETOS": parts[0],
        "TARGETARCH": parts[1],
        "TARGETVARIANT": parts[2] if len(parts) == 3 else "",
    }


@dataclass
class _Walker:
    """One pass over the instructions, tracking ARG/ENV scopes and collecting inputs."""

    df: dfp.Dockerfile
    ctx: Path
    given: dict[str, str]
    platform: str
    args: list[dict[str, Any]] = field(default_factory=list)
    parents: list[str] = field(default_factory=list)
    images: list[str] = field(default_factory=list)
    remote: list[dict[str, str]] = field(default_factory=list)
    inputs: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)
    stage_names: set[str] = field(default_factory=set)

    def run(self) -> None:
        self.ignore = dockerignore.load(self.df.path, self.ctx)
        self.global_env: dict[str, str | None] = dict(platform_args(self.platform))
        self.env: dict[str, str | None] | None = None  # None until the first FROM
        self.consumed: set[str] = set()
        handlers = {"ARG": self._arg, "ENV": self._env, "FROM": self._from}
        handlers |= {"COPY": self._copy, "ADD": self._copy, "RUN": self._run}
        for ins in self.df.instructions:
            if ins.keyword != "FROM" and ins.keyword != "ARG" and self.env is None:
                raise DockerfileError(f"{self.df.path}:{ins.line}: {ins.keyword} before FROM")
            handler = handlers.get(ins.keyword)
            if handler is not None:
                handler(ins)
        if not self.parents:
            raise DockerfileError(f"{self.df.path}: no FROM instruction")
        unused = sorted(set(self.given) - self.consumed - TRANSPORT_ARGS)
        if unused:
            raise InputError(
                f"build args {unused} are not declared by any ARG in {self.df.path}; "
                "an undeclared arg would be ignored by the builder"
            )

    # --- instructions ----------------------------------------------------------------------

    def _arg(self, ins: dfp.Instruction) -> None:
        scope_env = self.global_env if self.env is None else self.env
        scope = "global" if self.env is None else f"stage {len(self.parents) - 1}"
        for w in dfp.raw_words(ins.rest, escape=self.df.escape):
            name, eq, raw_default = w.partition("=")
            if name.startswith(("BUILDPLATFORM", "BUILDOS", "BUILDARCH", "BUILDVARIANT")):
                raise InputError(
                    f"{self._where(ins)}: ARG {name} depends on the machine that builds, which "
                    "the key cannot know; use TARGET* args with --platform"
                )
            if name in self.given:
                value: str | None = self.given[name]
                self.consumed.add(name)
            elif eq:
                value = dfp.word(raw_default, scope_env, escape=self.df.escape)
            elif name in self.global_env and self.env is not None:
                value = self.global_env[name]  # `ARG NAME` in a stage inherits the global value
            else:
                value = None
            scope_env[name] = value
            if name not in _AUTOMATIC or name in self.given:  # automatic: from the platform
                self.args.append({"scope": scope, "name": name, "value": value})

    def _env(self, ins: dfp.Instruction) -> None:
        assert self.env is not None
        raw = dfp.raw_words(ins.rest, escape=self.df.escape)
        if raw and "=" not in raw[0]:  # legacy `ENV NAME value with spaces`
            name = raw[0]
            rest = ins.rest.strip()[len(name) :].strip()
            self.env[name] = dfp.word(rest, self.env, escape=self.df.escape)
            return
        for w in raw:
            name, _, value = w.partition("=")
            self.env[name] = dfp.word(value, self.env, escape=self.df.escape)

    def _from(self, ins: dfp.Instruction) -> None:
        ws = dfp.words(ins.rest, self.global_env, escape=self.df.escape, strict=True)
        if len(ws) not in (1, 3) or (len(ws) == 3 and ws[1].lower() != "as"):
            raise DockerfileError(f"{self._where(ins)}: expected FROM image [AS name]")
        image = ws[0]
        if image.lower() in self.stage_names:
            self.parents.append(f"stage:{image.lower()}")
        elif image == "scratch":
            self.parents.append("scratch")
        else:
            self.parents.append(pinned(image, self._where(ins)))
        if len(ws) == 3:
            self.stage_names.add(ws[2].lower())
        self.env = {}

    def _copy(self, ins: dfp.Instruction) -> None:
        assert self.env is not None
        source_image = ins.flag("from")
        if source_image is not None:
            source_image = dfp.word(source_image, self.env, escape=self.df.escape, strict=True)
            if not self._is_stage(source_image):
                self.images.append(pinned(source_image, self._where(ins)))
            return  # files come from an image or stage, not from the context
        if ins.exec_form is not None:
            sources = [
                dfp.expand(s, self.env, escape=self.df.escape, strict=True)
                for s in ins.exec_form[:-1]
            ]
        else:
            raw = dfp.raw_words(ins.rest, escape=self.df.escape)
            sources = [dfp.word(w, self.env, escape=self.df.escape, strict=True) for w in raw[:-1]]
        if not sources:
            raise DockerfileError(
                f"{self._where(ins)}: needs at least one source and a destination"
            )
        for src in sources:
            if "://" in src or src.startswith("git@"):
                self._remote(ins, src)
            else:
                self._context_source(ins, src)

    def _run(self, ins: dfp.Instruction) -> None:
        assert self.env is not None
        for mount in ins.flag_values("mount"):
            opts = dict(
                (kv.partition("=")[0], kv.partition("=")[2]) for kv in mount.split(",") if kv
            )
            if opts.get("type", "bind") != "bind":
                continue  # cache/tmpfs/secret/ssh: no build input (secrets: see docs)
            source_image = opts.get("from")
            if source_image:
                if not self._is_stage(source_image):
                    self.images.append(pinned(source_image, self._where(ins)))
                continue
            self._context_source(ins, opts.get("source", opts.get("src", ".")))

    # --- inputs ----------------------------------------------------------------------------

    def _remote(self, ins: dfp.Instruction, url: str) -> None:
        if ins.keyword != "ADD":
            raise DockerfileError(f"{self._where(ins)}: COPY cannot fetch {url!r}")
        checksum = ins.flag("checksum")
        if url.startswith("git@") or url.split("#")[0].endswith(".git"):
            if not _COMMIT_URL.search(url):
                raise InputError(
                    f"{self._where(ins)}: ADD {url!r} fetches a git ref that can move; "
                    "pin it as <url>#<40-hex commit>"
                )
            self.remote.append({"url": url, "checksum": ""})
        elif checksum and checksum.startswith("sha256:"):
            self.remote.append({"url": url, "checksum": checksum})
        else:
            raise InputError(
                f"{self._where(ins)}: ADD {url!r} has no --checksum=sha256:<hex>; "
                "the key cannot know what it downloads"
            )

    def _context_source(self, ins: dfp.Instruction, src: str) -> None:
        rel = os.path.normpath(src.lstrip("/") or ".")
        rel = "." if rel in ("", ".") else rel.replace(os.sep, "/")
        if rel == ".." or rel.startswith("../"):
            raise InputError(f"{self._where(ins)}: source {src!r} is outside the build context")
        matches = self._glob(rel) if dockerignore.has_magic(rel) else [rel]
        if not matches:
            raise InputError(f"{self._where(ins)}: source {src!r} matches no file in {self.ctx}")
        for m in matches:
            path = self.ctx / m if m != "." else self.ctx
            if not os.path.lexists(path):
                raise InputError(
                    f"{self._where(ins)}: source {src!r} does not exist in the context {self.ctx}"
                )
            if m != "." and self.ignore.excluded(m):
                raise InputError(
                    f"{self._where(ins)}: source {src!r} is excluded by {self.ignore.source}; "
                    "the builder would not send it"
                )
            self._add_tree(path, top=True)

    def _glob(self, pattern: str) -> list[str]:
        found = ["."]
        for part in pattern.split("/"):
            regex = dockerignore.compile_pattern(part, double_star=False)
            nxt = []
            for base in found:
                d = self.ctx / base
                if not d.is_dir():
                    continue
                for name in sorted(e.name for e in d.iterdir()):
                    if regex.match(name):
                        rel = name if base == "." else f"{base}/{name}"
                        if not self.ignore.excluded(rel):
                            nxt.append(rel)
            found = nxt
        return found

    def _add_tree(self, path: Path, *, top: bool) -> None:
        if path.is_symlink() and top:
            resolved = path.resolve()
            if not resolved.is_relative_to(self.ctx):
                raise InputError(f"source {path} is a symlink that leaves the build context")
            path = resolved
        if not path.is_dir() or path.is_symlink():
            self.add_file(path)
            return
        for entry in self._walk(path):
            self.add_file(entry)

    def _walk(self, top: Path) -> Iterator[Path]:
        prune = not self.ignore.has_exceptions()
        for root, dirs, files in os.walk(top):
            kept = []
            for d in sorted(dirs):
                rel = self._rel(Path(root) / d)
                if self.ignore.excluded(rel) and prune:
                    continue
                kept.append(d)
                if not self.ignore.excluded(rel):
                    yield Path(root) / d
            dirs[:] = kept
            for f in sorted(files):
                p = Path(root) / f
                if not self.ignore.excluded(self._rel(p)):
                    yield p

    def add_file(self, path: Path) -> None:
        rel = self._rel(path)
        st = path.lstat()
        entry = {"path": rel, "mode": f"{stat.S_IMODE(st.st_mode):04o}"}
        if stat.S_ISLNK(st.st_mode):
            entry |= {"type": "symlink", "target": str(path.readlink())}
            entry.pop("mode")  # link permissions mean nothing on Linux
        elif stat.S_ISDIR(st.st_mode):
            entry["type"] = "dir"
        elif stat.S_ISREG(st.st_mode):
            entry |= {"type": "file", "sha256": _sha256(path)}
        else:
            raise InputError(f"{rel}: not a regular file, directory or symlink")
        self.inputs[(rel, entry["type"])] = entry

    # --- helpers ---------------------------------------------------------------------------

    def _rel(self, path: Path) -> str:
        return path.relative_to(self.ctx).as_posix() if path != self.ctx else "."

    def _is_stage(self, name: str) -> bool:
        return name.lower() in self.stage_names or (
            name.isdigit() and int(name) < len(self.parents)
        )

    def _where(self, ins: dfp.Instruction) -> str:
        return f"{self.df.path.name}:{ins.line} ({ins.keyword})"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
