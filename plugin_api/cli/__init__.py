"""``plugin-api``: list plugins, explain the selection (doctor). Every verb has ``--json``."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from ..backend import Backend
from ..bench.cli import add_arguments as add_bench_arguments
from ..errors import PluginApiError, SelectionError
from ..machines import MACHINES, machine
from ..registry import Registry, load_plugins
from ..selection import LoadedSelection, select
from ..settings import check_names, read_settings
from .doctor import (
    error_dict,
    host_dict,
    list_text,
    record_dict,
    selection_dict,
    selection_text,
)
from .op_report import ops_report, ops_text
from .version import version_report, version_text
from .warm_up import add_arguments as add_warm_up_arguments
from .warm_up import cmd_warm_up


def _load(args: argparse.Namespace) -> Registry:
    settings = read_settings()
    info = machine(args.device_info) if args.device_info else None
    registry = load_plugins(settings, info)
    check_names(os.environ, registry.known_settings)
    return registry


def _emit(args: argparse.Namespace, data: dict[str, Any], text: str) -> None:
    if args.json:
        print(json.dumps(data, indent=2, sort_keys=False))
    else:
        print(text)


def cmd_list(args: argparse.Namespace) -> int:
    registry = _load(args)
    data = {
        "host": host_dict(),
        "plugins": [record_dict(r, tracebacks=args.verbose) for r in registry.records],
    }
    _emit(args, data, list_text(registry.records, registry.info, verbose=args.verbose))
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    if args.bench and args.device_info:
        raise ValueError("doctor: --bench measures this machine; drop --device-info")
    registry = _load(args)
    settings = read_settings()
    data: dict[str, Any] = {
        "host": host_dict(),
        "what_if": bool(args.device_info),
        "device_info": registry.info.to_dict(),
        "plugins": [record_dict(r) for r in registry.records],
    }
    text = [list_text(registry.records, registry.info, verbose=args.verbose), ""]
    if not args.device_info:  # what is installed here, not a property of the what-if machine
        from ..integrations import integrations, integrations_text

        data["integrations"] = integrations()
        text += [integrations_text(data["integrations"]), ""]
    try:
        sel = select(registry.records, settings, registry.info)
    except SelectionError as e:
        data["error"] = error_dict(e)
        text.append(f"error: {e}")
        _emit(args, data, "\n".join(text))
        return 1
    data["selection"] = selection_dict(sel)
    text.append(selection_text(sel))
    # the same rule as Attention's: strict, or the setting, makes plan() check slot_mapping
    data["selection"]["checks_slot_mapping"] = checks = (
        settings.strict or settings.check_slot_mapping
    )
    text.append(
        "batch check: attention.plan checks slot_mapping against block_table and seq_lens"
        if checks
        else "batch check: slot_mapping not checked against block_table "
        "(PLUGIN_API_CHECK_SLOT_MAPPING=1 or PLUGIN_API_STRICT=1 turns it on)"
    )
    backend = Backend(LoadedSelection(sel, registry, settings))
    ops = ops_report(backend)
    data["ops"] = ops
    text += ["", ops_text(backend, ops)]
    if sel.device_type == "cpu" and not args.device_info:  # a fact of this machine's kernel
        from ..ops.huge_pages import kv_cache_pages, thp_mode

        pages = kv_cache_pages(thp_mode())
        data["kv_cache_pages"] = pages
        text += [
            "",
            f"KV cache pages: {'huge' if pages['huge_pages'] else '4 KB'} ({pages['reason']})",
        ]
    if args.bench:
        from ..bench.cli import doctor_bench

        data["bench"], lines = doctor_bench(backend)
        text += ["", *lines]
    _emit(args, data, "\n".join(text))
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    """Exit codes as ``pytest --plugin-api-backend=ID``: 0 passed, 1 a case failed,
    ``BACKEND_UNUSABLE`` (4) the backend cannot be checked here, else pytest's own code."""
    from ..backend import process_backend
    from ..conformance.plugin import BACKEND_UNUSABLE, kit_backend
    from .check import results_dict, results_text, run_kit

    try:
        named = args.backend or read_settings().backend  # --backend, else PLUGIN_API_BACKEND
        backend = kit_backend(named) if named else process_backend()
    except PluginApiError as e:  # KitBackendUnusable, or no backend to select automatically
        message = (str(e).splitlines() or [type(e).__name__])[0]
        if args.json:
            error = {"type": type(e).__name__, "message": message}
            print(json.dumps({"error": error, "exit_code": BACKEND_UNUSABLE}, indent=2))
        else:
            print(f"plugin-api check: error: {message}", file=sys.stderr)
        return BACKEND_UNUSABLE
    code, results = run_kit(backend.id, progress=not args.json, seed=args.seed, cases=args.cases)
    data = results_dict(backend.id, code, results, args.cases)
    data["ops"] = ops_report(backend)
    _emit(args, data, results_text(data))
    return code


