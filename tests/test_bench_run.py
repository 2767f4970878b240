"""One tiny benchmark run end to end on the reference backend (real ops, real baselines, small
shapes and a short sampling method), its JSON/table/summary/plot, and the CLI's argument errors.
No assertion here is about speed."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch

from plugin_api.backend import backend_for
from plugin_api.bench import cases as C
from plugin_api.bench import lm_head_argmax
from plugin_api.bench.ceilings import measure_ceilings
from plugin_api.bench.cli import matching_cases
from plugin_api.bench.harness import Method, synchronizer
from plugin_api.bench.report import run_dict, summary_lines, table_text
from plugin_api.bench.run import run_bench
from plugin_api.cli import main

TINY = Method(warmup=0, target_s=1e-3, min_samples=2, max_samples=3, cap_s=1.0)
CASES = (
    C.GemmCase("tiny_head", 3, 64, 32, C.BF16, C.FP32, "lm_head"),
    C.GemmCase("tiny_w8a8", 2, 48, 64, C.INT8, C.BF16),
    C.QuantCase(4, 256, 128, C.FP8, True),
    C.AttentionCase("spec-decode", 2, 40, 3, num_heads=4, num_kv_heads=2, head_size=16),
    C.AttentionCase("prefill", 1, 20, 20, num_heads=4, num_kv_heads=2, head_size=16),
    C.AttentionCase(
        "decode", 2, 40, 1, num_heads=4, num_kv_heads=2, head_size=16, kv_cache_dtype=C.FP8
    ),
    C.StateCase("tiny-mamba", (8, 3), (2, 4, 8), 2),
)


@pytest.fixture(scope="module")
def tiny_run() -> tuple[dict, str]:
    cpu = torch.device("cpu")
    ceilings = measure_ceilings(
        cpu, 8 << 20, TINY, synchronizer(cpu), stop_after_s=1.0, sizes=(64, 128)
    )
    progress = io.StringIO()
    run = run_bench(
        backend_for("reference"),
        C.FAMILIES,
        quick=True,
        cases=CASES,
        method=TINY,
        ceilings=ceilings,
        progress=progress,
    )
    return run_dict(run), progress.getvalue()


def test_every_case_runs_through_the_public_ops_with_baselines(tiny_run):
    data, progress = tiny_run
    assert [d["name"] for d in data["cases"]] == [c.name for c in CASES]
    for d, case in zip(data["cases"], CASES, strict=True):
        assert d["status"] == "ok", d
        ref = {"impl": "reference", "path": "reference", "backend": "reference", "fallback": False}
        # an int8 GEMM case is two ops: the per-token activation quant, then scaled_mm
        assert d["provenance"] == [ref] * (2 if getattr(case, "scaled", False) else 1)
        assert (d["bytes"], d["flops"]) == (case.nbytes(), case.flops())
        t = d["time_s"]
        assert 2 <= t["n"] <= 3 and t["p10"] <= t["median"] <= t["p90"]
        assert d["bytes_per_s"] == pytest.approx(d["bytes"] / t["median"])
        assert d["fraction_of_ceiling"] > 0
        assert d["mode"] == ("cold" if d["bound"] == "memory" else "hot")
        expected = {"gemm": {"linear_bf16", "upcast_fp32"}, "quant": {"eager"}}
        expected |= {"attention": {"sdpa"}, "state": set()}
        if case.family == "gemm" and case.out_dtype == torch.float32:
            expected["gemm"] |= {"upcast_per_call"}
        if getattr(case, "scaled", False):  # torch's int8 path beside the backend's
            expected["gemm"] |= {"int_mm"}
        assert set(d["baselines"]) == expected[d["family"]]
        for b in d["baselines"].values():
            assert "error" not in b, b
            assert b["speedup"] == pytest.approx(b["time_s"]["median"] / t["median"])
        assert f"{case.family} {case.name} ..." in progress


def test_json_carries_the_machine_method_and_ceilings(tiny_run):
    data, _ = tiny_run
    again = json.loads(json.dumps(data))
    assert again == data
    m = data["machine"]
    assert m["threads"] == torch.get_num_threads() and m["torch"] == torch.__version__
    assert m["cpu_model"] and m["device"] == "cpu" and m["gpu"] is None
    assert data["method"]["quick"] and "--quick runs" in data["method"]["quick_trims"]
    assert data["eviction"]["buffer_bytes"] >= 2 * data["eviction"]["llc_bytes"]
    c = data["ceilings"]
    assert c["ridge_flops_per_byte"] == pytest.approx(
        c["peak_flops_per_s"] / c["bandwidth_bytes_per_s"]
    )
    assert c["peak_flops_per_s"] == max(p["flops_per_s"] for p in c["matmul"])
    assert {p["dtype"] for p in c["matmul"]} == {"float32", "bfloat16"}


def test_table_and_doctor_summary(tiny_run):
    data, _ = tiny_run
    table = table_text(data)
    for case in CASES:
        assert case.name in table
    assert "ceilings: copy" in table and "--quick runs" in table
    lines = summary_lines(data)
    assert len(lines) == 1 + len(C.FAMILIES) + 1  # + the LM-head argmax line
    assert lines[-1].startswith("  LM-head argmax, bf16-out vs fp32-out (256 rows")
    assert "LM-head argmax" in table
    assert lines[1].startswith("  gemm       2/2 ok") and "vs linear_bf16 x" in lines[1]
    assert lines[4].startswith("  state      1/1 ok")
    assert ".." not in lines[4] and lines[4].endswith("% of ceiling")  # one case, no range


def test_roofline_png(tiny_run, tmp_path: Path):
    pytest.importorskip("matplotlib", reason="the plot needs the [bench] extra")
    from plugin_api.bench.plot import write_roofline

    out = write_roofline(tiny_run[0], tmp_path / "roofline.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out.stat().st_size > 10_000


def test_cli_rejects_bad_arguments_before_running(tmp_path: Path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["bench", "--op", "nosuch"])
    assert e.value.code == 2 and "invalid choice: 'nosuch'" in capsys.readouterr().err
    missing = str(tmp_path / "missing" / "out.json")
    assert main(["bench", "--backend", "reference", "--quick", "--json", missing]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["doctor", "--bench", "--device-info", "h200"]) == 2
    assert "--bench measures this machine" in capsys.readouterr().err
    assert main(["bench", "--backend", "reference", "--op", "quant", "--case", "gemm *"]) == 2
    assert "--case 'gemm *' matches none of the" in capsys.readouterr().err


def test_case_globs_pick_named_cases():
    picked = matching_cases(("gemm",), False, ["gemm lm_head *N=128256 M=1 *"])
    assert [c.name for c in picked] == [
        "lm_head K=4096 N=128256 M=1 bf16->fp32",
        "lm_head K=4096 N=128256 M=1 bf16->bf16",
    ]
    both = matching_cases(("quant", "state"), True, ["quant *fp8*", "state *"])
    assert [c.family for c in both] == ["quant", "state"]


def test_lm_head_argmax_flips_counted_against_fp32_logits():
    """The reference's bf16 output is its fp32 logits rounded once, so the flips it reports are
    exactly the rows where rounding the fp32 logits to bf16 moves the argmax."""
    be = backend_for("reference")
    got = lm_head_argmax.measure(be, quick=True, vocab=3000, hidden=256, rows=300)
    g = torch.Generator().manual_seed(0)
    w = (torch.randn(3000, 256, generator=g) * (lm_head_argmax.LOGIT_STD / 16)).bfloat16()
    flips = 0
    for start in range(0, 300, lm_head_argmax.CHUNK):
        x = torch.randn(min(lm_head_argmax.CHUNK, 300 - start), 256, generator=g).bfloat16()
        exact = x.double() @ w.double().T
        flips += int((exact.float().argmax(-1) != exact.float().bfloat16().argmax(-1)).sum())
    assert (got.rows, got.vocab, got.hidden) == (300, 3000, 256)
    assert got.flips == flips and 0 < flips < 300
    assert got.to_dict()["flip_rate"] == flips / 300
    assert "flips" in lm_head_argmax.lines(got.to_dict())[0]


def test_json_records_the_lm_head_argmax_when_lm_head_cases_ran(tiny_run):
    data, progress = tiny_run
    d = data["lm_head_argmax"]
    assert d["rows"] == lm_head_argmax.ROWS_QUICK and 0 <= d["flips"] <= d["rows"]
    assert "LM-head argmax: bf16-out vs fp32-out ..." in progress


def test_kernel_names_reach_every_active_recorder():
    from plugin_api.contract.provenance import note_kernel, record_kernels

    note_kernel("unrecorded")  # no recorder: nothing to do, no error
    with record_kernels() as outer:
        note_kernel("a")
        with record_kernels() as inner:
            note_kernel("b")
    assert outer == ["a", "b"] and inner == ["b"]


def test_attention_plan_cost_beside_the_decode_step(tiny_run):
    """Each decode-kind attention case gets Attention.plan and the slot-mapping check timed on
    its batch, against its own median from the same run."""
    data, progress = tiny_run
    decodes = [d for d in data["cases"] if d["family"] == "attention" and d["params"]["kind"]
               in ("decode", "spec-decode")]  # fmt: skip
    entries = data["attention_plan"]
    assert [e["case"] for e in entries] == [d["name"] for d in decodes] and entries
    for e, d in zip(entries, decodes, strict=True):
        assert e["impl"] == "reference" and e["slot_check_in_plan"] is False
        assert e["step_s"] == d["time_s"]["median"]
        assert e["plan_s"] > 0 and e["checks_s"] > 0 and e["checks_with_slot_check_s"] > 0
        assert e["slot_check_s"] == e["checks_with_slot_check_s"] - e["checks_s"]
        assert e["plan_fraction_of_step"] == pytest.approx(e["plan_s"] / e["step_s"])
        assert e["plan_budget_s"] == max(1e-4, 0.05 * e["step_s"])
        assert e["rounds"] >= TINY.min_samples
    assert "attention plan per step: Attention.plan and the slot-mapping check ..." in progress
    table = table_text(data)
    assert "attention plan per step (Attention.plan = host checks + reference plan" in table
    assert f"  {entries[0]['case']}: plan " in table
