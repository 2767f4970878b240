"""Bad input never reaches a kernel: every op raises a clean TypeError/ValueError naming the
argument, and a rejected attention call leaves the KV cache untouched."""

from __future__ import annotations

import functools

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import plugin_api as pa
from plugin_api.conformance.cases import QUERY_LAYOUTS, make_case, with_query_layout
from plugin_api.ops.attention import AttentionBatch

SPEC = pa.AttentionSpec(4, 2, 32, torch.bfloat16, block_size=16)


@functools.cache
def reference() -> pa.Backend:
    return pa.backend_for("reference")


@pytest.fixture(scope="module")
def ref():
    return reference()


def fresh_case(spec=SPEC):
    return make_case(spec, [1, 3], [17, 20], num_decodes=1, device="cpu", seed=1)


# Each mutation breaks one thing about a valid attention.run call and names the argument the
# error message must mention.
def _swap_dtype(t, dtype=torch.float16):
    return t.to(dtype)


MUTATIONS = {
    "query dtype": (lambda c: {"query": _swap_dtype(c.query)}, "query"),
    "query rank": (lambda c: {"query": c.query.reshape(c.query.shape[0], -1)}, "query"),
    "query heads": (lambda c: {"query": c.query[:, :3].contiguous()}, "query"),
    # rows and heads may be strided (a fused QKV split); the last dim may not
    "query last dim strided": (
        lambda c: {"query": c.query.transpose(1, 2).contiguous().transpose(1, 2)},
        "query",
    ),
    "query too short": (lambda c: {"query": c.query[:2].contiguous()}, "query"),
    "query not a tensor": (lambda c: {"query": c.query.tolist()}, "query"),
    "key dtype": (lambda c: {"key": _swap_dtype(c.key)}, "key"),
    "key head size": (lambda c: {"key": c.key[..., :16].contiguous()}, "key"),
    "key missing": (lambda c: {"key": None}, "key"),
    "value missing": (lambda c: {"value": None}, "value"),
    "value kv heads": (lambda c: {"value": c.value[:, :1].contiguous()}, "value"),
    "value last dim strided": (
        lambda c: {"value": c.value.transpose(1, 2).contiguous().transpose(1, 2)},
        "value",
    ),
    "cache dtype": (
        lambda c: {"cache": pa.KVCache(c.cache.data.to(torch.float16))},
        "kv_cache.data",
    ),
    "cache layout": (
        lambda c: {"cache": pa.KVCache(c.cache.data.transpose(2, 3))},
        "kv_cache.data",
    ),
    "cache too small": (lambda c: {"cache": pa.KVCache(c.cache.data[:2].contiguous())}, "kv_cache"),
    "fp8 scale on bf16 cache": (
        lambda c: {"cache": pa.KVCache(c.cache.data, k_scale=0.5)},
        "kv_cache.k_scale",
    ),
    "sinks for a spec without sinks": (lambda c: {"sinks": torch.zeros(4)}, "sinks"),
    "out dtype": (lambda c: {"out": torch.empty(c.query.shape, dtype=torch.float32)}, "out"),
    "out shape": (lambda c: {"out": torch.empty((3, 4, 32), dtype=torch.bfloat16)}, "out"),
    "out aliases query": (lambda c: {"out": c.query}, "out"),
}


@pytest.mark.parametrize("name", list(MUTATIONS))
def test_attention_run_rejects(ref, name):
    case = fresh_case()
    attn = pa.attention(SPEC, ref)
    plan = attn.plan(case.batch)
    args = dict(
        query=case.query, key=case.key, value=case.value, cache=case.cache, sinks=None, out=None
    )
    mutate, arg = MUTATIONS[name]
    args.update(mutate(case))
    before = case.cache.data.clone()
    with pytest.raises((TypeError, ValueError)) as e:
        attn.run(
            args["query"],
            args["key"],
            args["value"],
            args["cache"],
            plan,
            sinks=args["sinks"],
            out=args["out"],
        )
    assert arg in str(e.value), str(e.value)
    assert torch.equal(case.cache.data.view(torch.uint8), before.view(torch.uint8))