def _kit_expression(text: str) -> str:
    """``check -k``: a blank expression would select every case while the report calls the run
    a subset."""
    if not text.strip():
        raise argparse.ArgumentTypeError(
            "an empty expression selects every case; leave -k out to run the whole kit"
        )
    return text


def cmd_version(args: argparse.Namespace) -> int:
    data = version_report(read_settings())
    _emit(args, data, version_text(data))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from ..backend import backend_for, process_backend
    from ..bench.cli import cmd_bench as run

    return run(args, backend_for(args.backend) if args.backend else process_backend())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="plugin-api", description="Hardware backends for LLM inference ops."
    )
    parser.add_argument(
        "--version",
        action="store_true",
        help="print the host's version and API version and every installed plugin's and "
        "integration's version, then exit",
    )
    parser.add_argument(
        "--json", dest="version_json", action="store_true", help="with --version: as JSON"
    )
    sub = parser.add_subparsers(dest="verb")  # required unless --version: main checks

    def verb(name: str, fn: Callable[[argparse.Namespace], int], help: str) -> Any:
        p = sub.add_parser(name, help=help, description=help)
        p.add_argument("--json", action="store_true", help="machine-readable output")
        p.add_argument("-v", "--verbose", action="store_true", help="show tracebacks")
        p.set_defaults(fn=fn)
        return p

    what_if = (
        "what-if: probe for the machine in FILE (DeviceInfo JSON) or a named example: "
        + ", ".join(MACHINES)
    )
    for name, fn, text in (
        ("list", cmd_list, "installed plugins with load, compatibility and probe results"),
        ("doctor", cmd_doctor, "the selection report: the chosen backend and why"),
    ):
        verb(name, fn, text).add_argument("--device-info", metavar="FILE", help=what_if)
    sub.choices["doctor"].add_argument(
        "--bench",
        action="store_true",
        help="also run the --quick benchmark on the chosen backend and summarise it",
    )
    check = verb("check", cmd_check, "run the conformance kit against the selected backend")
    check.add_argument(
        "--backend", metavar="ID", help="check this backend instead of the selected one"
    )
    check.add_argument(
        "--seed", metavar="N", type=int, help="seed of the sampled GEMM cases (repeats a run)"
    )
    check.add_argument(
        "-k",
        dest="cases",
        metavar="EXPR",
        type=_kit_expression,
        help="only the cases whose test names match EXPR, a pytest -k expression (e.g. "
        "'gemm or quant'); the report says it is a subset, and no match is a failure",
    )
    warm_help = "build or load the kernels the selected backend runs for a model's layers"
    add_warm_up_arguments(verb("warm-up", cmd_warm_up, warm_help))
    bench_help = "benchmark the ops against ceilings and baselines (docs/benchmarks.md)"
    bench = sub.add_parser("bench", help=bench_help, description=bench_help)
    bench.set_defaults(fn=cmd_bench)
    add_bench_arguments(bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.version != (args.verb is None) or (args.version_json and not args.version):
        parser.error("give a verb, or --version alone (plugin-api --version [--json])")
    if args.version:
        args.fn, args.verb, args.json = cmd_version, "--version", args.version_json
    try:
        return int(args.fn(args))
    except (PluginApiError, ValueError) as e:
        if getattr(args, "json", False):
            print(json.dumps({"error": {"type": type(e).__name__, "message": str(e)}}, indent=2))
        else:
            print(f"plugin-api {args.verb}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
