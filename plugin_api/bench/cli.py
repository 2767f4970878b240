"""The ``plugin-api bench`` verb and ``plugin-api doctor --bench``."""

from __future__ import annotations

import argparse
import fnmatch
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from ..backend import Backend
from .cases import FAMILIES, Case, Family, select
from .report import run_dict, summary_lines, table_text
from .run import run_bench


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--op", choices=FAMILIES, action="append", help="only this op family (repeatable)"
    )
    p.add_argument("--backend", metavar="ID", help="benchmark this backend (default: selected)")
    p.add_argument(
        "--quick",
        action="store_true",
        help="a few cases per family and shorter sampling (the output says what is trimmed)",
    )
    p.add_argument("--json", dest="json_path", metavar="PATH", help="write every number here")
    p.add_argument("--plot", dest="plot_path", metavar="PATH", help="write a roofline PNG here")
    p.add_argument(
        "--case",
        dest="case_globs",
        action="append",
        metavar="GLOB",
        help="only cases whose '<family> <name>' matches this shell pattern, e.g. "
        "'gemm lm_head *N=128256*' (repeatable; an error when nothing matches)",
    )
    p.add_argument(
        "--hot",
        action="store_true",
        help="measure every case with warm caches (default: cold for memory-bound cases)",
    )


def command_line() -> str:
    return shlex.join(["plugin-api", *sys.argv[1:]])


def matching_cases(families: tuple[Family, ...], quick: bool, globs: list[str]) -> tuple[Case, ...]:
    """The named cases of ``families`` (the quick set with ``quick``) whose ``"<family> <name>"``
    matches any of ``globs``; a pattern that matches nothing is an error, not an empty run."""
    pool = select(families, quick)
    hits = [c for c in pool if any(fnmatch.fnmatchcase(f"{c.family} {c.name}", g) for g in globs)]
    for g in globs:
        if not any(fnmatch.fnmatchcase(f"{c.family} {c.name}", g) for c in hits):
            raise ValueError(
                f"bench: --case {g!r} matches none of the {len(pool)} cases of "
                f"{', '.join(families)}{' (--quick)' if quick else ''}; names look like "
                f"{pool[0].family + ' ' + pool[0].name!r}"
            )
    return tuple(hits)


def cmd_bench(args: argparse.Namespace, backend: Backend) -> int:
    families: tuple[Family, ...] = tuple(dict.fromkeys(args.op)) if args.op else FAMILIES
    for path in (args.json_path, args.plot_path):
        if path and not Path(path).parent.exists():
            raise ValueError(f"bench: the folder of {path!r} does not exist")
    cases = matching_cases(families, args.quick, args.case_globs) if args.case_globs else None
    run = run_bench(
        backend, families, quick=args.quick, hot=args.hot, cases=cases, command=command_line()
    )
    data = run_dict(run)
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(data, indent=2) + "\n")
    if args.plot_path:
        from .plot import write_roofline

        write_roofline(data, args.plot_path)
    print(table_text(data))
    bad = [d["name"] for d in data["cases"] if d["status"] == "error"]
    print(
        f"\n{len(data['cases'])} cases in {run.wall_s:.0f} s" + (f"; errors: {bad}" if bad else "")
    )
    return 1 if bad else 0


def doctor_bench(backend: Backend) -> tuple[dict[str, Any], list[str]]:
    """The quick set on ``backend``, for ``plugin-api doctor --bench``: (JSON, summary lines)."""
    data = run_dict(run_bench(backend, FAMILIES, quick=True, command=command_line()))
    lines = summary_lines(data)
    lines.append("  (the full table: plugin-api bench --quick; method: docs/benchmarks.md)")
    return data, lines
