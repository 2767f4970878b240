"""The benchmark's arithmetic, against values worked out by hand: bytes and FLOPs per case, the
roofline classification and fractions, statistics, the sampling rule, and the cache sizes read
from the machine. Nothing here times anything real."""

from __future__ import annotations

from pathlib import Path

import pytest

from plugin_api.bench import cases as C
from plugin_api.bench.ceilings import Ceilings, copy_buffer_bytes, intensity
from plugin_api.bench.harness import (
    CacheSize,
    Method,
    eviction_bytes,
    lscpu_llc,
    measure,
    parse_size,
    percentile,
    summarize,
    sysfs_llc,
)
from plugin_api.bench.machine import isa_flags
from plugin_api.bench.report import header_lines

MiB = 1 << 20

# ---- bytes and FLOPs ----------------------------------------------------------------------------


def test_lm_head_gemv_bytes_and_flops():
    c = C.GemmCase("lm_head", 1, 128256, 4096, C.BF16, C.FP32, "lm_head")
    # x: 1*4096*2, W: 128256*4096*2, y: 1*128256*4 (fp32)
    assert c.nbytes() == 8192 + 1_050_673_152 + 513_024 == 1_051_194_368
    assert c.flops() == 2 * 1 * 128256 * 4096 == 1_050_673_152
    assert c.name == "lm_head K=4096 N=128256 M=1 bf16->fp32"


def test_int8_scaled_mm_bytes_include_activation_quant_and_both_scales():
    c = C.GemmCase("o_proj", 16, 4096, 4096, C.INT8, C.BF16)
    # x bf16 16*4096*2 read, x_q 16*4096 written, W_q 4096*4096, y 16*4096*2 (bf16),
    # scales 4*(16 + 4096)
    assert c.nbytes() == 131_072 + 65_536 + 16_777_216 + 131_072 + 16_448 == 17_121_344
    assert c.flops() == 536_870_912


def test_quant_bytes_and_flops():
    small = C.QuantCase(32, 128, 64, C.INT8, False)
    # x bf16 32*128*2, q int8 32*128, scales fp32 32*2*4
    assert small.nbytes() == 8192 + 4096 + 256 == 12_544
    assert small.flops() == 2 * 32 * 128 + 32 * 2 == 8_256
    big = C.QuantCase(1024, 7168, 128, C.FP8, True)
    assert big.nbytes() == 14_680_064 + 7_340_032 + 229_376 == 22_249_472
    assert big.flops() == 14_680_064 + 57_344
    assert big.name == "M=1024 K=7168 group=128 fp8 col-major"


def test_decode_attention_bytes_and_flops():
    c = C.AttentionCase("decode", 1, 1024, 1)
    assert c.visible_pairs() == 1024
    # 4 * head_size * heads * visible keys: QK^T and PV, 2 FLOPs per multiply-add
    assert c.flops() == 4 * 128 * 32 * 1024 == 16_777_216
    # K/V cache 1024*8*128*2*2, q + out 2*32*128*2, new K/V read + written 2*8*128*2*2
    assert c.nbytes() == 4_194_304 + 16_384 + 8_192 == 4_218_880


def test_an_fp8_cache_halves_the_bytes_a_decode_reads():
    c = C.AttentionCase("decode", 1, 1024, 1, kv_cache_dtype=C.FP8)
    assert c.name == "decode batch=1 context=1k kv=fp8"
    assert c.flops() == C.AttentionCase("decode", 1, 1024, 1).flops()
    # K/V cache 1024*8*128*2*1, q + out 2*32*128*2, new K/V read (bf16) + written (fp8)
    assert c.nbytes() == 2_097_152 + 16_384 + 8 * 128 * 2 * (2 + 1) == 2_119_680
    assert c.params()["kv_cache_dtype"] == "fp8"


def test_causal_prefill_and_spec_decode_count_visible_keys():
    prefill = C.AttentionCase("prefill", 4, 512, 512)
    assert prefill.visible_pairs() == 512 * 513 // 2 == 131_328
    assert prefill.flops() == 16384 * 4 * 131_328 == 8_606_711_808
    assert prefill.nbytes() == 8_388_608 + 33_554_432 + 16_777_216 == 58_720_256
    spec = C.AttentionCase("spec-decode", 8, 4096, 3)
    assert spec.visible_pairs() == 4094 + 4095 + 4096 == 12_285
    assert spec.flops() == 131_072 * 12_285 == 1_610_219_520


