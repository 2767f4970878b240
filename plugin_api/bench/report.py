"""What a run prints and saves: progress lines, the terminal table, the JSON document, and the
few-line summary of ``plugin-api doctor --bench``. Text is made from the JSON document, so the
two always agree."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import asdict
from typing import Any

from . import lm_head_argmax, plan_cost, state_manager
from .cases import ALL, FAMILIES, QUICK, Family
from .ceilings import Ceilings
from .harness import Stats
from .results import BenchRun, CaseResult

SCHEMA = 1


def fmt_time(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} us"


def stats_dict(s: Stats) -> dict[str, float | int]:
    return {**asdict(s), "spread": s.spread}


def quick_trims(families: tuple[Family, ...] = FAMILIES) -> str:
    picked = sum(len(QUICK[f]) for f in families)
    total = sum(len(ALL[f]) for f in families)
    return (
        f"--quick runs {picked} of the {total} named cases (a few per family, see "
        "plugin_api/bench/cases.py QUICK), ~0.2 s of samples per callable (at least 3, at "
        "most 30, stopping after 3 s), no extra warm-up beyond the first call, and matmul "
        "ceiling sizes that stop growing once a call takes 0.1 s (1 s in the full run)"
    )


def case_dict(r: CaseResult, ceilings: Ceilings) -> dict[str, Any]:
    c = r.case
    nbytes, flops = c.nbytes(), c.flops()
    d: dict[str, Any] = {
        "family": c.family,
        "name": c.name,
        "params": c.params(),
        "status": r.status,
        "bytes": nbytes,
        "flops": flops,
        "intensity": flops / nbytes,
        "bound": r.bound,
        "ceiling": "bandwidth" if r.bound == "memory" else "matmul",
        "mode": r.mode,
        "wall_s": r.wall_s,
    }
    if r.message:
        d["message"] = r.message
    if r.stats is None:
        return d
    t = r.stats.median
    d["provenance"] = [
        {"impl": p.impl, "path": str(p.path), "backend": p.backend, "fallback": p.fallback}
        for p in r.provenance
    ]
    if r.kernels:
        d["kernels"] = list(r.kernels)
    d["time_s"] = stats_dict(r.stats)
    d["bytes_per_s"] = nbytes / t
    d["flops_per_s"] = flops / t
    d["fraction_of_ceiling"] = ceilings.fraction(flops, nbytes, t, r.bound)
    d["baselines"] = {}
    for b in r.baselines:
        entry: dict[str, Any] = {"description": b.description}
        if b.stats is None:
            entry["error"] = b.error
        else:
            entry["time_s"] = stats_dict(b.stats)
            entry["speedup"] = b.stats.median / t  # above 1: the backend is faster
        d["baselines"][b.name] = entry
    return d


def run_dict(run: BenchRun) -> dict[str, Any]:
    c = run.ceilings
    families = tuple(dict.fromkeys(r.case.family for r in run.results))
    return {
        "schema": SCHEMA,
        "command": run.command,
        "started": run.started,
        "wall_s": run.wall_s,
        "backend": run.backend,
        "device": run.device,
        "machine": run.machine,
        "method": {
            **asdict(run.method),
            "quick": run.quick,
            "quick_trims": quick_trims(families) if run.quick else None,
            "caches": (
                "hot: every case"
                if run.hot
                else "cold for memory-bound cases (eviction before each sample), hot for "
                "compute-bound ones"
            ),
        },
        "eviction": {
            "llc_bytes": run.llc.bytes,
            "llc_source": run.llc.source,
            "buffer_bytes": run.eviction_bytes,
        },
        "ceilings": {
            "bandwidth_bytes_per_s": c.bandwidth,
            "peak_flops_per_s": c.peak_flops,
            "ridge_flops_per_byte": c.ridge,
            "copy": {
                "method": "dst.copy_(src), preallocated; bytes = 2 x buffer (read + write); "
                "before the cases and again after them, the best is the ceiling",
                "bytes": c.copy_bytes,
                "time_s": stats_dict(c.copy_stats) if c.copy_stats else None,
                "rates_bytes_per_s": list(c.copy_rates_seen),
                "drift": c.copy_drift,
            },
            "matmul": [
                {
                    "dtype": p.dtype,
                    "size": p.size,
                    "flops_per_s": p.rate,
                    "time_s": stats_dict(p.stats),
                }
                for p in c.matmul
            ],
        },
        "cases": [case_dict(r, c) for r in run.results],
        "state_manager": run.state_manager.to_dict() if run.state_manager else None,
        "lm_head_argmax": run.lm_head_argmax.to_dict() if run.lm_head_argmax else None,
        "attention_plan": [p.to_dict() for p in run.attention_plan],
    }


def _ratios(d: dict[str, Any]) -> str:
    parts = []
    for name, b in d.get("baselines", {}).items():
        parts.append(f"{name} x{b['speedup']:.2f}" if "speedup" in b else f"{name} failed")
    return "  ".join(parts)


def _impl(d: dict[str, Any]) -> str:
    names = [p["impl"] + (" (fallback)" if p["fallback"] else "") for p in d["provenance"]]
    kernels = f" [{','.join(d['kernels'])}]" if d.get("kernels") else ""
    return (",".join(names) or "?") + kernels


def progress_line(r: CaseResult, ceilings: Ceilings) -> str:
    d = case_dict(r, ceilings)
    if d["status"] != "ok":
        return f"{d['status']}: {d.get('message', '')}"
    t = d["time_s"]
    line = (
        f"{fmt_time(t['median'])} {d['mode']} (n={t['n']}, {_impl(d)})  "
        f"{d['bytes_per_s'] / 1e9:.2f} GB/s  {d['flops_per_s'] / 1e9:.2f} GFLOP/s  "
        f"{100 * d['fraction_of_ceiling']:.0f}% of {d['ceiling']}"
    )
    ratios = _ratios(d)
    return line + (f"  vs {ratios}" if ratios else "") + f"  [{d['wall_s']:.1f} s]"


def header_lines(data: dict[str, Any]) -> list[str]:
    m, c, ev = data["machine"], data["ceilings"], data["eviction"]
    best = max(c["matmul"], key=lambda p: p["flops_per_s"])
    lines = [
        f"plugin-api bench: backend {data['backend']} on {data['device']}"
        + (f" ({m['gpu']})" if m.get("gpu") else ""),
        f"machine: {m['cpu_model']} ({m['arch']}, {m['cpu_count']} cpus, "
        f"{' '.join(f for f in m['isa_flags'] if f.startswith(('avx', 'amx', 'sve')))}), "
        f"torch {m['torch']}, {m['threads']} threads",
        f"ceilings: copy {c['bandwidth_bytes_per_s'] / 1e9:.2f} GB/s{_copy_rates(c['copy'])}, "
        f"matmul {c['peak_flops_per_s'] / 1e9:.2f} GFLOP/s ({best['dtype']} n={best['size']}), "
        f"ridge {c['ridge_flops_per_byte']:.2f} FLOP/B",
        f"caches: {data['method']['caches']}; LLC {ev['llc_bytes'] >> 20} MiB "
        f"({ev['llc_source']}), eviction buffer {ev['buffer_bytes'] >> 20} MiB",
    ]
    drift = c["copy"].get("drift", 0.0)
    if drift > DRIFT_WARNING:
        lines.append(
            f"note: the copy bandwidth moved by {100 * drift:.0f}% between the start and the end "
            "of this run (a busy or shared machine): figures from it are that uncertain"
        )
    if data["method"]["quick"]:
        lines.append(data["method"]["quick_trims"])
    return lines


# Above this, the header says the machine's bandwidth moved during the run.
DRIFT_WARNING = 0.10


def _copy_rates(copy: dict[str, Any]) -> str:
    rates = copy.get("rates_bytes_per_s") or []
    if len(rates) < 2:
        return ""
    return " (best of " + ", ".join(f"{r / 1e9:.2f}" for r in rates) + ": start, end)"


COLUMNS = ("case", "impl", "mode", "median", "p10..p90", "GB/s", "GFLOP/s", "bound", "ceil%")


def table_text(data: dict[str, Any]) -> str:
    rows = []
    for d in data["cases"]:
        name = f"{d['family']:<9} {d['name']}"
        if d["status"] != "ok":
            rows.append((name, d["status"], "", "", "", "", "", d["bound"], "", d.get("message")))
            continue
        t = d["time_s"]
        rows.append(
            (
                name,
                _impl(d),
                d["mode"],
                fmt_time(t["median"]),
                f"{fmt_time(t['p10'])}..{fmt_time(t['p90'])}",
                f"{d['bytes_per_s'] / 1e9:.2f}",
                f"{d['flops_per_s'] / 1e9:.2f}",
                d["bound"],
                f"{100 * d['fraction_of_ceiling']:.0f}%",
                _ratios(d),
            )
        )
    head = (*COLUMNS, "vs baselines (t_baseline / t_backend)")
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(COLUMNS))]
    right = {3, 4, 5, 6, 8}

    def line(r: tuple[Any, ...]) -> str:
        cells = [
            str(v).rjust(widths[i]) if i in right else str(v).ljust(widths[i])
            for i, v in enumerate(r[: len(COLUMNS)])
        ]
        return "  ".join(cells) + "  " + str(r[-1] or "")

    extra = state_manager.lines(data["state_manager"]) if data.get("state_manager") else []
    if data.get("lm_head_argmax"):
        extra += lm_head_argmax.lines(data["lm_head_argmax"])
    extra += plan_cost.lines(data.get("attention_plan") or [])
    return "\n".join([*header_lines(data), "", line(head), *map(line, rows), *extra])


def _geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def summary_lines(data: dict[str, Any]) -> list[str]:
    """A few lines for ``plugin-api doctor --bench``: per family, the share of the ceiling and
    the geometric-mean ratio to each baseline."""
    c = data["ceilings"]
    lines = [
        f"bench ({'quick' if data['method']['quick'] else 'full'}, {data['backend']} on "
        f"{data['device']}, {data['machine']['threads']} threads): copy "
        f"{c['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s, matmul {c['peak_flops_per_s'] / 1e9:.1f} "
        f"GFLOP/s"
    ]
    by_family: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for d in data["cases"]:
        by_family[d["family"]].append(d)
    for family, cases in by_family.items():
        ok = [d for d in cases if d["status"] == "ok"]
        text = f"  {family:<10} {len(ok)}/{len(cases)} ok"
        if ok:
            fr = sorted(100 * d["fraction_of_ceiling"] for d in ok)
            span = f"{fr[0]:.0f}%" if len(fr) == 1 else f"{fr[0]:.0f}%..{fr[-1]:.0f}%"
            text += f", {span} of ceiling"
            ratios: dict[str, list[float]] = defaultdict(list)
            for d in ok:
                for name, b in d["baselines"].items():
                    if "speedup" in b:
                        ratios[name].append(b["speedup"])
            if ratios:
                text += ", vs " + ", ".join(f"{n} x{_geomean(v):.2f}" for n, v in ratios.items())
            fallbacks = sum(any(p["fallback"] for p in d["provenance"]) for d in ok)
            if fallbacks:
                text += f", {fallbacks} via fallback"
        lines.append(text)
    if data.get("state_manager"):
        lines.extend("  " + ln for ln in state_manager.lines(data["state_manager"]))
    if data.get("lm_head_argmax"):
        lines.extend("  " + ln for ln in lm_head_argmax.lines(data["lm_head_argmax"]))
    return lines
