"""``python -m plugin_api.fuzz --backend ID``: fuzz every public op with bad inputs.

Exits 0 when every example was accepted or cleanly refused; 1 on any crash, hang, write on a
rejected call, out-of-bounds write, harness error, or (unless ``--allow-unclean``) unclean
error; 2 when the fuzzer cannot run. See docs/fuzzing.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from .strategies import KINDS


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m plugin_api.fuzz",
        description="Fuzz a backend's public ops with bad inputs, each example in a worker "
        "process; report crashes, writes on rejected calls and unclean errors.",
    )
    p.add_argument("--backend", required=True, help="backend id (as PLUGIN_API_BACKEND)")
    p.add_argument(
        "--ops",
        default=",".join(KINDS),
        help=f"comma-separated ops to fuzz (default: all: {','.join(KINDS)})",
    )
    p.add_argument("--examples", type=int, default=200, help="examples to try (default 200)")
    p.add_argument("--seconds", type=float, default=None, help="stop after this long")
    p.add_argument("--seed", type=int, default=0, help="hypothesis seed (default 0)")
    p.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    p.add_argument(
        "--timeout", type=float, default=60.0, help="seconds one example may take (default 60)"
    )
    p.add_argument(
        "--allow-unclean", action="store_true", help="report unclean errors without failing"
    )
    p.add_argument(
        "--replay",
        metavar="CASE",
        help="run one case again: a finding's JSON, or a file holding it",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        from .harness import FuzzError, fuzz, replay
    except ImportError as e:  # hypothesis is a test dependency
        print(f"plugin_api.fuzz needs hypothesis: pip install 'plugin-api[test]' ({e})")
        return 2
    try:
        if args.replay:
            text = args.replay
            if not text.lstrip().startswith("{"):
                text = Path(text).read_text()
            report = replay(args.backend, json.loads(text), args.timeout)
        else:
            if args.examples < 1 or args.jobs < 1:
                raise FuzzError("--examples and --jobs must be at least 1")
            report = fuzz(
                args.backend,
                ops=[o for o in args.ops.split(",") if o],
                examples=args.examples,
                seconds=args.seconds,
                seed=args.seed,
                jobs=args.jobs,
                timeout=args.timeout,
                allow_unclean=args.allow_unclean,
            )
    except FuzzError as e:
        if args.json:
            print(json.dumps({"ok": False, "error": str(e)}, indent=2))
        else:
            print(f"error: {e}", file=sys.stderr)
        return 2
    report.allow_unclean = args.allow_unclean
    print(json.dumps(report.to_dict(), indent=2) if args.json else report.text())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