def test_state_copy_bytes():
    c = C.StateCase("mamba2-2.7b", (5376, 3), (80, 64, 128), 16)
    assert c.block_bytes() == 5376 * 3 * 2 + 80 * 64 * 128 * 4 == 2_653_696
    assert c.nbytes() == 2 * 16 * 2_653_696 == 84_918_272
    assert c.flops() == 0
    assert c.pool_blocks == 32


# ---- the case lists ----------------------------------------------------------------------------


def test_named_cases_are_the_issue_shapes():
    gemm = C.ALL["gemm"]
    heads = [c for c in gemm if c.layer == "lm_head"]
    assert {(c.n, c.k) for c in heads} == {(32000, 4096), (64128, 4096), (128256, 4096)}
    assert {c.m for c in heads} == {1, 2, 4, 8, 9, 16, 64, 256}
    assert {c.out_dtype for c in heads} == {C.FP32, C.BF16} and len(heads) == 48
    linear = [c for c in gemm if c.layer != "lm_head"]
    assert {(c.k, c.n) for c in linear} == {
        (4096, 6144),
        (4096, 4096),
        (4096, 28672),
        (14336, 4096),
    }
    assert {c.m for c in linear} == {1, 16, 256, 2048} and len(linear) == 28
    assert {c.weight_dtype for c in linear} == {C.BF16, C.INT8}
    # the prefill chunk in bf16 only (int8 at M = 2048 takes minutes a call without a native kernel)
    assert {c.weight_dtype for c in linear if c.m == 2048} == {C.BF16}
    quant = C.ALL["quant"]
    assert {(c.m, c.k) for c in quant} == set(C.QUANT_SHAPES) and len(quant) == 48
    attn = C.ALL["attention"]
    decode = {(c.batch, c.context) for c in attn if c.kind == "decode"}
    assert decode == {(b, n) for b in (1, 8, 16) for n in (1024, 4096, 8192)}
    prefill = [(c.batch, c.context, c.q_len, c.cache_dtype) for c in attn if c.kind == "prefill"]
    assert prefill == [(4, 512, 512, C.BF16), (4, 512, 512, C.FP8)]
    assert [c.q_len for c in attn if c.kind == "spec-decode"] == [3]
    assert all((c.num_heads, c.num_kv_heads, c.head_size) == (32, 8, 128) for c in attn)
    # block 16 everywhere, and 32 for the batch 8 / 16 decodes at 4k (the CPU comparison point)
    assert sorted((c.batch, c.context) for c in attn if c.block_size == 32) == [
        (8, 4096),
        (16, 4096),
    ]
    assert all(c.block_size == 16 for c in attn if c.block_size != 32)
    assert [c.name for c in attn if c.block_size == 32] == [
        "decode batch=8 context=4k block=32",
        "decode batch=16 context=4k block=32",
    ]
    assert {c.model for c in C.ALL["state"]} == {"mamba2-370m", "mamba2-2.7b"}


def test_quick_is_a_subset_with_every_family():
    for family in C.FAMILIES:
        assert C.QUICK[family], family
        assert set(C.QUICK[family]) <= set(C.ALL[family]), family
    names = [c.name for f in C.FAMILIES for c in C.ALL[f]]
    assert len(names) == len(set(names))
    assert C.select(("state", "gemm"), quick=True) == C.QUICK["state"] + C.QUICK["gemm"]


# ---- roofline ----------------------------------------------------------------------------------


def test_roofline_classification_and_fractions():
    c = Ceilings(bandwidth=10e9, peak_flops=200e9)
    assert c.ridge == 20.0
    assert c.classify(flops=100, nbytes=10) == "memory"  # 10 FLOP/B < 20
    assert c.classify(flops=400, nbytes=10) == "compute"  # 40 FLOP/B
    assert c.classify(flops=200, nbytes=10) == "compute"  # at the ridge: the roofs meet
    assert c.classify(flops=0, nbytes=10) == "memory"  # a copy
    # memory-bound: 1 GB in 0.2 s is 5 GB/s of 10
    assert c.fraction(flops=10**10, nbytes=10**9, seconds=0.2) == pytest.approx(0.5)
    # compute-bound: 4e10 FLOP in 0.4 s is 100 GFLOP/s of 200
    assert c.fraction(flops=4 * 10**10, nbytes=10**9, seconds=0.4) == pytest.approx(0.5)
    assert c.attainable(flops=10**10, nbytes=10**9) == pytest.approx(100e9)
    assert c.attainable(flops=4 * 10**10, nbytes=10**9) == pytest.approx(200e9)
    assert intensity(8_256, 12_544) == pytest.approx(0.658163, rel=1e-5)
    with pytest.raises(ValueError, match="moves 0 bytes"):
        intensity(1, 0)
    with pytest.raises(ValueError, match="positive"):
        Ceilings(bandwidth=0.0, peak_flops=1.0)