@pytest.mark.parametrize("name", list(MUTATIONS))
def test_combined_run_check_never_accepts_a_bad_call(ref, name):
    """``run`` skips the argument-by-argument checks when its combined check accepts a call:
    no mutation above may pass it (the errors then come from the full checks)."""
    case = fresh_case()
    attn = pa.attention(SPEC, ref)
    plan = attn.plan(case.batch)
    args = dict(
        query=case.query, key=case.key, value=case.value, cache=case.cache, sinks=None, out=None
    )
    args.update(MUTATIONS[name][0](case))
    a = (args["query"], args["key"], args["value"], args["cache"], plan, args["sinks"])
    assert not attn._accepts_run(*a, args["out"])


WELL_FORMED = {
    "bf16": {},
    "fp8 cache, scales": dict(kv_cache_dtype=torch.float8_e4m3fn),
    "sinks": dict(has_sinks=True),
    "kv sharing": dict(kv_sharing=True),
}


@pytest.mark.parametrize("name", list(WELL_FORMED))
def test_combined_run_check_accepts_well_formed_calls(ref, name):
    """The calls engines make (views of a fused QKV output, padding rows, a preallocated or
    absent ``out``) take the combined check, so eager steps do not pay the full one."""
    spec = pa.AttentionSpec(4, 2, 32, torch.bfloat16, block_size=16, **WELL_FORMED[name])
    scale = 0.5 if spec.fp8_kv else 1.0
    base = make_case(
        spec,
        [1, 3],
        [17, 20],
        num_decodes=1,
        device="cpu",
        seed=1,
        pad_rows=2,
        k_scale=scale,
        v_scale=scale,
    )
    layouts = () if spec.kv_sharing else QUERY_LAYOUTS  # no K/V to lay out beside the query
    attn = pa.attention(spec, ref)
    plan = attn.plan(base.batch)
    for case in (base, *(with_query_layout(base, layout) for layout in layouts)):
        out = torch.empty(case.query.shape, dtype=spec.dtype)
        for o in (out, None):
            a = (case.query, case.key, case.value, case.cache, plan, case.sinks, o)
            assert attn._accepts_run(*a)


def test_kv_sharing_rejects_tensors(ref):
    spec = pa.AttentionSpec(4, 2, 32, torch.bfloat16, kv_sharing=True)
    case = fresh_case(spec)
    attn = pa.attention(spec, ref)
    plan = attn.plan(case.batch)
    k = torch.zeros((4, 2, 32), dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="kv_sharing is set, so key and value must be None"):
        attn.run(case.query, k, k, case.cache, plan)


def test_sinks_required(ref):
    spec = pa.AttentionSpec(4, 2, 32, torch.bfloat16, has_sinks=True)
    case = make_case(spec, [1], [5], num_decodes=1, device="cpu")
    attn = pa.attention(spec, ref)
    with pytest.raises(ValueError, match=r"sinks \[num_heads\] is required"):
        attn.run(case.query, case.key, case.value, case.cache, attn.plan(case.batch))


# ---- batch metadata, generated --------------------------------------------------------------


