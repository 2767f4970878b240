"""Op-level resolution: own implementations first, visible fallback, strict mode, traces."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch

import plugin_api as pa
from plugin_api.backend import Backend, backend_for
from plugin_api.contract.graphs import GraphLevel, GraphSupport, resolve_model_graph_level
from plugin_api.errors import FallbackRefused, UnsupportedSpec
from plugin_api.ops.gemm import GemmProblem
from plugin_api.ops.primitive_cache import PrimitiveCache
from plugin_api.selection import PluginApiWarning
from plugin_api.settings import Settings

from .distributions import write_plugin

# A plugin whose quant kernel only does int8 with group 128: anything else must fall back.
PICKY_HOOKS = """
from plugin_api import Availability, Decision, hookimpl
from plugin_api.reference.quant import ReferenceQuant
import torch

class PickyQuant(ReferenceQuant):
    name = "fx-picky:quant"
    def supports(self, spec, info):
        if spec.dtype != torch.int8 or spec.group_size != 128:
            return Decision.reject("only int8 with group_size 128")
        return Decision.accept("int8 g128 kernel")

@hookimpl
def plugin_api_probe(info):
    return Availability.validated("cpu", "fixture")

@hookimpl
def plugin_api_implementations(family):
    return (PickyQuant(),)
