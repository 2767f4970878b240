"""``python -m ci.pins check [--json] [--registry URL] [--strict] [paths...]``.

Reads every pins block in ``paths`` (Markdown files or directories; default: ``docs/`` and
``README.md`` of this repository) and looks each pinned image's tag up in its registry.

Exit codes, one per outcome class; when pins fall in several, the first that applies wins, in
this order: 1 invalid pins (or no pinned image at all: a check of nothing is not a pass),
3 registry error (unknown: retry later, never read it as current), 11 missing (a tag is gone),
10 stale (a tag moved: update the digest), 12 a placeholder under ``--strict``, 0 every pin
current (placeholders allowed). 2 is a usage error. ``--json`` has every pin's verdict.
Environment: ``CI_IMAGES_REGISTRY_AUTH=user:password`` for the registry, as for ``ci.images``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from ci.docblocks import doc_files
from ci.images.cli import registry_credentials
from ci.images.registry import Registry

from .freshness import Result, Status, check_all, invalid
from .pinned import markdown_files, read

ROOT = Path(__file__).resolve().parents[2]
INVALID_EXIT, USAGE_EXIT, ERROR_EXIT = 1, 2, 3
STALE_EXIT, MISSING_EXIT, STRICT_PLACEHOLDER_EXIT = 10, 11, 12
# (status, exit code), most urgent first: the first status present decides the exit code.
PRECEDENCE = (
    (Status.INVALID, INVALID_EXIT),
    (Status.ERROR, ERROR_EXIT),
    (Status.MISSING, MISSING_EXIT),
    (Status.STALE, STALE_EXIT),
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    paths = [Path(p) for p in args.paths]
    for p in paths:
        if not p.exists():
            parser.error(f"{p} does not exist")
    try:
        credentials = registry_credentials()
    except ValueError as e:
        parser.error(str(e))
    files = markdown_files(paths) if paths else doc_files(ROOT)
    images, findings = read(files)

    def client(url: str) -> Registry:
        return Registry(url, timeout=args.timeout, retries=args.retries, credentials=credentials)

    results = [invalid(f) for f in findings]
    results += check_all(images, args.registry, client)
    if not results:
        what = " ".join(map(str, paths)) or "docs/ and README.md"
        results = [Result(Status.INVALID, what, 0, "", "", None, None, None, "no pinned image")]
    code = exit_code(results, strict=args.strict)
    if args.json:
        counts = Counter(r.status.value for r in results)
        data = {
            "results": [r.to_dict() for r in results],
            "counts": dict(sorted(counts.items())),
            "strict": args.strict,
            "exit_code": code,
        }
        print(json.dumps(data, indent=2))
    else:
        for r in results:
            print(text(r))
        counts = Counter(r.status.value for r in results)
        summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
        print(f"{len(results)} pin(s): {summary}; exit {code}", file=sys.stderr)
    return code


def exit_code(results: Sequence[Result], *, strict: bool) -> int:
    present = {r.status for r in results}
    for status, code in PRECEDENCE:
        if status in present:
            return code
    if strict and Status.PLACEHOLDER in present:
        return STRICT_PLACEHOLDER_EXIT
    return 0


def text(r: Result) -> str:
    head = " ".join(x for x in (f"{r.status:<14}", f"{r.doc}:{r.line}", r.name, r.ref) if x)
    if r.status is Status.STALE:
        return f"{head}: pinned {r.pinned}, tag now {r.tag_digest}; {r.detail}"
    return f"{head}: {r.detail}"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ci.pins", description=__doc__.split("\n")[0])
    verbs = p.add_subparsers(dest="verb", required=True)
    c = verbs.add_parser(
        "check",
        help="compare pinned image digests with their tags in the registry",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    c.add_argument("paths", nargs="*", metavar="PATH", help="Markdown files or directories")
    c.add_argument("--json", action="store_true", help="machine-readable output")
    c.add_argument(
        "--registry",
        metavar="URL",
        help="ask this registry (http(s)://host[:port]) instead of the host each repo names",
    )
    c.add_argument("--strict", action="store_true", help="a placeholder digest fails (exit 12)")
    c.add_argument("--timeout", type=float, default=10.0, help="seconds per request")
    c.add_argument("--retries", type=int, default=3, help="retries after transient errors")
    return p
