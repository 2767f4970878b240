"""The state-cache manager's bookkeeping cost per engine step, at short and long context.

Not a kernel case (nothing moves through memory): the replay times only the manager's calls
(``plugin_api.state_cache.cost``). Reported as seconds per step at each context length and the
ratio long/short, measured in the same run: it must stay near 1 (no per-step work grows with
context length).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..state_cache.cost import manager_cost_per_step

SHORT_CONTEXT = 4_096
LONG_CONTEXT = 480_000
MODE = "align"
BLOCK_SIZE = 3584


@dataclass(frozen=True, slots=True)
class ManagerCost:
    mode: str
    block_size: int
    num_speculative_tokens: int
    num_requests: int
    contexts: tuple[int, ...]
    seconds_per_step: tuple[float, ...]

    @property
    def ratio(self) -> float:
        """Cost per step at the longest context over the shortest."""
        return self.seconds_per_step[-1] / self.seconds_per_step[0]

    def to_dict(self) -> dict[str, object]:
        return {
            "what": "state-cache manager bookkeeping per engine step (replay, decode phase)",
            "mode": self.mode,
            "block_size": self.block_size,
            "num_speculative_tokens": self.num_speculative_tokens,
            "num_requests": self.num_requests,
            "per_context": [
                {"context_tokens": c, "seconds_per_step": s}
                for c, s in zip(self.contexts, self.seconds_per_step, strict=True)
            ],
            "ratio_long_over_short": self.ratio,
        }


def measure(*, quick: bool) -> ManagerCost:
    steps, repeats = (64, 3) if quick else (256, 7)
    contexts = (SHORT_CONTEXT, LONG_CONTEXT)
    seconds = tuple(
        manager_cost_per_step(
            c,
            mode=MODE,
            block_size=BLOCK_SIZE,
            num_speculative_tokens=5,
            num_requests=8,
            steps=steps,
            repeats=repeats,
        )
        for c in contexts
    )
    return ManagerCost(MODE, BLOCK_SIZE, 5, 8, contexts, seconds)


def lines(d: dict[str, object]) -> list[str]:
    per = d["per_context"]
    assert isinstance(per, list)
    parts = ", ".join(
        f"{p['context_tokens'] // 1000}k: {p['seconds_per_step'] * 1e6:.1f} us/step" for p in per
    )
    return [
        f"state manager ({d['mode']}, {d['num_requests']} requests, "
        f"{d['num_speculative_tokens']} draft tokens): {parts}; "
        f"long/short x{d['ratio_long_over_short']:.2f}"
    ]