def test_the_copy_ceiling_is_the_best_measurement_and_its_drift_is_reported():
    start = Ceilings(bandwidth=15e9, peak_flops=150e9, copy_rates=(15e9,))
    assert start.copy_drift == 0.0
    end = start.rechecked(20e9)
    assert end.bandwidth == 20e9 and end.copy_rates == (15e9, 20e9)
    assert end.copy_drift == pytest.approx(1 / 3)  # 20 / 15 - 1
    assert start.rechecked(12e9).bandwidth == 15e9  # a slower recheck never lowers it
    # 1 GB in 0.1 s is 10 GB/s: half the ceiling after the recheck, not two thirds
    assert end.fraction(flops=10**9, nbytes=10**9, seconds=0.1) == pytest.approx(0.5)
    # the bound a case ran with is kept, even where the new ridge (7.5) would classify it
    # differently (intensity 8 FLOP/B: compute by the new ridge, memory as it ran)
    assert end.fraction(8 * 10**9, 10**9, 0.1, "memory") == pytest.approx(0.5)
    with pytest.raises(ValueError, match="positive"):
        start.rechecked(0.0)


def test_the_header_shows_both_copy_measurements_and_warns_of_drift():
    data = {
        "backend": "b",
        "device": "cpu",
        "machine": {
            "cpu_model": "x",
            "arch": "x86_64",
            "cpu_count": 2,
            "isa_flags": ["avx2"],
            "torch": "2.13.0",
            "threads": 2,
        },
        "ceilings": {
            "bandwidth_bytes_per_s": 20e9,
            "peak_flops_per_s": 150e9,
            "ridge_flops_per_byte": 7.5,
            "matmul": [{"dtype": "float32", "size": 512, "flops_per_s": 150e9}],
            "copy": {"rates_bytes_per_s": [15e9, 20e9], "drift": 1 / 3},
        },
        "eviction": {"llc_bytes": 32 << 20, "llc_source": "sysfs", "buffer_bytes": 64 << 20},
        "method": {"caches": "cold", "quick": False},
    }
    lines = header_lines(data)
    assert "copy 20.00 GB/s (best of 15.00, 20.00: start, end)" in lines[2]
    assert any(line.startswith("note: the copy bandwidth moved by 33%") for line in lines)
    data["ceilings"]["copy"] = {"rates_bytes_per_s": [19e9, 20e9], "drift": 20 / 19 - 1}
    assert not any(line.startswith("note:") for line in header_lines(data))


def test_quick_lm_head_is_memory_bound_on_a_cpu_like_roofline():
    cpu = Ceilings(bandwidth=25e9, peak_flops=1e12)  # ridge 40 FLOP/B
    head = C.GemmCase("lm_head", 1, 128256, 4096, C.BF16, C.FP32, "lm_head")
    big = C.GemmCase("lm_head", 256, 128256, 4096, C.BF16, C.FP32, "lm_head")
    assert cpu.classify(head.flops(), head.nbytes()) == "memory"  # ~1 FLOP/B
    assert cpu.classify(big.flops(), big.nbytes()) == "compute"  # ~170 FLOP/B


# ---- statistics and the sampling rule ------------------------------------------------------------


def test_summary_statistics():
    s = summarize([7.0, 1.0, 10.0, 4.0, 2.0, 9.0, 3.0, 8.0, 6.0, 5.0])
    assert (s.n, s.median, s.mean, s.min, s.total) == (10, 5.5, 5.5, 1.0, 55.0)
    assert s.p10 == pytest.approx(1.9)  # rank 0.9 between 1 and 2
    assert s.p90 == pytest.approx(9.1)  # rank 8.1 between 9 and 10
    assert s.spread == pytest.approx(7.2 / 5.5)
    one = summarize([3.0])
    assert (one.median, one.p10, one.p90, one.spread) == (3.0, 3.0, 3.0, 0.0)
    assert percentile([1.0, 2.0, 3.0, 4.0], 25) == pytest.approx(1.75)
    with pytest.raises(ValueError):
        summarize([])
    with pytest.raises(ValueError):
        percentile([1.0], 101)


class Clock:
    """Time that passes only when the measured function (or the eviction) says so."""

    def __init__(self) -> None:
        self.now = 0.0
        self.calls = 0

    def __call__(self) -> float:
        return self.now

    def work(self, seconds: float):
        def fn() -> None:
            self.now += seconds
            self.calls += 1

        return fn


