"""A random-weight transformers Llama served through the KV block manager and the ops: 4 prompts
of different lengths, a prefill step, 32 decode steps and a fork (parallel sampling, whose
partly filled last block is copied on write) give transformers' own greedy tokens in fp32.

The engine is the block between the ``engine`` markers: everything an engine does per step
(schedule, copy, plan once, RoPE and norms, run per layer, sample).
"""

from __future__ import annotations

import random

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

import plugin_api as pa
from plugin_api.kv_cache import KVBlockPool, KVCacheManager
from plugin_api.kv_cache.tensors import copy_kv_blocks

BLOCK_SIZE = 16  # the native CPU kernels take multiples of 16
NUM_BLOCKS = 40
DECODE_STEPS = 32
FORK_AT = 5  # after this decode step, sequence 1 forks (22 tokens cached: a partial block)
PROMPT_LENS = (3, 16, 21, 37)


# ---- engine ------------------------------------------------------------------------------
@torch.inference_mode()
def forward(model, attn, caches, step, ids: torch.Tensor) -> torch.Tensor:
    """One step of the model over the step's tokens; the logits of each sequence's last one."""
    copy_kv_blocks(caches, step.copies)  # copy-on-write, before any layer writes
    plan = attn.plan(step.attention_batch(), num_blocks=caches[0].num_blocks)  # once per step
    m, t = model.model, step.num_tokens
    h = m.embed_tokens(ids)
    cos, sin = m.rotary_emb(h, torch.tensor([step.positions]))
    for layer, cache in zip(m.layers, caches, strict=True):
        a = layer.self_attn
        x = layer.input_layernorm(h)  # RMSNorm, then q/k/v, then RoPE on q and k
        q = a.q_proj(x).view(t, -1, a.head_dim)
        k = a.k_proj(x).view(t, -1, a.head_dim)
        v = a.v_proj(x).view(t, -1, a.head_dim)
        q, k = apply_rotary_pos_emb(q, k, cos[0], sin[0], unsqueeze_dim=1)
        o = attn.run(q, k, v, cache, plan)  # writes K/V, attends
        h = h + a.o_proj(o.view(t, -1))
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    return model.lm_head(m.norm(h[list(step.last_token_indices)]))


def serve(model, backend, prompts: list[list[int]]):
    """Prefill every prompt in one step, then decode greedily; fork sequence 1 at FORK_AT into
    "fork", which continues from its second-best token."""
    c = model.config
    spec = pa.AttentionSpec(
        c.num_attention_heads,
        c.num_key_value_heads,
        c.head_dim,
        torch.float32,
        block_size=BLOCK_SIZE,
    )
    attn = pa.attention(spec, backend)
    caches = [attn.allocate_kv_cache(NUM_BLOCKS) for _ in model.model.layers]
    manager = KVCacheManager(KVBlockPool(NUM_BLOCKS), block_size=spec.block_size)
    tokens: dict[object, list[int]] = {i: list(p) for i, p in enumerate(prompts)}
    for i in tokens:
        manager.add_sequence(i)
    work = {i: len(p) for i, p in tokens.items()}  # the prefill step
    steps = []
    for t in range(1 + DECODE_STEPS):
        step = manager.schedule(work)
        ids = [
            tok
            for i, n in zip(step.seq_ids, step.query_lens, strict=True)
            for tok in tokens[i][-n:]
        ]
        logits = forward(model, attn, caches, step, torch.tensor(ids))
        for i, row in zip(step.seq_ids, logits, strict=True):
            tokens[i].append(int(row.argmax()))
        if t == 1 + FORK_AT:
            manager.fork(1, "fork")  # shares every block, the partial last one too
            second = int(logits[step.seq_ids.index(1)].topk(2).indices[1])
            tokens["fork"] = [*tokens[1][:-1], second]
        work = dict.fromkeys(tokens, 1)  # decodes: each sequence's newest token
        steps.append(step)
    for i in tokens:
        manager.free(i)
    return attn, tokens, steps, manager


# ---- engine ------------------------------------------------------------------------------


def greedy(model, prompt: list[int], n: int) -> list[int]:
    """transformers' own greedy continuation (full forward each token, no cache of ours)."""
    ids = list(prompt)
    with torch.inference_mode():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids


@pytest.fixture(scope="module")
def model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        initializer_range=0.2,  # logits far apart: greedy choices are no near-ties
        dtype=torch.float32,
    )
    return LlamaForCausalLM(cfg).eval()


@pytest.mark.parametrize("backend_id", ["reference", "cpu-arm-acl"])
def test_llama_through_the_block_manager_gives_transformers_greedy_tokens(model, backend_id):
    rng = random.Random(0)
    prompts = [[rng.randrange(256) for _ in range(n)] for n in PROMPT_LENS]
    attn, tokens, steps, manager = serve(model, pa.backend_for(backend_id), prompts)
    assert attn.provenance.backend == backend_id and not attn.provenance.fallback
    assert steps[0].num_decodes == 0 and steps[0].query_lens == PROMPT_LENS
    assert steps[-1].num_decodes == steps[-1].num_seqs == 5
    # the first step after the fork copied the parent's partial last block; nothing else did
    fork_step = 2 + FORK_AT
    assert len(steps[fork_step].copies) == 1 and not any(
        s.copies for s in steps if s is not steps[fork_step]
    )
    assert manager.pool.num_free == NUM_BLOCKS  # everything back
    for i, prompt in enumerate(prompts):
        assert tokens[i] == greedy(model, prompt, 1 + DECODE_STEPS), f"prompt {i}"
    start = len(prompts[1]) + 1 + FORK_AT + 1  # the child's prompt: the parent's, then its token
    child = tokens["fork"]
    assert child[: start - 1] == tokens[1][: start - 1] and child[start - 1] != tokens[1][start - 1]
    assert child == greedy(model, child[:start], len(child) - start)
