"""Reference paged attention: a per-sequence loop over gathered blocks, all math in fp32.

Written to be obviously right (it is the oracle), vectorised per sequence so that it is not
needlessly slow. Follows docs/ops.md exactly; combinations that page leaves undefined are
rejected in ``supports``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from plugin_api.contract.decision import Decision, ImplPath
from plugin_api.contract.graphs import GraphLevel, GraphSupport, unless_refused
from plugin_api.device_info import DeviceInfo
from plugin_api.ops.attention import FP8, FP8_MAX, AttentionBatch, AttentionSpec, KVCache


@dataclass(frozen=True, slots=True)
class ReferencePlan:
    query_start: tuple[int, ...]
    seq_lens: tuple[int, ...]
    block_table: torch.Tensor  # on the device
    slot_mapping: torch.Tensor  # [num_tokens] on the device
    num_tokens: int


def quantize_fp8(x: torch.Tensor, scale: float) -> torch.Tensor:
    """``x / scale`` saturated to +-448, cast with round-to-nearest-even."""
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)


class ReferenceAttention:
    name = "reference"
    path = ImplPath.REFERENCE

    def supports(self, spec: AttentionSpec, info: DeviceInfo) -> Decision:
        reasons = []
        if spec.dcp_size > 1:
            reasons.append(
                f"dcp_size={spec.dcp_size}: decode context parallelism spans several ranks; "
                "the reference runs in one process"
            )
        if spec.q_dtype != spec.dtype:
            reasons.append(
                f"query_dtype={spec.q_dtype} differs from dtype={spec.dtype}: undefined by the "
                "op semantics (output dtype = query dtype)"
            )
        if reasons:
            return Decision.reject(*reasons)
        return Decision.accept("eager torch: every feature of the op semantics")

    def graph_support(self, spec: AttentionSpec, info: DeviceInfo) -> GraphSupport:
        return unless_refused(
            self.supports(spec, info),
            lambda: GraphSupport(
                GraphLevel.NEVER,
                "reference attention loops over sequences in Python with lengths read on the host",
            ),
        )

    def plan(
        self, spec: AttentionSpec, batch: AttentionBatch, device: torch.device, reuse: object
    ) -> ReferencePlan:
        tokens = batch.num_tokens if batch.num_seqs else 0
        return ReferencePlan(
            query_start=tuple(batch.query_start_loc.tolist()),
            seq_lens=tuple(batch.seq_lens.tolist()),
            # copies (copy=True: `.to` returns the same tensor when nothing changes): the plan
            # owns what it validated, whatever the caller does to its batch before run()
            block_table=batch.block_table.to(device, torch.int64, copy=True),
            slot_mapping=batch.slot_mapping[:tokens].to(device, copy=True),
            num_tokens=tokens,
        )

    def write_kv(
        self,
        spec: AttentionSpec,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: KVCache,
        plan: ReferencePlan,
    ) -> None:
        slots = plan.slot_mapping
        keep = slots >= 0
        idx = slots[keep]
        block, offset = idx // spec.block_size, idx % spec.block_size
        k, v = key[: plan.num_tokens][keep], value[: plan.num_tokens][keep]
        if spec.fp8_kv:
            k, v = quantize_fp8(k, kv_cache.k_scale), quantize_fp8(v, kv_cache.v_scale)
        # data[block, kv, :, offset, :] selects [tokens, num_kv_heads, head_size]
        kv_cache.data[block, 0, :, offset, :] = k.to(kv_cache.data.dtype)
        kv_cache.data[block, 1, :, offset, :] = v.to(kv_cache.data.dtype)

    def forward(
        self,
        spec: AttentionSpec,
        query: torch.Tensor,
        kv_cache: KVCache,
        plan: ReferencePlan,
        sinks: torch.Tensor | None,
        out: torch.Tensor,
    ) -> None:
        bs, kh, d = spec.block_size, spec.num_kv_heads, spec.head_size
        group = spec.num_heads // kh
        for s, seq_len in enumerate(plan.seq_lens):
            q0, q1 = plan.query_start[s], plan.query_start[s + 1]
            n = q1 - q0
            nblk = -(-seq_len // bs)
            blocks = kv_cache.data[plan.block_table[s, :nblk]]  # [nblk, 2, kh, bs, d]
            k = blocks[:, 0].permute(1, 0, 2, 3).reshape(kh, nblk * bs, d)[:, :seq_len].float()
            v = blocks[:, 1].permute(1, 0, 2, 3).reshape(kh, nblk * bs, d)[:, :seq_len].float()
            if spec.fp8_kv:
                k, v = k * kv_cache.k_scale, v * kv_cache.v_scale
            q = query[q0:q1].float().view(n, kh, group, d)
            z = torch.einsum("nkgd,kld->kgnl", q, k) * spec.softmax_scale  # [kh, g, n, L]
            if spec.logits_soft_cap:
                c = spec.logits_soft_cap
                z = c * torch.tanh(z / c)
            visible = self._visible(spec, n, seq_len, query.device)  # [n, L]
            z = z.masked_fill(~visible, float("-inf"))
            if sinks is not None:
                sink = sinks.view(kh, group, 1, 1).expand(kh, group, n, 1)
                p = torch.softmax(torch.cat([z, sink], dim=-1), dim=-1)[..., :-1]
            else:
                p = torch.softmax(z, dim=-1)
            # a row with no visible key (and no sink) is 0/0: it outputs zeros; a NaN of a
            # visible key must stay NaN, so only those rows are cleared
            p = torch.where(visible.any(-1, keepdim=True), p, 0.0)
            # a key can be masked only for a multi-token step or past a window (host facts)
            masked = spec.causal and (
                n > 1 or (spec.sliding_window is not None and seq_len > spec.sliding_window)
            )
            o = _weighted_sum(p, v, visible if masked else None)  # [kh, g, n, d]
            out[q0:q1] = o.permute(2, 0, 1, 3).reshape(n, spec.num_heads, d).to(out.dtype)

    @staticmethod
    def _visible(spec: AttentionSpec, n: int, seq_len: int, device: torch.device) -> torch.Tensor:
        pos = torch.arange(seq_len - n, seq_len, device=device).unsqueeze(1)  # query positions
        key = torch.arange(seq_len, device=device).unsqueeze(0)
        if not spec.causal:
            return torch.ones((n, seq_len), dtype=torch.bool, device=device)
        visible = key <= pos
        if spec.sliding_window is not None:
            visible &= key > pos - spec.sliding_window
        return visible


def _weighted_sum(p: torch.Tensor, v: torch.Tensor, visible: torch.Tensor | None) -> torch.Tensor:
    """``o[k, g, n] = sum of p[k, g, n, j] * v[k, j]`` over the keys ``j`` query ``n`` sees.

    ``p`` ``[kh, g, n, L]`` is 0 where a key is masked, ``v`` is ``[kh, L, d]``, ``visible``
    ``[n, L]`` (None: every key is visible). A product would still add ``0 * inf = NaN`` for a
    masked key holding a non-finite value, so with a mask the finite values are summed as a
    product and each non-finite value of a *visible* key is added by the IEEE rules a plain
    sum would follow: NaN stays NaN, ``p * inf`` is inf for ``p > 0`` and NaN for ``p == 0``,
    and opposite infinities make NaN. No data-dependent branch: no device sync.
    """
    if visible is None:
        return torch.einsum("kgnl,kld->kgnd", p, v)
    finite = torch.isfinite(v)
    o = torch.einsum("kgnl,kld->kgnd", p, torch.where(finite, v, 0.0))

    def any_of(weights: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """Whether some key with a nonzero weight holds one of ``values`` (bool masks)."""
        return torch.einsum("kgnl,kld->kgnd", weights.float(), values.float()) > 0

    seen = visible.expand_as(p)
    live = p > 0  # only visible keys have p > 0
    nan = any_of(seen, torch.isnan(v)) | any_of(seen & ~live, torch.isinf(v))
    o = o + torch.where(any_of(live, v == float("inf")), float("inf"), 0.0)
    o = o + torch.where(any_of(live, v == float("-inf")), float("-inf"), 0.0)  # inf - inf: NaN
    return torch.where(nan, float("nan"), o)


def implementations() -> tuple[ReferenceAttention]:
    return (ReferenceAttention(),)