@st.composite
def broken_batches(draw):
    """A valid batch for SPEC, then one field broken in a random way."""
    n = draw(st.integers(1, 4))
    qlens = [draw(st.integers(1, 4)) for _ in range(n)]
    slens = [q + draw(st.integers(0, 40)) for q in qlens]
    nblocks = [-(-s // 16) for s in slens]
    table = []
    at = 0
    for nb in nblocks:
        table.append(list(range(at, at + nb)))
        at += nb
    slots = []
    for s, (q, length) in enumerate(zip(qlens, slens, strict=True)):
        for p in range(length - q, length):
            slots.append(table[s][p // 16] * 16 + p % 16)
    good = AttentionBatch.from_lists(
        query_lens=qlens, seq_lens=slens, block_table=table, slot_mapping=slots, num_decodes=0
    )
    kind = draw(
        st.sampled_from(
            [
                "block id out of range",
                "negative block id",
                "slot out of range",
                "slot below -1",
                "slot twice",
                "seq shorter than query",
                "table too narrow",
                "wrong dtype",
                "query_start not from 0",
                "empty query",
                "decode too long",
                "num_decodes",
                "on device",
                "rows mismatch",
                "slots too few",
            ]
        )
    )
    f = dict(
        query_start_loc=good.query_start_loc.clone(),
        seq_lens=good.seq_lens.clone(),
        block_table=good.block_table.clone(),
        slot_mapping=good.slot_mapping.clone(),
        num_decodes=0,
    )
    i = draw(st.integers(0, n - 1))
    if kind == "block id out of range":
        f["block_table"][i, 0] = at + 1000  # past any cache the test builds
    elif kind == "negative block id":
        f["block_table"][i, 0] = -3
    elif kind == "slot out of range":
        f["slot_mapping"][0] = (at + 1000) * 16
    elif kind == "slot below -1":
        f["slot_mapping"][0] = -2
    elif kind == "slot twice":
        if f["slot_mapping"].numel() < 2:
            f["slot_mapping"][0] = -2
        else:
            f["slot_mapping"][1] = f["slot_mapping"][0]
    elif kind == "seq shorter than query":
        f["seq_lens"][i] = int(good.query_lens[i]) - 1
    elif kind == "table too narrow":
        f["seq_lens"][i] = f["block_table"].shape[1] * 16 + 1
    elif kind == "wrong dtype":
        f["seq_lens"] = f["seq_lens"].long()
    elif kind == "query_start not from 0":
        f["query_start_loc"] = f["query_start_loc"] + 1
    elif kind == "empty query":
        f["query_start_loc"][i + 1 :] -= int(good.query_lens[i])
    elif kind == "decode too long":
        f["num_decodes"] = n
        f["query_start_loc"][1:] += torch.arange(1, n + 1, dtype=torch.int32) * 5
        f["seq_lens"] += 10 * (torch.arange(n, dtype=torch.int32) + 1)
    elif kind == "num_decodes":
        f["num_decodes"] = n + 1
    elif kind == "on device":
        f["seq_lens"] = f["seq_lens"].to("meta")
    elif kind == "rows mismatch":
        f["block_table"] = f["block_table"][:-1]
    elif kind == "slots too few":
        f["slot_mapping"] = f["slot_mapping"][:-1]
    return AttentionBatch(**f), kind, at


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(broken_batches())
def test_broken_batches_are_rejected_before_any_write(data):
    batch, kind, used_blocks = data
    attn = pa.attention(SPEC, reference())
    cache = attn.allocate_kv_cache(used_blocks + 1)
    before = cache.data.clone()
    try:
        plan = attn.plan(batch)
    except (TypeError, ValueError) as e:
        assert str(e).startswith("attention.plan: "), (kind, str(e))
        return
    # Some breaks only show against the cache (block ids past its end): run must refuse.
    t = plan.num_tokens
    q = torch.zeros((t, 4, 32), dtype=torch.bfloat16)
    k = torch.zeros((t, 2, 32), dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"attention\.run: the batch uses block"):
        attn.run(q, k, k, cache, plan)
    assert torch.equal(cache.data.view(torch.uint8), before.view(torch.uint8))


# ---- gemm / quant / state, generated ------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(
        [
            "x dtype",
            "x k",
            "x rank",
            "x col-major",
            "bias dtype",
            "bias shape",
            "out dtype",
            "out shape",
            "packed",
            "int8 to mm",
        ]
    ),
)
def test_gemm_rejects(kind):
    ref = reference()
    w = torch.randn(16, 8, dtype=torch.bfloat16)
    packed = pa.prepare(w, out_dtype=torch.float32, backend=ref)
    x, bias, out = torch.randn(3, 8, dtype=torch.bfloat16), None, None
    target = packed
    if kind == "x dtype":
        x = x.float()
    elif kind == "x k":
        x = torch.randn(3, 9, dtype=torch.bfloat16)
    elif kind == "x rank":
        x = x.view(3, 2, 4)
    elif kind == "x col-major":
        x = torch.randn(8, 3, dtype=torch.bfloat16).t()
    elif kind == "bias dtype":
        bias = torch.zeros(16, dtype=torch.float16)
    elif kind == "bias shape":
        bias = torch.zeros(15)
    elif kind == "out dtype":
        out = torch.empty(3, 16, dtype=torch.bfloat16)
    elif kind == "out shape":
        out = torch.empty(3, 17)
    elif kind == "packed":
        target = w
    elif kind == "int8 to mm":
        target = pa.prepare(
            torch.zeros(16, 8, dtype=torch.int8), weight_scale=torch.ones(16), backend=ref
        )
    with pytest.raises((TypeError, ValueError)) as e:
        pa.mm(x, target, bias, out=out)
    assert str(e.value).startswith("gemm.mm: ")


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(weight=torch.zeros(4, 4, dtype=torch.int8)), "needs weight_scale"),
        (dict(weight=torch.zeros(4, 4), weight_scale=torch.ones(4)), "only for int8 weights"),
        (
            dict(weight=torch.zeros(4, 4, dtype=torch.bfloat16), out_dtype=torch.float16),
            "use torch.bfloat16 or float32",
        ),
        (dict(weight=torch.zeros(4, 4), usage="embedding"), "usage='embedding' is not one of"),
        (dict(weight=torch.zeros(4)), "weight must have 2 dims"),
        (
            dict(weight=torch.zeros(4, 4, dtype=torch.int8), weight_scale=torch.ones(3)),
            "weight_scale.shape[0]=3, expected 4",
        ),
    ],
)
def test_prepare_rejects(kwargs, message):
    with pytest.raises((TypeError, ValueError)) as e:
        pa.prepare(backend=reference(), **kwargs)
    assert message in str(e.value) and str(e.value).startswith("gemm.prepare: ")


