"""What the host enforces around every kernel call (issue 30): outputs the kernel may not
rebind, plans that belong to one implementation, soft-cap values, overlapping outputs, batch
entries past the cache, and the warnings of automatic selection."""

from __future__ import annotations

import time
import warnings
from pathlib import Path

import pytest
import torch

import plugin_api as pa
from plugin_api import selection as selection_module
from plugin_api.conformance.cases import make_case
from plugin_api.errors import FallbackRefused, ImplementationError, SelectionError
from plugin_api.ops.attention import AttentionBatch
from plugin_api.registry import load_plugins
from plugin_api.selection import PluginApiWarning, process_selection
from plugin_api.settings import Settings

from .distributions import write_plugin

SPEC = pa.AttentionSpec(4, 2, 32, torch.bfloat16, block_size=16)


@pytest.fixture(scope="module")
def ref() -> pa.Backend:
    return pa.backend_for("reference")


def fresh_case(spec: pa.AttentionSpec = SPEC):
    return make_case(spec, [1, 3], [17, 20], num_decodes=1, device="cpu", seed=1)


def raw(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8).clone()


# ---- item 3: a kernel may not rebind its output -------------------------------------------------

ROGUE_DESCRIPTOR = """
from plugin_api.contract import BackendDescriptor
DESCRIPTOR = BackendDescriptor(
    id={id!r}, host_api=">=1.0,<2", priority=50, families=("attention", "gemm", "quant", "state"),
    device_kinds=("cpu",), hooks={hooks!r}, summary="test fixture: kernels that rebind outputs",
)
"""

# The reference kernels, each followed by what a buggy kernel does: ``t.data = ...`` swaps the
# caller's tensor for another one (here: another dtype, or another shape) behind its back.
ROGUE_HOOKS = """
import torch
from plugin_api import Availability, hookimpl
from plugin_api.reference.attention import ReferenceAttention
from plugin_api.reference.gemm import ReferenceGemm
from plugin_api.reference.quant import ReferenceQuant
from plugin_api.reference.state import ReferenceState

class RogueAttention(ReferenceAttention):
    name = "fx-rogue:attention"
    def forward(self, spec, query, kv_cache, plan, sinks, out):
        super().forward(spec, query, kv_cache, plan, sinks, out)
        out.data = out.data.to(torch.float32)

class RogueGemm(ReferenceGemm):
    name = "fx-rogue:gemm"
    def mm(self, spec, x, payload, bias, out):
        super().mm(spec, x, payload, bias, out)
        out.data = out.data.to(torch.float64)

class RogueQuant(ReferenceQuant):
    name = "fx-rogue:quant"
    def quantize(self, spec, x, eps, out_q, out_scales):
        super().quantize(spec, x, eps, out_q, out_scales)
        out_scales.data = out_scales.data.contiguous()

class RogueState(ReferenceState):
    name = "fx-rogue:state"
    def zero_blocks(self, spec, states, ids):
        super().zero_blocks(spec, states, ids)
        states[0].data = states[0].data[:1].clone()

@hookimpl
def plugin_api_probe(info):
    return Availability.validated("cpu", "test fixture")

@hookimpl
def plugin_api_implementations(family):
    return (dict(attention=RogueAttention, gemm=RogueGemm, quant=RogueQuant,
                 state=RogueState)[str(family)](),)
"""


@pytest.fixture
def rogue(site: Path, clean_env: None) -> pa.Backend:
    write_plugin(
        site,
        dist="fx-rogue",
        backend_id="fx-rogue",
        package="fx_rogue",
        descriptor=ROGUE_DESCRIPTOR,
        hooks=ROGUE_HOOKS,
    )
    return pa.backend_for("fx-rogue", settings=Settings(strict=True))


def test_attention_kernel_that_rebinds_out_is_caught(rogue: pa.Backend) -> None:
    case = fresh_case()
    attn = pa.attention(SPEC, rogue)
    out = torch.empty(case.query.shape, dtype=torch.bfloat16)
    with pytest.raises(ImplementationError, match=r"fx-rogue:attention.*\bout\b.*bfloat16"):
        attn.run(case.query, case.key, case.value, case.cache, attn.plan(case.batch), out=out)


