"""The plugin's ``PLUGIN_API_ONEDNN_*`` settings, parsed in one place (declared in the descriptor).

- ``PLUGIN_API_ONEDNN_ROOT``: a oneDNN install prefix (``lib/libdnnl.so*``, ``include/``), e.g. one
  built with ACL on aarch64. Unset: the ``onednn-cpu-gomp`` wheels (x86_64).
- ``PLUGIN_API_ONEDNN_THREADS``: OpenMP threads for the plugin's kernels (default: torch's count).
- ``PLUGIN_API_ONEDNN_LM_HEAD``: the ``LmHeadPolicy``, e.g. ``min_n=64000,min_m=9``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields

from plugin_api.errors import SettingError

ROOT = "PLUGIN_API_ONEDNN_ROOT"
THREADS = "PLUGIN_API_ONEDNN_THREADS"
LM_HEAD = "PLUGIN_API_ONEDNN_LM_HEAD"
NAMES = (ROOT, THREADS, LM_HEAD)


@dataclass(frozen=True, slots=True)
class LmHeadPolicy:
    """When a bf16-output GEMM runs the bf16 x bf16 -> f32 kernel plus one downcast copy.

    The f32-dst kernel is chosen iff ``N >= min_n`` and ``M >= min_m``; otherwise the
    bf16-dst kernel runs. fp32 output always comes from the f32-dst kernel (it is the
    accumulator). The defaults are upstream's Neoverse-V3 measurements (vllm#55352: the f32-dst
    ACL kernel is 1.6-1.9x faster from M=9, but up to 10% slower at M <= 8 with 64-96 threads;
    the gate there was N >= 64000). They could not be re-measured here: an AVX2-only CPU has no
    oneDNN bf16 kernel at all, so every bf16 GEMM there computes in fp32 (see ``isa``).
    """

    min_n: int = 64000
    min_m: int = 9

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"LmHeadPolicy.{f.name}={v!r} must be an int >= 1")

    def f32_dst(self, m: int, n: int) -> bool:
        return n >= self.min_n and m >= self.min_m

    def describe(self) -> str:
        n, m = self.min_n, self.min_m
        return f"bf16 out runs the f32-dst kernel + one downcast when N >= {n} and M >= {m}"

    @classmethod
    def parse(cls, text: str) -> LmHeadPolicy:
        """``"min_n=64000,min_m=9"``; omitted keys keep their defaults."""
        known = {f.name for f in fields(cls)}
        values: dict[str, int] = {}
        for part in text.split(","):
            key, sep, raw = part.partition("=")
            key = key.strip()
            if not sep or key not in known:
                raise SettingError(
                    f"{LM_HEAD}={text!r}: expected comma-separated key=value with keys "
                    f"{sorted(known)}, got {part.strip()!r}"
                )
            try:
                values[key] = int(raw)
            except ValueError:
                raise SettingError(f"{LM_HEAD}={text!r}: {key} must be an integer") from None
        try:
            return cls(**values)
        except ValueError as e:
            raise SettingError(f"{LM_HEAD}={text!r}: {e}") from None


@dataclass(frozen=True, slots=True)
class PluginSettings:
    root: str | None = None
    threads: int | None = None  # None: torch.get_num_threads() at call time
    lm_head: LmHeadPolicy = LmHeadPolicy()


def read(environ: Mapping[str, str] | None = None) -> PluginSettings:
    env = os.environ if environ is None else environ
    for name in NAMES:
        if name in env and not env[name].strip():
            raise SettingError(f"{name} is set but empty; unset it or give a value")
    threads = None
    if THREADS in env:
        raw = env[THREADS]
        if not raw.strip().isdigit() or int(raw) < 1:
            raise SettingError(f"{THREADS}={raw!r} must be a positive integer")
        threads = int(raw)
    policy = LmHeadPolicy.parse(env[LM_HEAD]) if LM_HEAD in env else LmHeadPolicy()
    return PluginSettings(env.get(ROOT), threads, policy)
