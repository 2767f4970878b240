"""``--plot``: a roofline PNG (left) and each case's share of its ceiling (right).

Needs matplotlib (``pip install 'plugin-api[bench]'``), imported only when a plot is asked for.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

COLORS = {"gemm": "tab:blue", "quant": "tab:orange", "attention": "tab:green", "state": "tab:red"}
MARKERS = {"gemm": "o", "quant": "s", "attention": "^", "state": "D"}


def write_roofline(data: dict[str, Any], path: str | Path) -> Path:
    try:
        import matplotlib
    except ImportError as e:
        raise ValueError(
            "--plot needs matplotlib: pip install 'plugin-api[bench]' (or pip install matplotlib)"
        ) from e
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    c = data["ceilings"]
    bw, peak, ridge = c["bandwidth_bytes_per_s"], c["peak_flops_per_s"], c["ridge_flops_per_byte"]
    ok = [d for d in data["cases"] if d["status"] == "ok"]
    height = max(6.0, 0.22 * len(ok) + 1.5)
    fig, (roof, bars) = plt.subplots(
        1, 2, figsize=(16, height), gridspec_kw={"width_ratios": [1.1, 1]}
    )

    with_flops = [d for d in ok if d["flops"] > 0]
    xs = [d["intensity"] for d in with_flops] + [ridge]
    lo, hi = min(xs) / 4, max(xs) * 4
    roof.loglog([lo, ridge, hi], [lo * bw / 1e9, peak / 1e9, peak / 1e9], "k-", lw=2)
    roof.annotate(f"copy {bw / 1e9:.1f} GB/s", (lo * 1.5, lo * 1.5 * bw / 1e9 * 0.4), fontsize=9)
    roof.annotate(f"matmul {peak / 1e9:.1f} GFLOP/s", (ridge * 1.2, peak / 1e9 * 1.12), fontsize=9)
    roof.axvline(ridge, color="grey", ls=":", lw=1)
    for family in COLORS:
        pts = [d for d in with_flops if d["family"] == family]
        if not pts:
            continue
        roof.scatter(
            [d["intensity"] for d in pts],
            [d["flops_per_s"] / 1e9 for d in pts],
            c=COLORS[family],
            marker=MARKERS[family],
            label=f"{family} ({data['backend']})",
            zorder=3,
        )
        base = [
            (d["intensity"], d["flops"] / b["time_s"]["median"] / 1e9)
            for d in pts
            for b in d["baselines"].values()
            if "time_s" in b
        ]
        if base:
            roof.scatter(
                *zip(*base, strict=True),
                facecolors="none",
                edgecolors=COLORS[family],
                marker=MARKERS[family],
                label=f"{family} baselines",
                zorder=2,
            )
    for i, d in enumerate(ok, 1):  # numbers match the bars on the right
        if d["flops"] > 0:
            xy = (d["intensity"], d["flops_per_s"] / 1e9)
            roof.annotate(str(i), xy, xytext=(4, 2), textcoords="offset points", fontsize=7)
    roof.set_xlabel("arithmetic intensity (FLOP / byte)")
    roof.set_ylabel("achieved GFLOP/s")
    roof.set_title("roofline (cases with no FLOPs, e.g. state copies, are only on the right)")
    roof.grid(True, which="both", alpha=0.3)
    roof.legend(fontsize=8, loc="lower right")

    names = [f"{i}. {d['family']}: {d['name']} [{d['mode']}]" for i, d in enumerate(ok, 1)]
    fractions = [100 * d["fraction_of_ceiling"] for d in ok]
    ys = list(range(len(ok)))[::-1]
    bars.barh(ys, fractions, color=[COLORS[d["family"]] for d in ok])
    for y, f in zip(ys, fractions, strict=True):
        bars.annotate(f" {f:.0f}%", (f, y), va="center", fontsize=7)
    bars.set_yticks(ys, names, fontsize=7)
    bars.set_xlabel("% of the relevant ceiling (copy bandwidth or matmul rate)")
    bars.axvline(100, color="k", lw=1)
    bars.set_title("share of ceiling per case")
    bars.grid(True, axis="x", alpha=0.3)

    m = data["machine"]
    fig.suptitle(
        f"plugin-api bench {'--quick ' if data['method']['quick'] else ''}· {data['backend']} on "
        f"{data['device']} · {m.get('gpu') or m['cpu_model']} · {m['threads']} threads · "
        f"torch {m['torch']}",
        fontsize=11,
    )
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