def test_mm_kernel_that_rebinds_out_is_caught(rogue: pa.Backend) -> None:
    packed = pa.prepare(torch.randn(8, 16, dtype=torch.bfloat16), backend=rogue)
    x = torch.randn(3, 16, dtype=torch.bfloat16)
    with pytest.raises(ImplementationError, match=r"fx-rogue:gemm.*\bout\b"):
        pa.mm(x, packed)  # the host's own out: returning it rebound would hand back fp64
    with pytest.raises(ImplementationError, match=r"fx-rogue:gemm.*\bout\b"):
        pa.mm(x, packed, out=torch.empty(3, 8, dtype=torch.bfloat16))


def test_quant_kernel_that_rebinds_scales_is_caught(rogue: pa.Backend) -> None:
    x = torch.randn(4, 64)
    with pytest.raises(ImplementationError, match=r"fx-rogue:quant.*out_scales.*strides"):
        pa.per_token_group_quant(x, 32, column_major_scales=True, backend=rogue)


def test_state_kernel_that_rebinds_a_state_is_caught(rogue: pa.Backend) -> None:
    states = [torch.ones(4, 3), torch.ones(4, 2)]
    with pytest.raises(ImplementationError, match=r"fx-rogue:state.*states\[0\].*shape"):
        pa.zero_state_blocks(states, torch.tensor([1]), backend=rogue)


# ---- item 7: a plan belongs to the implementation that made it ----------------------------------

OTHER_ATTENTION_DESCRIPTOR = ROGUE_DESCRIPTOR.replace(
    '("attention", "gemm", "quant", "state")', '("attention",)'
)
OTHER_ATTENTION_HOOKS = """
from dataclasses import dataclass
from plugin_api import Availability, hookimpl
from plugin_api.reference.attention import ReferenceAttention

@dataclass(frozen=True)
class OwnPlan:  # what the cache write reads looks like the reference's; the rest does not
    slot_mapping: object
    num_tokens: int
    inner: object

class OtherAttention(ReferenceAttention):
    name = "fx-other:attention"
    def plan(self, spec, batch, device, reuse):
        inner = super().plan(spec, batch, device, None)
        return OwnPlan(inner.slot_mapping, inner.num_tokens, inner)
    def forward(self, spec, query, kv_cache, plan, sinks, out):
        super().forward(spec, query, kv_cache, plan.inner, sinks, out)

@hookimpl
def plugin_api_probe(info):
    return Availability.validated("cpu", "test fixture")

@hookimpl
def plugin_api_implementations(family):
    return (OtherAttention(),)
"""


def test_plan_of_another_backend_is_refused_before_any_write(
    site: Path, clean_env: None, ref: pa.Backend
) -> None:
    write_plugin(
        site,
        dist="fx-other",
        backend_id="fx-other",
        package="fx_other",
        descriptor=OTHER_ATTENTION_DESCRIPTOR,
        hooks=OTHER_ATTENTION_HOOKS,
    )
    other = pa.attention(SPEC, pa.backend_for("fx-other", settings=Settings(strict=True)))
    mine = pa.attention(SPEC, ref)
    case = fresh_case()
    before = raw(case.cache.data)
    for attn, plan in ((mine, other.plan(case.batch)), (other, mine.plan(case.batch))):
        with pytest.raises(TypeError, match=r"attention\.run: plan .*made by"):
            attn.run(case.query, case.key, case.value, case.cache, plan)
        assert torch.equal(raw(case.cache.data), before)
        with pytest.raises(TypeError, match=r"attention\.plan: reuse .*made by"):
            attn.plan(case.batch, reuse=plan)
    # an Attention of the same backend and spec shares the implementation: its plans are fine
    again = pa.attention(SPEC, ref)
    again.run(case.query, case.key, case.value, case.cache, mine.plan(case.batch))


# ---- item 9: logits_soft_cap --------------------------------------------------------------------


@pytest.mark.parametrize("cap", [float("inf"), float("-inf"), float("nan"), 0.0, -1.0, "30"])
def test_soft_cap_must_be_positive_and_finite(cap: object) -> None:
    with pytest.raises((TypeError, ValueError), match=r"AttentionSpec: logits_soft_cap="):
        pa.AttentionSpec(4, 2, 32, logits_soft_cap=cap)  # type: ignore[arg-type]


