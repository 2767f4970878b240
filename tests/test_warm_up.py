"""Warm-up: ``plugin_api.warm_up`` and ``plugin-api warm-up`` build or load what the backend
runs for given specs, report what ran, and leave nothing to build for the first request."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import plugin_api as pa
from plugin_api.backend import backend_for
from plugin_api.cli.warm_up import layers_from_config
from plugin_api.selection import PluginApiWarning
from plugin_api.settings import Settings

BF16, F32, I8, FP8 = torch.bfloat16, torch.float32, torch.int8, torch.float8_e4m3fn

# Small specs of every family, each a shape the native CPU kernels accept.
SPECS: dict[str, Any] = {
    "sliding attention": pa.AttentionSpec(
        4, 2, 16, BF16, sliding_window=8, has_sinks=True, num_speculative_tokens=2
    ),
    "kv-shared attention": pa.AttentionSpec(4, 2, 32, BF16, kv_sharing=True),
    "q_proj": pa.GemmSpec(64, 32, BF16, BF16),
    "o_proj": pa.GemmSpec(64, 32, BF16, BF16),  # the same spec: warmed once, both names
    "down_proj (w8a8)": pa.GemmSpec(32, 64, I8, BF16),
    "lm_head": pa.GemmSpec(100, 32, BF16, F32, "lm_head"),
    "activation quant": pa.QuantSpec(64, 32, BF16, FP8, True, True),
}
STATE = pa.StateSpec(((6, 3), (2, 4, 8)), (BF16, F32))

# A Llama-shaped config.json, tiny (hidden 64, 4 heads of 16, 2 KV heads).
TINY_CONFIG = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "vocab_size": 256,
    "torch_dtype": "bfloat16",
}


def run_warm_up(backend_id: str, specs: Any, **kw: Any) -> tuple[pa.Backend, Any, list[str]]:
    be = backend_for(backend_id, settings=kw.pop("settings", None))
    lines: list[str] = []
    return be, pa.warm_up(specs, backend=be, progress=lines.append, **kw), lines


def check_provenance(be: pa.Backend, report: Any) -> None:
    """Each item ran what the backend resolves for its spec (the calls' own provenance)."""
    for item in report.items:
        assert item.ok, item
        expected = be.explain(item.family, item.spec).provenance
        assert item.provenance == expected, (item.describe(), item.provenance, expected)
        d = item.to_dict()
        assert d["implementation"] == {
            "backend": expected.backend,
            "impl": expected.impl,
            "path": str(expected.path),
            "fallback": expected.fallback,
        }
        assert d["fallback"] is expected.fallback is item.fallback


def test_reference_warms_every_family_once_per_spec(clean_env):
    be, report, lines = run_warm_up("reference", {**SPECS, "ssm state": STATE}, gemm_rows=(1, 3))
    assert report.ok and report.backend == "reference" and report.device_type == "cpu"
    check_provenance(be, report)
    assert [i.provenance.backend for i in report.items] == ["reference"] * len(report.items)
    assert len(report.items) == len(SPECS)  # o_proj's spec is q_proj's: one item
    by_layer = {name: item for item in report.items for name in item.layers}
    assert by_layer["q_proj"] is by_layer["o_proj"]
    assert by_layer["q_proj"].layers == ("q_proj", "o_proj")
    assert {str(i.family) for i in report.items} == {"attention", "gemm", "quant", "state"}
    # progress: a line when each item starts and one when it ends, numbered
    n = len(report.items)
    assert len(lines) == 2 * n
    for k, item in enumerate(report.items, 1):
        start, end = lines[2 * k - 2], lines[2 * k - 1]
        head = f"[{k}/{n}] {item.describe()}"
        assert start == f"{head} ..."
        assert end.startswith(f"{head}: reference:reference ") and end.endswith(" s")


def test_a_plain_list_of_specs_and_the_process_backend(clean_env):
    report = pa.warm_up([SPECS["q_proj"], SPECS["q_proj"]], progress=None)
    assert [i.layers for i in report.items] == [()]
    assert report.backend == pa.process_backend().id


def test_cpu_arm_acl_runs_its_native_kernels_and_reports_the_state_fallback(clean_env):
    with pytest.warns(PluginApiWarning, match="state: backend 'cpu-arm-acl' does not support"):
        be, report, _ = run_warm_up("cpu-arm-acl", {**SPECS, "ssm state": STATE})
    check_provenance(be, report)
    impls = {i.layers[0]: (i.provenance.impl, str(i.provenance.path)) for i in report.items}
    assert impls["sliding attention"] == ("cpu-paged-attention", "native")
    assert impls["activation quant"] == ("cpp-group-quant", "native")
    assert all(impls[name][1] == "native" for name in SPECS if name != "o_proj")
    state = next(i for i in report.items if i.layers == ("ssm state",))
    assert state.fallback and state.provenance.backend == "reference"
    # the GEMMs say which library kernel ran them (oneDNN's implementation, or the GEMV); the
    # plugin's own panel kernels (int8 on AVX2 without VNNI) name none
    w8a8 = next(i for i in report.items if i.layers == ("down_proj (w8a8)",))
    assert all(k for k in w8a8.kernels)
    assert bool(w8a8.kernels) == (w8a8.provenance.impl == "onednn"), w8a8.provenance


def test_strict_makes_a_fallback_and_a_rejected_spec_failed_items(clean_env):
    odd_head = pa.AttentionSpec(4, 2, 24, BF16)  # not a multiple of 16: the kernels refuse it
    specs = {"odd head": odd_head, "ssm state": STATE, "q_proj": SPECS["q_proj"]}
    _, report, lines = run_warm_up("cpu-arm-acl", specs, settings=Settings(strict=True))
    assert not report.ok
    odd, state, gemm = report.items
    # the rest still ran, natively (oneDNN, or the panel kernels where oneDNN has no bf16)
    assert gemm.ok and gemm.provenance.backend == "cpu-arm-acl"
    assert str(gemm.provenance.path) == "native" and not gemm.fallback
    for item in (odd, state):
        assert item.error_type == "FallbackRefused" and item.provenance is None
        assert "PLUGIN_API_STRICT=1 forbids fallbacks" in (item.error or "")
    assert "head_size=24: the kernels take multiples of 16" in (odd.error or "")
    assert "failed after" in lines[1] and "FallbackRefused" in lines[1]
    with pytest.raises(pa.PluginApiError, match=r"2 of 3 items failed") as e:
        report.raise_on_failure()
    assert "attention h4/kv2/d24" in str(e.value) and e.value.backend == "cpu-arm-acl"


@pytest.mark.parametrize(
    ("specs", "kw", "error", "match"),
    [
        ([object()], {}, TypeError, r"warm_up: specs\[1\] is a object, expected one of"),
        (
            {"bad": pa.GemmSpec(64, 32, BF16, torch.float16)},
            {},
            TypeError,
            r"warm_up: specs\['bad'\]: out_dtype=torch.float16 with weight_dtype=torch.bfloat16",
        ),
        (
            [pa.QuantSpec(100, 32, BF16, I8)],
            {},
            ValueError,
            r"specs\[1\]: k=100 is not divisible by group_size=32",
        ),
        (
            [pa.StateSpec(((4, 0),), (BF16,))],
            {},
            ValueError,
            r"specs\[1\]: shapes\[0\]\[1\]=0 must be >= 1",
        ),
        ([pa.GemmSpec(0, 32, BF16, BF16)], {}, ValueError, r"specs\[1\]: n=0 must be >= 1"),
        ([], {"gemm_rows": (1, 0)}, ValueError, r"gemm_rows\[1\]=0 must be >= 1"),
        ([], {"gemm_rows": "1"}, TypeError, r"gemm_rows='1' must be a non-empty sequence"),
        ("q_proj", {}, TypeError, r"specs must be an iterable of specs or a mapping"),
        ([], {"backend": "cpu-arm-acl"}, TypeError, r"backend must be a Backend or None"),
        ([], {"progress": "stderr"}, TypeError, r"progress must be a callable or None"),
    ],
)
def test_bad_input_is_refused_before_any_kernel_runs(clean_env, specs, kw, error, match):
    if isinstance(specs, list):
        specs = [SPECS["q_proj"], *specs]  # a valid spec first: it must not run either
    lines: list[str] = []
    kw = {"backend": backend_for("reference"), "progress": lines.append, **kw}
    with pytest.raises(error, match=match):
        pa.warm_up(specs, **kw)
    assert lines == []


# ---- after warm-up, the first request builds nothing (a fresh process: nothing loaded yet) ----

FIRST_REQUEST = """
import json, torch
import plugin_api as pa
from plugin_api_cpu_arm_acl import _attention_ext as ext, build
from plugin_api_cpu_arm_acl.gemm import OneDnnGemm
from plugin_api.contract import OpFamily

be = pa.backend_for("cpu-arm-acl")
spec = pa.AttentionSpec(4, 2, 32, torch.bfloat16)
lin = pa.GemmSpec(48, 64, torch.bfloat16, torch.bfloat16)
w8a8 = pa.GemmSpec(48, 64, torch.int8, torch.bfloat16)
onednn = next(i for i in be.candidates(OpFamily.GEMM) if isinstance(i.impl, OneDnnGemm)).impl
before = {"gemm_ext": build._loaded is not None, "attention_ext": ext.load.cache_info().currsize}
report = pa.warm_up([spec, lin, w8a8], backend=be, gemm_rows=(1, 7), progress=None)
assert report.ok, report.to_dict(tracebacks=True)
loaded = build.extension()
after = {
    "gemm_ext_same": build._loaded is loaded,
    "gemm_ext_files": sorted(p.suffix for p in loaded.build_dir.iterdir() if p.suffix == ".so"),
    "attention_misses": ext.load.cache_info().misses,
    "primitives": onednn.cache.stats().misses,
}
# the engine's first request: its own weights and batch, the same specs
attn = pa.attention(spec, be)
cache = attn.allocate_kv_cache(4)
batch = pa.AttentionBatch.from_lists(
    query_lens=[7], seq_lens=[7], block_table=[[0]], slot_mapping=list(range(7))
)
q = torch.randn(7, 4, 32, dtype=torch.bfloat16)
k = torch.randn(7, 2, 32, dtype=torch.bfloat16)
attn.run(q, k, k.clone(), cache, attn.plan(batch))
packed = pa.prepare(torch.randn(48, 64, dtype=torch.bfloat16), backend=be)
pa.mm(torch.randn(7, 64, dtype=torch.bfloat16), packed)
wq = pa.prepare(torch.ones(48, 64, dtype=torch.int8), weight_scale=torch.ones(48), backend=be)
pa.scaled_mm(torch.ones(7, 64, dtype=torch.int8), torch.ones(7), wq)
first = {
    "gemm_ext_same": build._loaded is loaded,
    "attention_misses": ext.load.cache_info().misses,
    "primitives": onednn.cache.stats().misses,
}
served = sorted({i.provenance.impl for i in report.items if i.family == OpFamily.GEMM})
print(json.dumps({"before": before, "after": after, "first": first, "gemm": served}))
"""


def test_after_warm_up_the_first_request_builds_nothing(clean_env):
    r = subprocess.run(
        [sys.executable, "-c", FIRST_REQUEST],
        capture_output=True,
        text=True,
        timeout=600,  # a changed csrc/ builds the extensions here (minutes on 2 cores)
        env=_env(),
    )
    assert r.returncode == 0, r.stderr
    seen = json.loads(r.stdout.strip().splitlines()[-1])
    # nothing was loaded before the warm-up: it is what built or loaded both libraries
    assert seen["before"] == {"gemm_ext": False, "attention_ext": 0}
    assert seen["after"]["gemm_ext_same"] and seen["after"]["gemm_ext_files"] == [".so"]
    assert seen["after"]["attention_misses"] == 1
    if "onednn" in seen["gemm"]:  # the M=7 primitives (M=1 may take the GEMV)
        assert seen["after"]["primitives"] >= 1, seen
    else:  # AVX2: bf16 and int8 on the panel kernels, which build no primitive
        assert seen["gemm"] == ["panel"] and seen["after"]["primitives"] == 0, seen
    # the first request loaded no library and built no oneDNN primitive
    assert seen["first"] == {
        "gemm_ext_same": True,
        "attention_misses": 1,
        "primitives": seen["after"]["primitives"],
    }


# ---- the verb ----------------------------------------------------------------------------------


def _env(**extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("PLUGIN_API_")}
    return base | extra


def cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "plugin_api", "warm-up", *args],
        capture_output=True,
        text=True,
        env=_env(**env),
        timeout=600,
    )


