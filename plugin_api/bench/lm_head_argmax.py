"""How often a bf16 LM-head output changes the greedy token, compared with fp32 output.

Not a timing: both outputs come from the same backend's ``mm`` on the same prepared weight
shape (``usage="lm_head"``), over rows of random hidden states and a Llama-2-sized vocabulary.
A row "flips" when ``argmax`` differs; with bf16 output that happens when the top two logits
round to the same bf16 value (``argmax`` then takes the lower index) or swap order. The logits
are scaled to a spread typical of a trained head (standard deviation about 3), where the bf16
spacing near the top logit is 1/32 to 1/16.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TypedDict

import torch

from ..backend import Backend
from ..ops.gemm import mm, prepare

VOCAB = 32_000
HIDDEN = 4_096
LOGIT_STD = 3.0
ROWS_FULL = 4_096
ROWS_QUICK = 256
CHUNK = 256  # rows per mm call: bounded memory for the two logit blocks


class ArgmaxFlipsDict(TypedDict):
    """``ArgmaxFlips.to_dict()``: the report's ``lm_head_argmax`` entry."""

    what: str
    rows: int
    vocab: int
    hidden: int
    logit_std: float
    flips: int
    ties_in_bf16: int
    flip_rate: float


@dataclass(frozen=True, slots=True)
class ArgmaxFlips:
    rows: int
    vocab: int
    hidden: int
    flips: int  # rows whose bf16-out argmax differs from the fp32-out argmax
    ties: int  # rows whose bf16 maximum occurs more than once

    @property
    def rate(self) -> float:
        return self.flips / self.rows

    def to_dict(self) -> ArgmaxFlipsDict:
        return {
            "what": "greedy argmax of bf16-out vs fp32-out LM-head logits, same backend",
            "rows": self.rows,
            "vocab": self.vocab,
            "hidden": self.hidden,
            "logit_std": LOGIT_STD,
            "flips": self.flips,
            "ties_in_bf16": self.ties,
            "flip_rate": self.rate,
        }


def measure(
    backend: Backend,
    *,
    quick: bool,
    vocab: int = VOCAB,
    hidden: int = HIDDEN,
    rows: int | None = None,
    seed: int = 0,
) -> ArgmaxFlips:
    rows = rows if rows is not None else ROWS_QUICK if quick else ROWS_FULL
    device = torch.device(backend.device_type)
    g = torch.Generator().manual_seed(seed)
    # x rows have norm ~sqrt(HIDDEN); this weight scale gives logits of std ~LOGIT_STD
    w = (torch.randn(vocab, hidden, generator=g) * (LOGIT_STD / math.sqrt(hidden))).to(
        device=device, dtype=torch.bfloat16
    )
    fp32 = prepare(w, out_dtype=torch.float32, usage="lm_head", backend=backend)
    bf16 = prepare(w, out_dtype=torch.bfloat16, usage="lm_head", backend=backend)
    del w
    out32 = torch.empty((CHUNK, vocab), dtype=torch.float32, device=device)
    out16 = torch.empty((CHUNK, vocab), dtype=torch.bfloat16, device=device)
    flips = ties = 0
    for start in range(0, rows, CHUNK):
        n = min(CHUNK, rows - start)
        x = torch.randn(n, hidden, generator=g).to(device=device, dtype=torch.bfloat16)
        a = mm(x, fp32, out=out32[:n])
        b = mm(x, bf16, out=out16[:n])
        flips += int((a.argmax(-1) != b.argmax(-1)).sum())
        ties += int(((b == b.amax(-1, keepdim=True)).sum(-1) > 1).sum())
    return ArgmaxFlips(rows, vocab, hidden, flips, ties)


def lines(d: ArgmaxFlipsDict) -> list[str]:
    return [
        f"LM-head argmax, bf16-out vs fp32-out ({d['rows']} rows, vocab {d['vocab']}, "
        f"logit std {d['logit_std']}): {d['flips']} flips ({100 * float(d['flip_rate']):.2f}%), "
        f"{d['ties_in_bf16']} rows with a tied bf16 maximum"
    ]