def test_soft_cap_accepts_finite_positive_values() -> None:
    assert pa.AttentionSpec(4, 2, 32, logits_soft_cap=30).logits_soft_cap == 30


# ---- item 10: outputs may not overlap anything else of the call ---------------------------------


def _attention_overlaps(case):
    q, k, v = case.query, case.key, case.value
    t = q.shape[0]
    qbuf = torch.empty((t + 1, 4, 32), dtype=torch.bfloat16)
    qbuf[:t] = q
    shifted_q = qbuf[:t]  # ``out`` one row below it overlaps all but one row of ``query``
    flat = torch.zeros(case.cache.data.numel(), dtype=torch.bfloat16)
    kbuf = torch.empty(2 * q.numel(), dtype=torch.bfloat16)
    out_over_key = kbuf[: q.numel()].view(q.shape)
    key_in_out = kbuf[q.numel() // 2 : q.numel() // 2 + k.numel()].view(k.shape)
    key_in_out.copy_(k)
    return {
        "out is query": (dict(out=q), ("out", "query")),
        "out partly overlaps query": (
            dict(query=shifted_q, out=qbuf[1:]),
            ("out", "query"),
        ),
        "out overlaps key": (dict(key=key_in_out, out=out_over_key), ("out", "key")),
        "value is a view of the cache": (
            dict(value=case.cache.data[0, 1, :, : v.shape[0], :].transpose(0, 1)),
            ("kv_cache.data", "value"),
        ),
        "out inside the cache": (
            dict(out=case.cache.data.view(-1)[: q.numel()].view(q.shape)),
            ("out", "kv_cache.data"),
        ),
        "cache overlaps out": (
            dict(
                cache=pa.KVCache(flat.view(case.cache.data.shape)),
                out=flat[5 : 5 + q.numel()].view(q.shape),
            ),
            ("out", "kv_cache.data"),
        ),
    }


@pytest.mark.parametrize(
    "name",
    [
        "out is query",
        "out partly overlaps query",
        "out overlaps key",
        "value is a view of the cache",
        "out inside the cache",
        "cache overlaps out",
    ],
)
def test_attention_refuses_overlapping_outputs(ref: pa.Backend, name: str) -> None:
    case = fresh_case()
    attn = pa.attention(SPEC, ref)
    plan = attn.plan(case.batch)
    change, names = _attention_overlaps(case)[name]
    args = dict(query=case.query, key=case.key, value=case.value, cache=case.cache, out=None)
    args.update(change)
    cache = args["cache"]
    before = raw(cache.data)
    out_before = None if args["out"] is None else raw(args["out"])
    with pytest.raises(ValueError) as e:
        attn.run(args["query"], args["key"], args["value"], cache, plan, out=args["out"])
    msg = str(e.value)
    assert msg.startswith("attention.run: ") and "overlap" in msg, msg
    assert all(n in msg for n in names), msg
    assert torch.equal(raw(cache.data), before)
    if out_before is not None:
        assert torch.equal(raw(args["out"]), out_before)


def test_attention_accepts_disjoint_views_of_one_buffer(ref: pa.Backend) -> None:
    """Not every output in a shared buffer overlaps: interleaved row slices are disjoint."""
    case = fresh_case()
    attn = pa.attention(SPEC, ref)
    buf = torch.zeros((case.query.shape[0], 2, 2, 32), dtype=torch.bfloat16)
    key = buf[:, 0]  # rows of ``key`` and ``value`` alternate in one buffer
    key.copy_(case.key)
    value = buf[:, 1]
    value.copy_(case.value)
    out = attn.run(case.query, key, value, case.cache, attn.plan(case.batch))
    expected = attn.run(case.query, case.key, case.value, fresh_case().cache, attn.plan(case.batch))
    assert torch.equal(out, expected)


def test_mm_refuses_overlapping_out(ref: pa.Backend) -> None:
    w = torch.randn(16, 16)
    packed = pa.prepare(w, backend=ref)
    x = torch.randn(4, 16)
    buf = torch.randn(5, 16)
    bbuf = torch.randn(32)
    bias = bbuf[:16]
    for out, x_, b, names in [
        (x, x, None, ("out", "x")),  # mm(x, packed, out=x)
        (buf[1:], buf[:4], None, ("out", "x")),  # partial: out is x shifted by a row
        (buf[:1].view(16).expand(4, 16), x, None, ("out",)),  # out overlaps itself
        (bbuf[8:24].view(1, 16), x[:1], bias, ("out", "bias")),
    ]:
        before = x_.clone()
        with pytest.raises(ValueError) as e:
            pa.mm(x_, packed, b, out=out)
        msg = str(e.value)
        assert msg.startswith("gemm.mm: ") and "overlap" in msg and all(n in msg for n in names)
        assert torch.equal(x_, before)


def test_mm_accepts_disjoint_column_slices_of_one_buffer(ref: pa.Backend) -> None:
    packed = pa.prepare(torch.randn(16, 16), backend=ref)
    buf = torch.randn(4, 32)
    x, out = buf[:, :16], buf[:, 16:]  # same rows, disjoint columns
    expected = pa.mm(x.clone(), packed)
    pa.mm(x, packed, out=out)
    assert torch.equal(out, expected)


def test_scaled_mm_refuses_out_over_its_scales(ref: pa.Backend) -> None:
    packed = pa.prepare(
        torch.ones(4, 8, dtype=torch.int8),
        weight_scale=torch.ones(4),
        out_dtype=torch.float32,
        backend=ref,
    )
    x_q = torch.ones(4, 8, dtype=torch.int8)
    buf = torch.ones(20)
    with pytest.raises(ValueError, match=r"gemm\.scaled_mm: out .*overlaps x_scale"):
        pa.scaled_mm(x_q, buf[:4], packed, out=buf[2:18].view(4, 4))


def test_quant_refuses_overlapping_outputs(ref: pa.Backend) -> None:
    x = torch.randn(4, 64)
    with pytest.raises(ValueError, match=r"per_token_group_quant: out_scales .*overlaps x"):
        pa.per_token_group_quant(x, 32, out_scales=x.view(-1)[:8].view(4, 2), backend=ref)
    buf = torch.zeros(4 * 64, dtype=torch.float8_e4m3fn)
    scales = buf.view(torch.float32)[:8].view(4, 2)
    with pytest.raises(ValueError, match=r"per_token_group_quant: out_scales overlaps out\b"):
        pa.per_token_group_quant(
            x, 32, torch.float8_e4m3fn, out=buf.view(4, 64), out_scales=scales, backend=ref
        )


def test_state_refuses_overlapping_state_tensors(ref: pa.Backend) -> None:
    base = torch.arange(24.0)
    a = base[:12].view(6, 2)
    for states in ([a, a], [a, base[6:18].view(6, 2)]):  # the same tensor; half of it
        with pytest.raises(
            ValueError, match=r"copy_state_blocks: states\[1\] overlaps states\[0\]"
        ):
            pa.copy_state_blocks(states, torch.tensor([0]), torch.tensor([1]), backend=ref)
        with pytest.raises(
            ValueError, match=r"zero_state_blocks: states\[1\] overlaps states\[0\]"
        ):
            pa.zero_state_blocks(states, torch.tensor([1]), backend=ref)
    assert torch.equal(base, torch.arange(24.0))


# ---- item 12: batch entries past the cache, named, in plan() ------------------------------------


def _batch(block_table=None, slot_mapping=None, seq_lens=None) -> AttentionBatch:
    good = fresh_case().batch
    return AttentionBatch(
        query_start_loc=good.query_start_loc,
        seq_lens=good.seq_lens if seq_lens is None else seq_lens,
        block_table=good.block_table if block_table is None else block_table,
        slot_mapping=good.slot_mapping if slot_mapping is None else slot_mapping,
        num_decodes=1,
    )


def test_plan_names_the_batch_field_past_the_cache(ref: pa.Backend) -> None:
    case = fresh_case()
    nb = case.cache.num_blocks
    attn = pa.attention(SPEC, ref)
    table = case.batch.block_table.clone()
    table[1, 1] = nb + 7
    with pytest.raises(ValueError, match=rf"batch\.block_table\[1, 1\]={nb + 7} .*{nb} blocks"):
        attn.plan(_batch(block_table=table), num_blocks=nb)
    slots = case.batch.slot_mapping.clone()
    slots[2] = (nb + 1) * 16 + 3
    with pytest.raises(ValueError, match=rf"batch\.slot_mapping\[2\]={(nb + 1) * 16 + 3} "):
        attn.plan(_batch(slot_mapping=slots), num_blocks=nb)
    # a longer sequence reads a table column past the cache's blocks
    wide = torch.cat([case.batch.block_table, torch.full((2, 1), nb, dtype=torch.int32)], 1)
    lens = case.batch.seq_lens.clone()
    lens[0] = wide.shape[1] * 16
    with pytest.raises(ValueError, match=rf"batch\.block_table\[0, 2\]={nb} .*batch\.seq_lens"):
        attn.plan(_batch(block_table=wide, seq_lens=lens), num_blocks=nb)
    with pytest.raises(TypeError, match=r"attention\.plan: num_blocks"):
        attn.plan(case.batch, num_blocks="12")  # type: ignore[arg-type]


def test_run_names_the_batch_field_past_the_cache(ref: pa.Backend) -> None:
    """Planned without num_blocks, run() still refuses, and says which entry."""
    case = fresh_case()
    attn = pa.attention(SPEC, ref)
    slots = case.batch.slot_mapping.clone()
    slots[3] = 10_000
    plan = attn.plan(_batch(slot_mapping=slots))
    before = raw(case.cache.data)
    with pytest.raises(ValueError, match=r"attention\.run: .*batch\.slot_mapping\[3\]=10000"):
        attn.run(case.query, case.key, case.value, case.cache, plan)
    assert torch.equal(raw(case.cache.data), before)


# ---- item 13: plugins passed over by automatic selection ----------------------------------------

RAISING_PROBE = """
from plugin_api import hookimpl
@hookimpl
def plugin_api_probe(info):
    raise RuntimeError("sensor on fire")
@hookimpl
def plugin_api_implementations(family):
    return ()
"""

HANGING_PROBE = """
import time
from plugin_api import hookimpl
@hookimpl
def plugin_api_probe(info):
    time.sleep(3)
@hookimpl
def plugin_api_implementations(family):
    return ()
"""


@pytest.fixture
def fresh_process(monkeypatch: pytest.MonkeyPatch, clean_env: None) -> None:
    """This process has not selected yet (the real once-per-process path runs again)."""
    monkeypatch.setattr(selection_module, "_process_selection", None)


def _failing_plugins(site: Path) -> None:
    write_plugin(site, dist="fx-raise", backend_id="fx-raise", package="fx_raise",
                 hooks=RAISING_PROBE)  # fmt: skip
    write_plugin(site, dist="fx-hang", backend_id="fx-hang", package="fx_hang",
                 hooks=HANGING_PROBE)  # fmt: skip
    write_plugin(site, dist="fx-broken", backend_id="fx-broken", package="fx_broken",
                 descriptor="import fx_no_such_module_xyz\n")  # fmt: skip


def test_auto_selection_warns_once_per_failed_plugin(
    site: Path, fresh_process: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    _failing_plugins(site)
    monkeypatch.setenv("PLUGIN_API_PROBE_TIMEOUT", "0.5")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        process_selection()
        process_selection()
    texts = [str(x.message) for x in w if issubclass(x.category, PluginApiWarning)]
    for plugin, stage, what in [
        ("fx-raise", "probe", "sensor on fire"),
        ("fx-hang", "probe", "did not finish within 0.5 s"),
        ("fx-broken", "describe", "fx_no_such_module_xyz"),
    ]:
        mine = [t for t in texts if f"'{plugin}'" in t]
        assert len(mine) == 1, texts
        assert f"at stage {stage}" in mine[0] and what in mine[0], mine[0]


def test_auto_selection_in_strict_mode_refuses_failed_plugins(
    site: Path, fresh_process: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    _failing_plugins(site)
    monkeypatch.setenv("PLUGIN_API_PROBE_TIMEOUT", "0.5")
    monkeypatch.setenv("PLUGIN_API_STRICT", "1")
    with pytest.raises(SelectionError) as e:
        process_selection()
    msg = str(e.value)
    assert "PLUGIN_API_STRICT=1" in msg
    assert all(p in msg for p in ("fx-raise", "fx-hang", "fx-broken")), msg


def test_hung_probe_records_the_time_it_took(site: Path, clean_env: None) -> None:
    write_plugin(site, dist="fx-hang", backend_id="fx-hang", package="fx_hang",
                 hooks=HANGING_PROBE)  # fmt: skip
    started = time.perf_counter()
    reg = load_plugins(Settings(probe_timeout=0.4))
    took = time.perf_counter() - started
    r = reg.record("fx-hang")
    assert r is not None and r.failure is not None and r.failure.stage == "probe"
    assert 0.4 <= r.seconds <= took  # the wait it cost, not 0


# ---- item 14: the experimental warning and the strict-mode message ------------------------------


def test_experimental_warning_comes_from_the_status(
    site: Path, fresh_process: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # an experimental plugin whose id contains the chosen backend's: its note mentions both
    write_plugin(site, dist="fx-reference-x", backend_id="fx-reference-x",
                 package="fx_reference_x", status="experimental")  # fmt: skip
    monkeypatch.setenv("PLUGIN_API_PLUGINS", "fx-reference-x")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        chosen = process_selection()
    assert chosen.selection.backend == "reference"
    texts = [str(x.message) for x in w if issubclass(x.category, PluginApiWarning)]
    assert texts == [], texts


def test_experimental_backend_chosen_by_name_is_warned(
    site: Path, fresh_process: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_plugin(site, dist="fx-exp", backend_id="fx-exp", package="fx_exp",
                 status="experimental")  # fmt: skip
    monkeypatch.setenv("PLUGIN_API_BACKEND", "fx-exp")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        process_selection()
    texts = [str(x.message) for x in w if issubclass(x.category, PluginApiWarning)]
    assert len(texts) == 1 and "fx-exp" in texts[0] and "experimental" in texts[0], texts


PICKY_HOOKS = """
from plugin_api import Availability, Decision, hookimpl
from plugin_api.reference.quant import ReferenceQuant
import torch

class PickyQuant(ReferenceQuant):
    name = "fx-picky:quant"
    def supports(self, spec, info):
        if spec.group_size != 128:
            return Decision.reject("only group_size 128")
        return Decision.accept("g128 kernel")

@hookimpl
def plugin_api_probe(info):
    return Availability.validated("cpu", "fixture")

@hookimpl
def plugin_api_implementations(family):
    return (PickyQuant(),)
"""


def test_strict_error_says_what_was_refused(site: Path, clean_env: None) -> None:
    write_plugin(site, dist="fx-picky", backend_id="fx-picky", package="fx_picky",
                 hooks=PICKY_HOOKS)  # fmt: skip
    be = pa.backend_for("fx-picky", settings=Settings(strict=True))
    with pytest.raises(FallbackRefused) as e:
        pa.per_token_group_quant(torch.randn(2, 256), 64, backend=be)
    msg = str(e.value)
    assert "falling back" not in msg, msg
    assert "refused the fallback to reference" in msg and "only group_size 128" in msg, msg


def test_state_block_ids_on_a_device_without_values_are_refused_by_name():
    """Found by the fuzzer: ids on the meta device reached ``.cpu()`` (NotImplementedError)."""
    import torch

    from plugin_api import backend_for, copy_state_blocks, zero_state_blocks

    be = backend_for("reference")
    states = [torch.zeros(4, 3)]
    meta = torch.tensor([1], device="meta")
    with pytest.raises(ValueError, match=r"zero_state_blocks: ids is on meta"):
        zero_state_blocks(states, meta, backend=be)
    with pytest.raises(ValueError, match=r"copy_state_blocks: dst_ids is on meta"):
        copy_state_blocks(states, torch.tensor([0]), meta, backend=be)
    with pytest.raises(
        ValueError, match=r"\[1\] are both source and destination \(in src_ids and dst_ids\)"
    ):
        copy_state_blocks(states, torch.tensor([1]), torch.tensor([1]), backend=be)
    assert not states[0].any()