def write_config(tmp_path: Path, **fields: Any) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**TINY_CONFIG, **fields}))
    return path


@pytest.mark.parametrize("backend_id", ["reference", "cpu-arm-acl"])
def test_verb_json_from_a_config(tmp_path: Path, backend_id: str):
    config = write_config(tmp_path)
    r = cli(
        "--json",
        "--config",
        str(config),
        "--gemm-rows",
        "1,4",
        PLUGIN_API_BACKEND=backend_id,
        PLUGIN_API_STRICT="1",
    )
    assert r.returncode == 0, r.stdout + r.stderr
    data = json.loads(r.stdout)
    assert data["ok"] and data["backend"] == backend_id and data["source"] == str(config)
    assert data["gemm_rows"] == [1, 4]
    got = {(i["family"], i["spec"]): i["layers"] for i in data["items"]}
    assert got == {
        ("attention", "h4/kv2/d16 bf16 block=16"): ["attention"],
        ("gemm", "linear N=128 K=64 bf16->bf16"): ["qkv_proj"],
        ("gemm", "linear N=64 K=64 bf16->bf16"): ["o_proj"],
        ("gemm", "linear N=256 K=64 bf16->bf16"): ["gate_up_proj"],
        ("gemm", "linear N=64 K=128 bf16->bf16"): ["down_proj"],
        ("gemm", "lm_head N=256 K=64 bf16->fp32"): ["lm_head"],
    }
    for item in data["items"]:
        assert item["implementation"]["backend"] == backend_id and not item["fallback"]
        assert item["seconds"] >= 0
    # progress goes to stderr, one line at each item's start and end
    progress = [ln for ln in r.stderr.splitlines() if ln.startswith("[")]
    assert len(progress) == 2 * len(data["items"])
    assert progress[-1].startswith(f"[6/6] gemm lm_head N=256 K=64 bf16->fp32: {backend_id}:")


