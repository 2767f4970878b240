"""Attention cases with NaN and Inf in keys and values that some queries cannot see.

The op contract sums over *visible* keys only: a value a query cannot see (causally masked, or
outside its sliding window) must not reach its output, not even as ``0 * inf = NaN``. A case
here poisons the cache and this step's inputs, and says which output rows see a poisoned key
(those are non-finite by the math); every other row must equal the dense oracle.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

import plugin_api as pa
from plugin_api.conformance.cases import PagedCase, make_case
from plugin_api.conformance.test_attention import TOLERANCE

# (query_lens, seq_lens, num_decodes): decodes, then prefills of several tokens
BATCH = ([1, 1, 5, 6], [40, 9, 37, 6], 2)


@dataclass(frozen=True)
class PoisonedCase:
    case: PagedCase
    sees_poison: torch.Tensor  # bool [num_tokens]: the row sees a non-finite key or value


def _visible(spec: pa.AttentionSpec, pos: int, j: int) -> bool:
    if not spec.causal:
        return True
    return j <= pos and (spec.sliding_window is None or j > pos - spec.sliding_window)


def poisoned_case(spec: pa.AttentionSpec, device: torch.device | str) -> PoisonedCase:
    """``spec`` must have a model-dtype cache (fp8 holds no Inf)."""
    query_lens, seq_lens, num_decodes = BATCH
    case = make_case(spec, query_lens, seq_lens, num_decodes=num_decodes, device=device, seed=3)
    bs = spec.block_size
    table = case.batch.block_table
    qsl = case.batch.query_start_loc.tolist()
    sees = torch.zeros(case.num_tokens, dtype=torch.bool)
    bad = (float("nan"), float("inf"), float("-inf"))
    for s, (n, length) in enumerate(zip(query_lens, seq_lens, strict=True)):
        positions = range(length - n, length)
        poison: dict[int, tuple[float | None, float | None]] = {}  # position -> (k, v)
        # history no query of this step sees (outside every window): NaN/Inf in K and V
        for j in range(length - n):
            if not any(_visible(spec, p, j) for p in positions):
                poison[j] = (bad[j % 3], bad[(j + 1) % 3])
        if n >= 3:  # this step's last tokens: earlier queries of the step must not see them
            poison[length - 1] = (None, float("inf"))
            poison[length - 2] = (float("nan"), None)
        for j, (kv, vv) in poison.items():
            blk, off = int(table[s, j // bs]), j % bs
            new = j >= length - n
            for which, x, full in ((0, kv, case.k_full[s]), (1, vv, case.v_full[s])):
                if x is None:
                    continue
                full[j] = x
                if new:  # written by the step from key/value
                    src = case.key if which == 0 else case.value
                    assert src is not None
                    src[qsl[s] + j - (length - n)] = x
                else:
                    case.cache.data[blk, which, :, off, :] = x
        for i, p in enumerate(positions):
            sees[qsl[s] + i] = any(_visible(spec, p, j) for j in poison)
    return PoisonedCase(case, sees)


def specs() -> dict[str, pa.AttentionSpec]:
    base = dict(num_heads=4, num_kv_heads=2, head_size=32, block_size=16)
    return {
        "causal-bf16": pa.AttentionSpec(**base, dtype=torch.bfloat16),  # type: ignore[arg-type]
        "causal-fp32": pa.AttentionSpec(**base, dtype=torch.float32),  # type: ignore[arg-type]
        "window-bf16": pa.AttentionSpec(  # type: ignore[arg-type]
            **base, dtype=torch.bfloat16, sliding_window=8
        ),
        "window-sinks-fp16": pa.AttentionSpec(  # type: ignore[arg-type]
            **base, dtype=torch.float16, sliding_window=5, has_sinks=True
        ),
        "window-softcap-fp32": pa.AttentionSpec(  # type: ignore[arg-type]
            **base, dtype=torch.float32, sliding_window=12, logits_soft_cap=20.0
        ),
    }


def run_and_check(attn: pa.Attention, poisoned: PoisonedCase) -> None:
    """Rows that see no poison match the dense oracle; rows that see it are non-finite."""
    case = poisoned.case
    out = attn.run(
        case.query, case.key, case.value, case.cache, attn.plan(case.batch), sinks=case.sinks
    )
    got = out[: case.num_tokens].float().cpu()
    clean = ~poisoned.sees_poison
    assert clean.any() and poisoned.sees_poison.any()
    expected = case.expected()
    assert torch.isfinite(expected[clean]).all(), "the oracle let a masked value in"
    bad_rows = (~torch.isfinite(got[clean])).flatten(1).any(1)
    assert not bad_rows.any(), (
        f"rows {clean.nonzero().flatten()[bad_rows].tolist()} see no poisoned key, yet are "
        "non-finite: a masked NaN/Inf reached them"
    )
    torch.testing.assert_close(got[clean], expected[clean], **TOLERANCE[case.spec.dtype])
    seen = (~torch.isfinite(got[poisoned.sees_poison])).flatten(1).any(1)
    assert seen.all(), "a row that sees a NaN/Inf key or value came out finite"
