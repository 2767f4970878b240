"""Hypothesis strategies for fuzz cases: a valid call of one op, then zero to three mutations.

A case is plain JSON data (``{"kind", "seed", "base", "mutations"}``), so that it crosses into a
worker process, is printed as a finding's reproducer and is read back by ``--replay``. The
worker (``build.py``) turns it into tensors; nothing here imports torch.

Values that JSON cannot hold are tagged strings: ``"@nan"``, ``"@inf"``, ``"@-inf"``,
``"@dtype:int8"`` (a torch dtype), ``"@str"`` (a string where a number belongs).
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

Case = dict[str, Any]

KINDS = (
    "attention",
    "mm",
    "scaled_mm",
    "per_token_group_quant",
    "copy_state_blocks",
    "zero_state_blocks",
)

# every dtype a mutation may swap in (besides the op's own)
ODD_DTYPES = (
    "bfloat16",
    "float16",
    "float32",
    "float64",
    "int8",
    "uint8",
    "int32",
    "int64",
    "bool",
    "float8_e4m3fn",
    "float8_e5m2",
    "complex64",
)
MODEL_DTYPES = ("bfloat16", "float16", "float32")

# Per kind: the tensor arguments generic mutations target, the optional ones a mutation may add
# or drop, the (output, other) pairs that may share memory, and the scalar parameters with
# the values a mutation may give them.
SLOTS: dict[str, tuple[str, ...]] = {
    "attention": (
        "query",
        "key",
        "value",
        "kv_cache.data",
        "sinks",
        "out",
        "batch.query_start_loc",
        "batch.seq_lens",
        "batch.block_table",
        "batch.slot_mapping",
    ),
    "mm": ("weight", "x", "bias", "out", "weight_scale"),
    "scaled_mm": ("weight", "weight_scale", "x_q", "x_scale", "bias", "out"),
    "per_token_group_quant": ("x", "out", "out_scales"),
    "copy_state_blocks": ("states[0]", "states[1]", "src_ids", "dst_ids"),
    "zero_state_blocks": ("states[0]", "states[1]", "ids"),
}
OPTIONAL: dict[str, tuple[str, ...]] = {
    "attention": ("sinks", "out", "key", "value"),
    "mm": ("bias", "out", "weight_scale"),
    "scaled_mm": ("bias", "out", "weight_scale"),
    "per_token_group_quant": ("out", "out_scales"),
    "copy_state_blocks": (),
    "zero_state_blocks": (),
}
ALIASES: dict[str, tuple[tuple[str, str], ...]] = {
    "attention": (
        ("out", "query"),
        ("out", "key"),
        ("out", "value"),
        ("out", "kv_cache.data"),
        ("out", "sinks"),
        ("kv_cache.data", "query"),
        ("kv_cache.data", "key"),
        ("kv_cache.data", "value"),
        ("key", "value"),
    ),
    "mm": (("out", "x"), ("out", "bias"), ("x", "bias"), ("out", "weight")),
    "scaled_mm": (("out", "x_q"), ("out", "x_scale"), ("out", "bias"), ("x_q", "x_scale")),
    "per_token_group_quant": (("out", "x"), ("out_scales", "x"), ("out", "out_scales")),
    "copy_state_blocks": (
        ("states[1]", "states[0]"),
        ("states[0]", "src_ids"),
        ("dst_ids", "src_ids"),
    ),
    "zero_state_blocks": (("states[1]", "states[0]"), ("states[0]", "ids")),
}
_NUM = ("@nan", "@inf", "@-inf", "@str", 0, -1, 0.0, -1.0, True, None, 2.5, 10**12)
_DTYPE_VALUES = (*(f"@dtype:{d}" for d in ODD_DTYPES), None, "@str", 1)
PARAMS: dict[str, dict[str, tuple[Any, ...]]] = {
    "attention": {
        "spec.num_heads": (0, -4, 3, 5, True, 2.0, None, 10**6),
        "spec.num_kv_heads": (0, -1, 3, 64, True, None),
        "spec.head_size": (0, -32, 8, 24, 80, 31, 1024, True),
        "spec.dtype": _DTYPE_VALUES,
        "spec.kv_cache_dtype": _DTYPE_VALUES,
        "spec.query_dtype": _DTYPE_VALUES,
        "spec.block_size": (0, -16, 1, 7, 8, 24, 512, True),
        "spec.sliding_window": (0, -1, 1, 3, 10**9, True, 2.5),
        "spec.logits_soft_cap": _NUM,
        "spec.scale": _NUM,
        "spec.has_sinks": (True, False, 1, "@str"),
        "spec.causal": (True, False),
        "spec.kv_sharing": (True, False),
        "spec.dcp_size": (0, 2, -1, True),
        "spec.num_speculative_tokens": (-1, 0, 1, 3, True, 2.5),
        "kv_cache.k_scale": (*_NUM, 0.5, 2.0, 1),
        "kv_cache.v_scale": (*_NUM, 0.5, 2.0, 1),
        "batch.num_decodes": (-1, 0, 1, 2, 3, 4, 10**9, True, 1.5, None),
        "num_blocks": ("@exact", "@used", 0, -1, True, 2.5, 10**9, None, "@str"),
    },
    "mm": {"out_dtype": _DTYPE_VALUES, "usage": ("linear", "lm_head", "conv", None, 3, "")},
    "scaled_mm": {"out_dtype": _DTYPE_VALUES, "usage": ("linear", "lm_head", "conv", None)},
    "per_token_group_quant": {
        "group_size": (0, -1, 1, 3, 7, 16, 10**9, True, 2.5, None, "@str"),
        "dtype": _DTYPE_VALUES,
        "eps": (*_NUM, 1e-45, 1e30, 1),
        "column_major_scales": (True, False, 1, None, "@str"),
        "scale_ue8m0": (True, False, 1, None),
    },
    "copy_state_blocks": {},
    "zero_state_blocks": {},
}
# mutations that only make sense for one kind: name -> choices
SPECIAL: dict[str, dict[str, tuple[str, ...]]] = {
    "attention": {
        "plan_of": ("other_spec", "reference", "other_batch", "not_plan", "none"),
        "reuse": ("other_batch", "other_spec", "reference", "not_plan", "same"),
        "batch_type": ("dict", "none", "tuple"),
        "kv_cache_type": ("tensor", "none", "dict"),
    },
    "mm": {"packed": ("other_kind", "not_packed", "other_k", "none")},
    "scaled_mm": {"packed": ("other_kind", "not_packed", "other_k", "none")},
    "per_token_group_quant": {},
    "copy_state_blocks": {"states": ("tuple", "empty", "tensor", "dup", "blocks", "none", "one")},
    "zero_state_blocks": {"states": ("tuple", "empty", "tensor", "dup", "blocks", "none", "one")},
}
STRIDED = ("step", "permute", "pad_last", "expand")
SET_VALUES = ("oob", "-1", "-2", "0", "max", "min", "nan", "inf", "-inf", "huge", "dup")
REPLACE = ("none", "list", "int", "float", "str")
ALIAS_AT = ("same", "half", "end", "one")

_small = st.integers(0, 2**31 - 1)
_frac = st.integers(0, 1000)


def _mutation(kind: str) -> st.SearchStrategy[dict[str, Any]]:
    slot = st.sampled_from(SLOTS[kind])
    options: list[st.SearchStrategy[dict[str, Any]]] = [
        st.fixed_dictionaries(
            {"m": st.just("dtype"), "slot": slot, "dtype": st.sampled_from(ODD_DTYPES)}
        ),
        st.fixed_dictionaries(
            {"m": st.just("rank"), "slot": slot, "up": st.booleans(), "dim": _frac}
        ),
        st.fixed_dictionaries(
            {
                "m": st.just("size"),
                "slot": slot,
                "dim": _frac,
                "delta": st.sampled_from((-1, 1, 7, -1000)),
            }
        ),
        st.fixed_dictionaries({"m": st.just("zero"), "slot": slot, "dim": _frac}),
        st.fixed_dictionaries(
            {"m": st.just("strided"), "slot": slot, "how": st.sampled_from(STRIDED), "dim": _frac}
        ),
        st.fixed_dictionaries({"m": st.just("device"), "slot": slot}),
        st.fixed_dictionaries(
            {"m": st.just("replace"), "slot": slot, "with": st.sampled_from(REPLACE)}
        ),
        st.fixed_dictionaries(
            {
                "m": st.just("set"),
                "slot": slot,
                "value": st.sampled_from(SET_VALUES),
                "at": _frac,
                "all": st.booleans(),
            }
        ),
    ]
    if ALIASES[kind]:
        options.append(
            st.fixed_dictionaries(
                {
                    "m": st.just("alias"),
                    "pair": st.sampled_from(ALIASES[kind]).map(list),
                    "at": st.sampled_from(ALIAS_AT),
                }
            )
        )
    if OPTIONAL[kind]:
        options.append(
            st.fixed_dictionaries({"m": st.just("toggle"), "slot": st.sampled_from(OPTIONAL[kind])})
        )
    if PARAMS[kind]:
        options.append(
            st.sampled_from(sorted(PARAMS[kind])).flatmap(
                lambda name: st.fixed_dictionaries(
                    {
                        "m": st.just("param"),
                        "name": st.just(name),
                        "value": st.sampled_from(PARAMS[kind][name]),
                    }
                )
            )
        )
    for name, choices in SPECIAL[kind].items():
        options.append(
            st.fixed_dictionaries({"m": st.just(name), "which": st.sampled_from(choices)})
        )
    return st.one_of(options)


@st.composite
def _attention_base(draw: st.DrawFn) -> dict[str, Any]:
    kv_heads = draw(st.sampled_from((1, 2)))
    spec_tokens = draw(st.sampled_from((0, 0, 1, 2)))
    causal = draw(st.booleans() | st.just(True))
    fp8 = draw(st.integers(0, 4)) == 0
    spec = {
        "num_heads": kv_heads * draw(st.sampled_from((1, 2, 4))),
        "num_kv_heads": kv_heads,
        "head_size": draw(st.sampled_from((16, 32, 64, 8, 48))),
        "dtype": draw(st.sampled_from(MODEL_DTYPES)),
        "kv_cache_dtype": "float8_e4m3fn" if fp8 else None,
        "block_size": draw(st.sampled_from((16, 32, 8))),
        "sliding_window": draw(st.none() | st.integers(1, 40)) if causal else None,
        "logits_soft_cap": draw(st.sampled_from((None, None, 30.0, 1.5))),
        "has_sinks": draw(st.booleans()),
        "causal": causal,
        "kv_sharing": draw(st.integers(0, 5)) == 0,
        "num_speculative_tokens": spec_tokens,
    }

    def batch() -> dict[str, Any]:
        n = draw(st.integers(0, 3))
        decodes = draw(st.integers(0, n))
        qlens = [draw(st.integers(1, 1 + spec_tokens)) for _ in range(decodes)]
        qlens += [draw(st.integers(1, 12)) for _ in range(n - decodes)]
        seq_lens = [q + draw(st.integers(0, 40)) for q in qlens]
        return {"query_lens": qlens, "seq_lens": seq_lens, "num_decodes": decodes}

    return {
        "spec": spec,
        "batch": batch(),
        "other_batch": batch(),
        "pad_rows": draw(st.sampled_from((0, 0, 1, 3))),
        "skip": draw(st.integers(0, 3)) == 0,
        "scales": draw(st.sampled_from(([1.0, 1.0], [0.5, 2.0]))) if fp8 else [1.0, 1.0],
        "num_blocks": draw(st.booleans()),
        "out": draw(st.booleans()),
    }


def _gemm_base(scaled: bool) -> st.SearchStrategy[dict[str, Any]]:
    out_dtypes = (None, *MODEL_DTYPES) if scaled else (None, "float32")
    return st.fixed_dictionaries(
        {
            "m": st.sampled_from((0, 1, 2, 3, 5, 8, 17)),
            "n": st.sampled_from((1, 3, 8, 16, 33, 64)),
            "k": st.sampled_from((1, 5, 8, 16, 32, 48, 96)),
            "dtype": st.sampled_from(MODEL_DTYPES),
            "out_dtype": st.sampled_from(out_dtypes),
            "usage": st.sampled_from(("linear", "lm_head")),
            "bias": st.sampled_from((None, "out", "float32") if scaled else (None, "w", "float32")),
            "out": st.booleans(),
            "row_pad": st.sampled_from((0, 0, 3)),
            "scale_2d": st.booleans(),
        }
    )


def _quant_base() -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {
            "m": st.sampled_from((0, 1, 2, 3, 5, 9)),
            "groups": st.integers(1, 4),
            "group_size": st.sampled_from((1, 2, 8, 16, 32, 64, 128, 7)),
            "in_dtype": st.sampled_from(MODEL_DTYPES),
            "dtype": st.sampled_from(("int8", "float8_e4m3fn")),
            "eps": st.sampled_from((1e-10, 1e-4)),
            "column_major_scales": st.booleans(),
            "scale_ue8m0": st.booleans(),
            "out": st.booleans(),
            "out_scales": st.booleans(),
        }
    )


@st.composite
def _state_base(draw: st.DrawFn, copy: bool) -> dict[str, Any]:
    nb = draw(st.integers(1, 8))
    shapes = draw(
        st.lists(st.lists(st.integers(1, 5), min_size=1, max_size=3), min_size=1, max_size=2)
    )
    dtypes = [draw(st.sampled_from(MODEL_DTYPES)) for _ in shapes]
    ids = draw(st.permutations(range(nb)))
    n = draw(st.integers(0, nb // 2 if copy else nb))
    base: dict[str, Any] = {
        "num_blocks": nb,
        "shapes": shapes,
        "dtypes": dtypes,
        "id_dtype": draw(st.sampled_from(("int64", "int32"))),
    }
    if copy:
        base["src"], base["dst"] = list(ids[:n]), list(ids[n : 2 * n])
    else:
        base["ids"] = list(ids[:n])
    return base


def _base(kind: str) -> st.SearchStrategy[dict[str, Any]]:
    if kind == "attention":
        return _attention_base()
    if kind in ("mm", "scaled_mm"):
        return _gemm_base(kind == "scaled_mm")
    if kind == "per_token_group_quant":
        return _quant_base()
    return _state_base(kind == "copy_state_blocks")


def case(kind: str) -> st.SearchStrategy[Case]:
    """Cases of one kind: a valid call (about one in seven left valid), then mutations."""
    return st.fixed_dictionaries(
        {
            "kind": st.just(kind),
            "seed": _small,
            "base": _base(kind),
            "mutations": st.sampled_from((0, 1, 1, 1, 2, 2, 3)).flatmap(
                lambda n: st.lists(_mutation(kind), min_size=n, max_size=n)
            ),
        }
    )


def cases(kinds: tuple[str, ...] = KINDS) -> st.SearchStrategy[Case]:
    return st.sampled_from(kinds).flatmap(case)