def test_verb_text_and_a_failed_item_exit_1(tmp_path: Path):
    config = write_config(tmp_path, hidden_size=96, num_attention_heads=4, head_dim=24)
    r = cli("-v", "--config", str(config), PLUGIN_API_BACKEND="cpu-arm-acl", PLUGIN_API_STRICT="1")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "      | Traceback (most recent call last):" in r.stdout  # -v: where it failed
    assert "warm-up on cpu-arm-acl (cpu)" in r.stdout and "1 item(s) failed" in r.stdout
    assert "! attention h4/kv2/d24 bf16 block=16" in r.stdout
    assert "head_size=24: the kernels take multiples of 16" in r.stdout
    assert "+ gemm      lm_head N=256 K=96 bf16->fp32" in r.stdout


def test_verb_defaults_to_the_doctors_example_models():
    from plugin_api.cli.model_specs import MODELS

    # M=1 on real shapes: the example LM head packs a 128256 x 4096 (zero) weight
    r = cli("--json", PLUGIN_API_BACKEND="cpu-arm-acl")
    assert r.returncode == 0, r.stdout + r.stderr
    data = json.loads(r.stdout)
    assert data["source"] == "the doctor's example models"
    layers = [name for item in data["items"] for name in item["layers"]]
    assert sorted(layers) == sorted(f"{m.name}: {ly.name}" for m in MODELS for ly in m.layers)
    # cpu-arm-acl has no state kernels: the reference serves them, and the report says so
    fallbacks = [i for i in data["items"] if i["fallback"]]
    assert [i["family"] for i in fallbacks] == ["state"]
    assert fallbacks[0]["implementation"]["backend"] == "reference"
    assert "state: backend 'cpu-arm-acl' does not support" in r.stderr  # warned