def timed(call_s: float, method: Method, evict_s: float | None = None):
    clock = Clock()
    evict = None
    if evict_s is not None:

        def evict() -> None:
            clock.now += evict_s

    stats = measure(clock.work(call_s), method, sync=lambda: None, evict=evict, clock=clock)
    return stats, clock


def test_sampling_stops_at_target_and_min_samples():
    stats, clock = timed(0.3, Method(warmup=2, target_s=1.0, min_samples=3, cap_s=100))
    assert stats.n == 4  # 0.9 s after three samples, 1.2 s after four
    assert clock.calls == 6  # two warm-up calls are not samples
    assert stats.median == pytest.approx(0.3)
    stats, _ = timed(0.6, Method(warmup=0, target_s=1.0, min_samples=5, cap_s=100))
    assert stats.n == 5  # the target is met at 2 samples, the minimum is not


def test_sampling_respects_max_samples_and_the_wall_cap():
    stats, _ = timed(0.01, Method(warmup=0, target_s=1.0, min_samples=3, max_samples=50))
    assert stats.n == 50
    stats, _ = timed(5.0, Method(warmup=0, target_s=100, min_samples=5, cap_s=12))
    assert stats.n == 3  # 15 s of wall time after three samples: over the 12 s cap
    stats, _ = timed(40.0, Method(warmup=0, target_s=1, min_samples=5, cap_s=30))
    assert stats.n == 1  # at least one sample, however slow


def test_eviction_is_outside_the_samples_but_inside_the_cap():
    stats, _ = timed(
        0.3, Method(warmup=0, target_s=100, min_samples=1, max_samples=1000, cap_s=5), 1.0
    )
    assert stats.n == 4  # 1.3 s per round: 5.2 s of wall after four rounds
    assert stats.total == pytest.approx(1.2)  # the eviction seconds are in no sample


def test_method_rejects_inconsistent_counts():
    with pytest.raises(ValueError):
        Method(min_samples=10, max_samples=5)
    with pytest.raises(ValueError):
        Method(target_s=0)


# ---- cache sizes from the machine ----------------------------------------------------------------


def _cache(root: Path, cpu: int, index: int, level: int, kind: str, size: str, shared: str):
    d = root / f"cpu{cpu}" / "cache" / f"index{index}"
    d.mkdir(parents=True)
    for name, value in (("level", level), ("type", kind), ("size", size)):
        (d / name).write_text(f"{value}\n")
    (d / "shared_cpu_list").write_text(shared + "\n")


def test_sysfs_llc_sums_distinct_instances(tmp_path: Path):
    # two CCDs of two cores, each CCD with its own 32 MiB L3
    for cpu in range(4):
        _cache(tmp_path, cpu, 0, 1, "Data", "32K", str(cpu))
        _cache(tmp_path, cpu, 1, 1, "Instruction", "32K", str(cpu))
        _cache(tmp_path, cpu, 2, 2, "Unified", "512K", str(cpu))
        _cache(tmp_path, cpu, 3, 3, "Unified", "32768K", "0-1" if cpu < 2 else "2-3")
    assert sysfs_llc(tmp_path) == CacheSize(64 * MiB, "sysfs: L3, 2 instance(s)")
    assert sysfs_llc(tmp_path / "missing") is None


def test_lscpu_llc_and_sizes():
    text = (
        "L1d cache:  64 KiB (2 instances)\nL1i cache: 64 KiB (2 instances)\n"
        "L2 cache:   1 MiB (2 instances)\nL3 cache:   384 MiB (12 instances)\n"
    )
    assert lscpu_llc(text) == CacheSize(384 * MiB, "lscpu: L3")
    assert lscpu_llc("Model name: AMD EPYC") is None
    assert parse_size("32768K") == parse_size("32 MiB") == 32 * MiB
    assert parse_size("1.5 MiB") == 1_572_864
    with pytest.raises(ValueError, match="cache size"):
        parse_size("lots")


def test_eviction_and_copy_buffers_scale_with_the_cache():
    assert eviction_bytes(CacheSize(32 * MiB, "x")) == 64 * MiB
    assert eviction_bytes(CacheSize(1 * MiB, "x")) == 8 * MiB
    assert copy_buffer_bytes(32 * MiB) == 256 * MiB
    assert copy_buffer_bytes(384 * MiB) == 1536 * MiB


def test_isa_flags_keep_the_kernel_relevant_ones():
    flags = frozenset({"avx2", "avx512_bf16", "amx_tile", "fma", "smep", "smap", "sme", "sve2"})
    assert isa_flags(flags | {"sme2", "pclmulqdq", "i8mm"}) == [
        "amx_tile", "avx2", "avx512_bf16", "fma", "i8mm", "sme", "sme2", "sve2"
    ]  # fmt: skip
