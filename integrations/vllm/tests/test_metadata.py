"""vLLM's per-step metadata becomes plugin-api's ``AttentionBatch``: decodes counted from the front
(vLLM reorders them there for the bridge), host int tensors in the contract's dtypes."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.needs_vllm


def common(query_lens: list[int], seq_lens: list[int], block: int = 16) -> object:
    from vllm.v1.attention.backend import CommonAttentionMetadata

    n = len(query_lens)
    qsl = torch.zeros(n + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(torch.tensor(query_lens), 0)
    width = max((s + block - 1) // block for s in seq_lens)
    table = torch.arange(n * width, dtype=torch.int32).reshape(n, width)
    slots = []
    for i, (q, s) in enumerate(zip(query_lens, seq_lens, strict=True)):
        slots += [int(table[i, p // block]) * block + p % block for p in range(s - q, s)]
    tokens = int(qsl[-1])
    return CommonAttentionMetadata(
        query_start_loc=qsl,
        query_start_loc_cpu=qsl,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        num_reqs=n,
        num_actual_tokens=tokens,
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
        block_table_tensor=table,
        slot_mapping=torch.tensor([*slots, -1, -1], dtype=torch.int64),  # padded, as vLLM may
    )


@pytest.mark.parametrize(
    ("query_lens", "limit", "decodes"),
    [
        ([1, 1, 7, 3], 1, 2),
        ([2, 3, 1, 9], 3, 3),  # speculative decodes carry up to 1 + num_speculative_tokens
        ([5, 1], 1, 0),  # a prefill first: nothing before it counts as a decode
        ([1, 1], 1, 2),
    ],
)
def test_decodes_are_counted_from_the_front(
    query_lens: list[int], limit: int, decodes: int
) -> None:
    from plugin_api_vllm.attention import attention_batch

    from plugin_api.ops.attention import AttentionSpec, validate_batch

    seq_lens = [q + 20 for q in query_lens]
    batch = attention_batch(common(query_lens, seq_lens), limit)
    assert batch.num_decodes == decodes
    assert batch.query_lens.tolist() == query_lens
    assert batch.seq_lens.dtype == torch.int32 and batch.slot_mapping.dtype == torch.int64
    assert batch.slot_mapping.shape[0] == sum(query_lens)  # padding rows are not the batch's
    spec = AttentionSpec(4, 2, 16, dtype=torch.float32, num_speculative_tokens=limit - 1)
    validate_batch(spec, batch)  # the contract's own checks accept what the bridge built