@pytest.mark.parametrize(
    ("write", "message"),
    [
        (None, "cannot read it"),
        ("{not json", "not valid JSON (Expecting property name"),
        ("[1, 2]", "expected a JSON object, got list"),
        ('{"hidden_size": 64}', "'num_attention_heads' is missing"),
    ],
)
def test_bad_config_is_a_clear_error_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], write: str | None, message: str
):
    from plugin_api.cli import main

    path = tmp_path / "model" / "config.json"
    if write is not None:
        path.parent.mkdir()
        path.write_text(write)
    # the config is read before a backend is selected or anything runs
    assert main(["warm-up", "--config", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(f"plugin-api warm-up: error: --config {path}: {message}")
    assert main(["warm-up", "--json", "--config", str(path)]) == 2
    error = json.loads(capsys.readouterr().out)["error"]
    assert error["type"] == "ValueError" and error["message"].startswith(f"--config {path}: ")


def test_a_missing_config_from_the_command_line(tmp_path: Path):
    r = cli("--config", str(tmp_path / "nope.json"), PLUGIN_API_BACKEND="reference")
    assert r.returncode == 2 and r.stdout == ""
    assert f"plugin-api warm-up: error: --config {tmp_path / 'nope.json'}: cannot read it" in (
        r.stderr
    )


def test_block_size_needs_a_config(capsys: pytest.CaptureFixture[str]):
    from plugin_api.cli import main

    assert main(["warm-up", "--block-size", "32"]) == 2
    assert "--block-size applies to the layers of --config" in capsys.readouterr().err


@pytest.mark.parametrize("rows", ["1,x", "0", ""])
def test_bad_gemm_rows_is_refused(capsys: pytest.CaptureFixture[str], rows: str):
    from plugin_api.cli import main

    assert main(["warm-up", "--gemm-rows", rows]) == 2
    assert f"--gemm-rows {rows!r}: expected positive ints" in capsys.readouterr().err


# ---- reading config.json -----------------------------------------------------------------------


def specs_of(tmp_path: Path, **fields: Any) -> dict[str, Any]:
    return {ly.name: ly.spec for ly in layers_from_config(write_config(tmp_path, **fields))}


def test_config_llama_shapes(tmp_path: Path):
    specs = specs_of(tmp_path, head_dim=32, num_attention_heads=8, torch_dtype="float32")
    assert specs["attention"] == pa.AttentionSpec(8, 2, 32, F32)
    assert specs["qkv_proj"] == pa.GemmSpec((8 + 2 * 2) * 32, 64, F32, F32)
    assert specs["o_proj"] == pa.GemmSpec(64, 8 * 32, F32, F32)
    assert specs["gate_up_proj"] == pa.GemmSpec(256, 64, F32, F32)
    assert specs["down_proj"] == pa.GemmSpec(64, 128, F32, F32)
    assert specs["lm_head"] == pa.GemmSpec(256, 64, F32, F32, "lm_head")
    wide = layers_from_config(tmp_path / "config.json", block_size=32)
    assert wide[0].spec == pa.AttentionSpec(8, 2, 32, F32, block_size=32)
    # a folder is read as the checkpoint's config.json
    assert layers_from_config(tmp_path) == layers_from_config(tmp_path / "config.json")


def test_config_sliding_layers_softcap_sinks_and_kv_sharing(tmp_path: Path):
    specs = specs_of(
        tmp_path,
        model_type="gpt_oss",
        sliding_window=24,
        layer_types=["sliding_attention", "full_attention"] * 2,
        attn_logit_softcapping=20.0,
        query_pre_attn_scalar=16,
        num_kv_shared_layers=2,
    )
    common = {"logits_soft_cap": 20.0, "has_sinks": True, "scale": 0.25}
    assert [n for n in specs if "attention" in n] == [
        "sliding attention",
        "attention",
        "sliding kv-shared attention",
        "kv-shared attention",
    ]
    assert specs["sliding attention"] == pa.AttentionSpec(4, 2, 16, sliding_window=24, **common)
    assert specs["kv-shared attention"] == pa.AttentionSpec(4, 2, 16, kv_sharing=True, **common)
    # Qwen2-style: a window in the config that the model does not use
    qwen = specs_of(tmp_path, sliding_window=4096, use_sliding_window=False)
    assert qwen["attention"].sliding_window is None and "sliding attention" not in qwen
    # Mistral-style: every layer slides
    assert specs_of(tmp_path, sliding_window=4096)["sliding attention"].sliding_window == 4096


def test_config_multimodal_text_config_and_w8a8(tmp_path: Path):
    w8a8 = {
        "quant_method": "compressed-tensors",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {"num_bits": 8, "type": "int", "strategy": "channel"},
                "input_activations": {
                    "num_bits": 8,
                    "type": "int",
                    "strategy": "token",
                    "dynamic": True,
                },
            }
        },
        "ignore": ["lm_head"],
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"text_config": TINY_CONFIG, "quantization_config": w8a8}))
    specs = {ly.name: ly.spec for ly in layers_from_config(path)}
    assert specs["qkv_proj"] == pa.GemmSpec(128, 64, I8, BF16)
    assert specs["lm_head"] == pa.GemmSpec(256, 64, BF16, F32, "lm_head")  # ignored: bf16
    quant = sorted(s.k for n, s in specs.items() if n.startswith("activation quant"))
    assert quant == [64, 128]
    assert specs["activation quant K=128"] == pa.QuantSpec(128, 128, BF16, I8)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"quantization_config": {"quant_method": "gptq"}}, "quant_method='gptq') is not read"),
        ({"torch_dtype": "int4"}, "torch_dtype='int4' is not one of"),
        ({"num_key_value_heads": 3}, "num_attention_heads=4 is not a multiple of kv_heads=3"),
        ({"hidden_size": "64"}, "hidden_size='64' must be a positive int"),
        ({"layer_types": ["linear_attention"]}, "layer_types holds ['linear_attention']"),
    ],
)
def test_config_errors_name_the_file_and_field(tmp_path: Path, fields: dict, message: str):
    path = write_config(tmp_path, **fields)
    with pytest.raises(ValueError) as e:
        layers_from_config(path)
    assert str(e.value).startswith(f"--config {path}: ") and message in str(e.value)