"""


def picky(site, strict: bool = False) -> Backend:
    write_plugin(
        site, dist="fx-picky", backend_id="fx-picky", package="fx_picky", hooks=PICKY_HOOKS
    )
    return backend_for("fx-picky", settings=Settings(strict=strict))


def test_own_implementation_is_chosen(site, clean_env):
    be = picky(site)
    with pa.record_ops() as calls:
        pa.per_token_group_quant(torch.randn(2, 256), 128, backend=be)
    assert [(c.impl, c.fallback) for c in calls] == [("fx-picky:quant", False)]


def test_fallback_is_visible_and_warned_once(site, clean_env):
    be = picky(site)
    x = torch.randn(2, 256)
    with warnings.catch_warnings(record=True) as w, pa.record_ops() as calls:
        warnings.simplefilter("always")
        pa.per_token_group_quant(x, 64, backend=be)
        pa.per_token_group_quant(x, 64, backend=be)
    assert [(c.impl, c.backend, c.fallback) for c in calls] == [
        ("reference", "reference", True)
    ] * 2
    fallback_warnings = [x for x in w if issubclass(x.category, PluginApiWarning)]
    assert len(fallback_warnings) == 1
    msg = str(fallback_warnings[0].message)
    assert "backend 'fx-picky' does not support K=256 group=64 fp32->int8" in msg
    assert "falling back to reference" in msg and "only int8 with group_size 128" in msg


def test_strict_refuses_fallback(site, clean_env):
    be = picky(site, strict=True)
    with pytest.raises(FallbackRefused, match="PLUGIN_API_STRICT=1 forbids fallbacks"):
        pa.per_token_group_quant(torch.randn(2, 256), 64, backend=be)


def test_trace_lists_every_candidate(site, clean_env):
    be = picky(site)
    r = be.explain(pa.OpFamily.QUANT, pa.QuantSpec(256, 64, torch.float32, torch.int8))
    assert [(c.impl, c.accepted, c.chosen, c.fallback) for c in r.trace] == [
        ("fx-picky:quant", False, False, False),
        ("reference", True, True, True),
    ]
    assert r.trace[0].reason == "only int8 with group_size 128"
    r = be.explain(pa.OpFamily.QUANT, pa.QuantSpec(256, 128, torch.float32, torch.int8))
    assert r.trace[1].reason == "also accepts, lower preference than fx-picky:quant"


def test_unsupported_everywhere_is_an_error_with_trace():
    be = backend_for("reference")
    spec = pa.AttentionSpec(4, 2, 32, dcp_size=2)
    with pytest.raises(UnsupportedSpec) as e:
        pa.attention(spec, be)
    assert "no implementation of backend 'reference' accepts h4/kv2/d32 bf16 block=16 dcp=2" in (
        str(e.value)
    )
    assert "decode context parallelism spans several ranks" in str(e.value)


# ---- primitive cache keyed by the full GEMM descriptor ---------------------------------------

BASE = GemmProblem(
    m=16,
    n=4096,
    k=4096,
    a_dtype=torch.bfloat16,
    b_dtype=torch.bfloat16,
    c_dtype=torch.float32,
    bias_dtype=None,
    a_row_stride=4096,
    c_row_stride=4096,
    scaled=False,
    usage="lm_head",
    variant="default",
)
OTHER = {
    "m": 17,
    "n": 4097,
    "k": 4095,
    "a_dtype": torch.float16,
    "b_dtype": torch.int8,
    "c_dtype": torch.bfloat16,
    "bias_dtype": torch.float32,
    "a_row_stride": 8192,
    "c_row_stride": 8192,
    "scaled": True,
    "usage": "linear",
    "variant": "f32-dst",
}


def test_every_descriptor_field_is_in_the_key():
    assert set(OTHER) == {f.name for f in dataclasses.fields(GemmProblem)}, "cover every field"
    cache: PrimitiveCache[GemmProblem, object] = PrimitiveCache()
    built = []
    base = cache.get_or_build(BASE, lambda p: built.append(p) or object())
    for name, value in OTHER.items():
        changed = dataclasses.replace(BASE, **{name: value})
        prim = cache.get_or_build(changed, lambda p: built.append(p) or object())
        assert prim is not base, f"{name} is not part of the primitive key"
    assert len(built) == 1 + len(OTHER)
    assert cache.get_or_build(BASE, lambda p: object()) is base  # a hit


def test_same_shape_bf16_and_f32_out_never_share():
    cache: PrimitiveCache[GemmProblem, str] = PrimitiveCache()
    f32 = cache.get_or_build(BASE, lambda p: f"dst={p.c_dtype}")
    bf16 = cache.get_or_build(
        dataclasses.replace(BASE, c_dtype=torch.bfloat16), lambda p: f"dst={p.c_dtype}"
    )
    assert (f32, bf16) == ("dst=torch.float32", "dst=torch.bfloat16")


def test_cache_evicts_least_recently_used():
    cache: PrimitiveCache[int, int] = PrimitiveCache(capacity=2)
    for key in (1, 2, 1, 3):
        cache.get_or_build(key, lambda k: k)
    assert 2 not in cache and 1 in cache and 3 in cache
    assert cache.stats().evictions == 1
    assert cache.problems() == (1, 3)  # least recently used first


# ---- CUDA-graph levels over a model ------------------------------------------------------------


def test_model_level_is_the_minimum_with_its_cause():
    layers = [
        ("full", GraphSupport(GraphLevel.ALWAYS, "fine")),
        ("swa", GraphSupport(GraphLevel.UNIFORM_SINGLE_TOKEN_DECODE, "varlen decode not safe")),
        ("other", GraphSupport(GraphLevel.UNIFORM_BATCH, "xqa")),
    ]
    m = resolve_model_graph_level(layers, num_speculative_tokens=2)
    assert m.level == GraphLevel.UNIFORM_SINGLE_TOKEN_DECODE and m.limited_by == "swa"
    assert m.reason == "swa: varlen decode not safe"
    assert any("speculative decode (2 draft tokens) cannot be captured" in d for d in m.downgrades)


def test_levels_are_ordered():
    assert (
        GraphLevel.NEVER
        < GraphLevel.UNIFORM_SINGLE_TOKEN_DECODE
        < GraphLevel.UNIFORM_BATCH
        < GraphLevel.ALWAYS
    )
    full = resolve_model_graph_level([("a", GraphSupport(GraphLevel.ALWAYS, "ok"))])
    assert full.limited_by is None and full.downgrades == ()