@settings(max_examples=200, deadline=None)
@given(
    m=st.integers(0, 5),
    k=st.sampled_from([64, 100, 128, 130]),
    group=st.sampled_from([0, 32, 64, 128, -1]),
    dtype=st.sampled_from([torch.int8, torch.float8_e4m3fn, torch.int16, torch.bfloat16]),
    in_dtype=st.sampled_from([torch.bfloat16, torch.float32, torch.int32, torch.float64]),
    eps=st.sampled_from([1e-10, 0.0, -1.0, float("nan")]),
    transpose=st.booleans(),
)
def test_quant_validates_everything(m, k, group, dtype, in_dtype, eps, transpose):
    ref = reference()
    x = torch.ones((k, m) if transpose else (m, k), dtype=in_dtype)
    if transpose:
        x = x.t()
    try:
        q, s = pa.per_token_group_quant(x, group, dtype, eps, backend=ref)
    except (TypeError, ValueError) as e:
        assert str(e).startswith("per_token_group_quant: "), str(e)
        return
    # only fully valid calls get here
    assert in_dtype in (torch.bfloat16, torch.float32) and dtype in (
        torch.int8,
        torch.float8_e4m3fn,
    )
    assert group > 0 and k % group == 0 and eps > 0 and (not transpose or m <= 1)
    assert q.shape == (m, k) and s.shape == (m, k // group)


@pytest.mark.parametrize(
    "src,dst,message",
    [
        ([0, 1], [2, 2], "dst_ids repeats a block id"),
        ([0, 1], [1, 3], "both source and destination"),
        ([0], [12], "dst_ids holds block id 12, outside [0, 12)"),
        ([-1], [3], "src_ids holds block id -1"),
        ([0, 1], [3], "src_ids has 2 ids, dst_ids has 1"),
    ],
)
def test_state_copy_rejects(src, dst, message):
    states = [torch.zeros(12, 3, 2), torch.zeros(12, 4)]
    before = [t.clone() for t in states]
    with pytest.raises(ValueError) as e:
        pa.copy_state_blocks(states, torch.tensor(src), torch.tensor(dst), backend=reference())
    assert message in str(e.value)
    assert all(torch.equal(a, b) for a, b in zip(states, before, strict=True))


def test_state_tensors_must_agree():
    with pytest.raises(ValueError, match=r"states\[1\] has 5 blocks, states\[0\] has 12"):
        pa.zero_state_blocks(
            [torch.zeros(12, 2), torch.zeros(5, 2)],
            torch.tensor([0]),
            backend=reference(),
        )
