"""The plugin's ``PLUGIN_API_ONEDNN_*`` settings, parsed in one place (declared in the descriptor).

- ``PLUGIN_API_ONEDNN_ROOT``: a oneDNN install prefix (``lib/libdnnl.so*``, ``include/``), e.g. one
  built with ACL on aarch64. Unset: the ``onednn-cpu-gomp`` wheels (x86_64).
- ``PLUGIN_API_ONEDNN_THREADS``: OpenMP threads for the plugin's kernels (default: torch's count).
- ``PLUGIN_API_ONEDNN_LM_HEAD``: the ``LmHeadPolicy``, e.g. ``min_n=64000,min_m=9``, ``off,pad_m=4``
  (default: ``LmHeadPolicy.default_for`` the machine).
- ``PLUGIN_API_ONEDNN_GEMV``: the ``GemvPolicy`` of the bf16 GEMV, e.g. ``linear_m=0``,
  ``prefetch=1`` (default: ``GemvPolicy.default_for`` the machine and its CPU family).
- ``PLUGIN_API_ONEDNN_LARGE_M``: the ``LargeMPolicy``, ``min_m=2048`` or ``off`` (default:
  ``LargeMPolicy.default_for`` the machine).
- ``PLUGIN_API_ONEDNN_PANEL``: the ``PanelPolicy`` of the panel GEMMs, e.g. ``isa=generic,kc=512``
  (default: ``PanelPolicy.default_for`` the machine).
- ``PLUGIN_API_ONEDNN_ATTENTION_MATRIX``: ``auto`` (default), ``on`` or ``off``: whether prefill
  tiles of the CPU attention run as bf16 GEMMs through torch's ``cpublas::brgemm`` (oneDNN's AMX
  kernels). ``auto``: where the CPU has AMX; ``on`` also elsewhere (torch's gemm runs them,
  slower than the vector kernels: it exists to test that path anywhere).
- ``PLUGIN_API_ONEDNN_ATTENTION_PREFETCH``: ``auto`` (default), ``l1`` or ``l2``: the cache level
  the decode kernels prefetch a request's next KV block into (``attention.prefetch_target``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import TypeVar

from plugin_api.errors import SettingError

from .isa import X86

ROOT = "PLUGIN_API_ONEDNN_ROOT"
THREADS = "PLUGIN_API_ONEDNN_THREADS"
LM_HEAD = "PLUGIN_API_ONEDNN_LM_HEAD"
PANEL = "PLUGIN_API_ONEDNN_PANEL"
GEMV = "PLUGIN_API_ONEDNN_GEMV"
ATTENTION_MATRIX = "PLUGIN_API_ONEDNN_ATTENTION_MATRIX"
ATTENTION_PREFETCH = "PLUGIN_API_ONEDNN_ATTENTION_PREFETCH"
LARGE_M = "PLUGIN_API_ONEDNN_LARGE_M"
NAMES = (ROOT, THREADS, LM_HEAD, GEMV, LARGE_M, PANEL, ATTENTION_MATRIX, ATTENTION_PREFETCH)
MATRIX_MODES = ("auto", "on", "off")
PREFETCH_MODES = ("auto", "l1", "l2")
GEMV_MAX_M = 64  # rows the AMX GEMV takes (gemv.cpp's kAmxGemvMaxRows)
VDPBF16PS_GEMV_MAX_M = 8  # rows the vdpbf16ps GEMV takes (kGemvMaxRows)


def gemv_rows(amx: bool) -> int:
    """The most rows the bf16 GEMV of a CPU with (or without) AMX takes; a policy's larger
    row count runs oneDNN beyond it, and its ``describe`` says so."""
    return GEMV_MAX_M if amx else VDPBF16PS_GEMV_MAX_M


def _gemv_clause(policy_rows: int, kernel_rows: int) -> tuple[str, str]:
    """(the rows a policy's GEMV takes on a machine, in words; the kernel's name)."""
    kernel = "AMX tiles" if kernel_rows == GEMV_MAX_M else "vdpbf16ps"
    cap = f", at most {kernel_rows} here" if policy_rows > kernel_rows else ""
    return f"M <= {policy_rows}{cap}", kernel


P = TypeVar("P")
PANEL_ISAS = ("auto", "avx2", "generic")


@dataclass(frozen=True, slots=True)
class LmHeadPolicy:
    """How the oneDNN LM head runs: which dst a bf16 output takes, and how few rows it pads.

    - The f32-dst kernel plus one downcast copy serves a bf16 output iff ``enabled`` and
      ``N >= min_n`` and ``M >= min_m``; otherwise the bf16-dst kernel runs. fp32 output always
      comes from the f32-dst kernel (it is the accumulator).
    - An LM-head call with ``M < pad_m`` rows runs the ``pad_m``-row kernel on rows copied into
      a padded buffer, and its first M output rows are copied out (1: no padding).
    - An LM-head call with ``M <= gemv_m`` rows (bf16 x, no bias) runs the plugin's bf16 GEMV
      on oneDNN's packed weights instead, where oneDNN packed them in its AVX-512 BF16 layout
      (``gemv.cpp``); 0: never. It comes before the padding.

    ``default_for`` gives each architecture its measured default.
    """

    min_n: int = 64000
    min_m: int = 9
    enabled: bool = True
    pad_m: int = 1
    gemv_m: int = 0

    def __post_init__(self) -> None:
        _check_ints(self, lowest={"gemv_m": 0})
        if self.gemv_m > GEMV_MAX_M:
            raise ValueError(f"LmHeadPolicy.gemv_m={self.gemv_m} must be at most {GEMV_MAX_M}")

    def f32_dst(self, m: int, n: int) -> bool:
        return self.enabled and n >= self.min_n and m >= self.min_m

    def describe(self, gemv_kernel_rows: int = GEMV_MAX_M) -> str:
        """In words; ``gemv_kernel_rows``: what the described machine's GEMV takes."""
        n, m = self.min_n, self.min_m
        dst = (
            f"bf16 out runs the f32-dst kernel + one downcast when N >= {n} and M >= {m}"
            if self.enabled
            else "bf16 out always runs the bf16-dst kernel"
        )
        parts = [dst]
        if self.gemv_m:
            rows, kernel = _gemv_clause(self.gemv_m, gemv_kernel_rows)
            parts.append(
                f"{rows} runs the bf16 GEMV ({kernel}) on oneDNN's packed weights (where "
                "they are in its AVX-512 BF16 layout)"
            )
        if self.pad_m != 1:
            parts.append(f"M < {self.pad_m} runs the {self.pad_m}-row kernel on padded rows")
        return "; ".join(parts)

    @classmethod
    def parse(cls, text: str) -> LmHeadPolicy:
        """``"min_n=64000,min_m=9,pad_m=4"`` (omitted keys keep their defaults); an ``off``
        among them turns the f32-dst gate off (``"off"``, ``"off,pad_m=4"``)."""
        policy = _parse(cls, LM_HEAD, text, skip="off")
        off = any(p.strip() == "off" for p in text.split(","))
        return replace(policy, enabled=False) if off else policy

    @classmethod
    def default_for(cls, machine: str, amx: bool = False) -> LmHeadPolicy:
        """The measured default for an architecture (``platform.machine()`` spelling) and
        whether the CPU has AMX.

        - Arm: upstream's Neoverse-V3 gate (vllm#55352): ACL's fastest bf16 kernel is
          bf16:bf16:f32, worth it from M=9 at N >= 64000; not re-measured here (no Arm machine).
        - x86: the gate off (oneDNN's x86 bf16 kernels accumulate in f32 for either dst), rows
          padded to 4, and the bf16 GEMV up to 8 rows. Measurements:
          docs/measurements/cpu-arm-acl/2026-12-03-zen4.md (gate, padding) and
          2026-12-04-zen5.md (GEMV).
        - x86 with AMX: the gate off, no padding, the AMX GEMV up to 64 rows: it read the
          0.49B model's LM head 1.1x faster than oneDNN 3.2 and vLLM's oneDNN at M = 1-16, where
          the vdpbf16ps GEMV had lost to oneDNN's AMX kernel, and ran 17-64 rows 1.1-1.3x
          faster than oneDNN 3.2 (2026-12-06-xeon-amx.md).
        """
        if machine not in X86:
            return cls()
        rows = gemv_rows(amx)
        return cls(enabled=False, gemv_m=rows) if amx else cls(enabled=False, pad_m=4, gemv_m=rows)


@dataclass(frozen=True, slots=True)
class GemvPolicy:
    """The bf16 GEMV (``csrc/gemv.cpp``: AMX tiles where the CPU has them, else vdpbf16ps)
    beyond the LM head, and how it reads.

    - ``linear_m``: linear-usage calls of at most this many rows (bf16 ``x``, no bias, and no
      more than the kernel takes: ``gemv_rows``) run the GEMV on oneDNN's packed weights
      instead of oneDNN's kernel; 0: never. (LM-head calls: ``LmHeadPolicy.gemv_m``.)
    - ``prefetch``: 1, a software prefetch ahead of each step (vdpbf16ps: non-temporal, per
      k-pair step; AMX, up to 16 rows: the next 4 KB weight block, to L1); 0, none (the
      hardware prefetchers alone, as the AMX kernel's 17-64 rows always run).

    ``default_for``: on x86 every row the machine's kernel takes (8; 64 with AMX); the prefetch
    on AMD family 26 (Zen 5), where it was tuned and measured faster (2026-12-05-zen4.md), and
    with AMX (2026-12-06-xeon-amx.md). Other CPUs: no prefetch.
    """

    linear_m: int = 0
    prefetch: int = 0

    def __post_init__(self) -> None:
        _check_ints(self, lowest={"linear_m": 0, "prefetch": 0})
        if self.linear_m > GEMV_MAX_M:
            raise ValueError(f"GemvPolicy.linear_m={self.linear_m} must be at most {GEMV_MAX_M}")
        if self.prefetch not in (0, 1):
            raise ValueError(f"GemvPolicy.prefetch={self.prefetch} must be 0 or 1")

    def describe(self, kernel_rows: int = GEMV_MAX_M) -> str:
        """In words; ``kernel_rows``: what the described machine's GEMV takes."""
        if self.linear_m:
            rows, kernel = _gemv_clause(self.linear_m, kernel_rows)
            calls = f"linear calls of {rows} run the bf16 GEMV ({kernel})"
        else:
            calls = "linear calls never run the bf16 GEMV"
        return f"{calls}; GEMV prefetch {'on' if self.prefetch else 'off'}"

    @classmethod
    def parse(cls, text: str) -> GemvPolicy:
        """``"linear_m=4,prefetch=1"``; omitted keys keep their defaults."""
        return _parse(cls, GEMV, text)

    @classmethod
    def default_for(
        cls, machine: str, cpu: tuple[str, int] | None, amx: bool = False
    ) -> GemvPolicy:
        """The measured default for an architecture, (vendor, family) and AMX (see the class)."""
        if machine not in X86:
            return cls()
        zen5_or_later = cpu is not None and cpu[0] == "AuthenticAMD" and cpu[1] >= 26
        return cls(linear_m=gemv_rows(amx), prefetch=int(zen5_or_later or amx))


@dataclass(frozen=True, slots=True)
class LargeMPolicy:
    """Linear calls with many rows (prefill) where torch's own oneDNN is the faster library.

    - ``min_m``: bf16 linear calls (bf16 ``x`` and out, no bias or a bf16 one) of at least this
      many rows run torch's matmul (``torch.mm``/``addmm``, the oneDNN torch bundles) on the
      weights unpacked from oneDNN's layout into a per-thread buffer (``csrc/gemv.cpp``'s
      ``unpack_bf16``: four 16 x 16 word transposes per 4 KB block, streaming stores); 0: never.
      Both libraries accumulate in fp32 and round once.

    ``default_for``: 2048 on x86 with AMX, where unpack + torch's oneDNN 3.12 ran the 0.49B
    model's four linear layers 1.21-1.27x faster than oneDNN 3.2 at M = 2048-4096 on one thread
    (1.11-1.14x on two) and the two crossed between M = 1024 and 2048 (2026-12-06-xeon-amx.md);
    elsewhere 0 (not measured).
    The buffer holds the largest weight of each K a thread ran this way.
    """

    min_m: int = 0

    def __post_init__(self) -> None:
        _check_ints(self, lowest={"min_m": 0})

    def describe(self) -> str:
        if not self.min_m:
            return "bf16 linear calls never run torch's matmul"
        return (
            f"bf16 linear calls of M >= {self.min_m} run torch's matmul (its own oneDNN) on "
            "the weights unpacked per call"
        )

    @classmethod
    def parse(cls, text: str) -> LargeMPolicy:
        """``"min_m=2048"``, or ``"off"`` (``min_m=0``)."""
        return cls() if text.strip() == "off" else _parse(cls, LARGE_M, text)

    @classmethod
    def default_for(cls, machine: str, amx: bool) -> LargeMPolicy:
        """The measured default for an architecture and AMX (see the class)."""
        return cls(min_m=2048) if machine in X86 and amx else cls()


@dataclass(frozen=True, slots=True)
class PanelPolicy:
    """How the panel GEMMs run (bf16 where oneDNN has no bf16 kernel, fp16, exact int8 where its
    s8 kernel saturates): which ISA's kernels, and how the loops block.

    - ``isa``: ``auto`` (the best the CPU flags allow: ``avx2`` with AVX2+FMA+F16C, else
      ``generic``, the at::vec kernels), or one of them forced.
    - ``kc``: k steps per block (the weight block that every row group reuses from L1).
    - ``mc``: rows per pass over the weight (bounds the packed-x buffer to ``mc * K`` fp32;
      M > mc reads the weight ceil(M / mc) times).
    - ``block_major_m``: calls of at least this many rows run block-major (each k block over a
      chunk of 16 panels, so the x block stays in L2 for all of them, not the whole packed x
      re-read per panel) and widen 16-bit weights once per k block into an fp32 buffer (the
      kernel's loop then has no conversion); 0: never. Fewer rows run panel-major, rows in
      groups of up to 6 per microkernel, 16-bit weights widened in registers. Every choice
      gives the same bits: each sum runs over k in the same order.

    ``default_for``: ``block_major_m=128`` on x86, where both vendors' cores measured it faster
    from 128 rows (about even at 64): the 0.49B model's four linears 1.16-1.19x at M = 256-1024
    on one thread (AVX2 code on Sapphire Rapids cores, 2026-12-07-xeon-avx2-capped.md: shifts
    and FMAs share two ports there), 1.06-1.47x at M = 128-2048 on two threads of a Zen 3
    (2026-12-07-zen3.md; on 2026-12-02 an earlier kernel had measured each half alone slower
    there, 2026-12-02-zen3.md). Elsewhere 0. The generic (at::vec) kernels always widen per k
    block.
    """

    isa: str = "auto"
    kc: int = 256
    mc: int = 256
    block_major_m: int = 0

    def __post_init__(self) -> None:
        if self.isa not in PANEL_ISAS:
            raise ValueError(f"PanelPolicy.isa={self.isa!r} must be one of {PANEL_ISAS}")
        _check_ints(self, lowest={"block_major_m": 0})

    def describe(self) -> str:
        return f"isa={self.isa}, kc={self.kc}, mc={self.mc}, block_major_m={self.block_major_m}"

    def block_major(self, m: int) -> bool:
        """Whether a call of ``m`` rows runs block-major (and widens per k block)."""
        return 0 < self.block_major_m <= m

    @classmethod
    def parse(cls, text: str) -> PanelPolicy:
        """``"isa=generic,kc=512"``; omitted keys keep their defaults."""
        return _parse(cls, PANEL, text)

    @classmethod
    def default_for(cls, machine: str) -> PanelPolicy:
        """The measured default for an architecture (see the class)."""
        return cls(block_major_m=128) if machine in X86 else cls()


def _check_ints(policy: object, lowest: Mapping[str, int] | None = None) -> None:
    """Every int field is an int >= 1, or >= ``lowest[name]``."""
    for f in fields(policy):  # type: ignore[arg-type]
        v = getattr(policy, f.name)
        low = (lowest or {}).get(f.name, 1)
        if f.type == "int" and (isinstance(v, bool) or not isinstance(v, int) or v < low):
            raise ValueError(f"{type(policy).__name__}.{f.name}={v!r} must be an int >= {low}")


def _parse(cls: type[P], env: str, text: str, *, skip: str | None = None) -> P:
    """``key=value`` pairs separated by commas into ``cls``; int fields parsed as integers.
    A part equal to ``skip`` is passed over (the caller gives it its own meaning)."""
    # bool fields have their own spelling (LmHeadPolicy's "off"), not key=value
    types = {f.name: f.type for f in fields(cls) if f.type != "bool"}  # type: ignore[arg-type]
    values: dict[str, int | str] = {}
    for part in (p for p in text.split(",") if skip is None or p.strip() != skip):
        key, sep, raw = part.partition("=")
        key = key.strip()
        if not sep or key not in types:
            raise SettingError(
                f"{env}={text!r}: expected comma-separated key=value with keys "
                f"{sorted(types)}, got {part.strip()!r}"
            )
        if types[key] != "int":
            values[key] = raw.strip()
            continue
        try:
            values[key] = int(raw)
        except ValueError:
            raise SettingError(f"{env}={text!r}: {key} must be an integer") from None
    try:
        return cls(**values)
    except ValueError as e:
        raise SettingError(f"{env}={text!r}: {e}") from None


@dataclass(frozen=True, slots=True)
class PluginSettings:
    root: str | None = None
    threads: int | None = None  # None: torch.get_num_threads() at call time
    lm_head: LmHeadPolicy | None = None  # None: LmHeadPolicy.default_for the machine
    panel: PanelPolicy | None = None  # None: PanelPolicy.default_for the machine
    attention_matrix: str = "auto"  # one of MATRIX_MODES
    attention_prefetch: str = "auto"  # one of PREFETCH_MODES
    gemv: GemvPolicy | None = None  # None: GemvPolicy.default_for the machine
    large_m: LargeMPolicy | None = None  # None: LargeMPolicy.default_for the machine


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
    policy = LmHeadPolicy.parse(env[LM_HEAD]) if LM_HEAD in env else None
    panel = PanelPolicy.parse(env[PANEL]) if PANEL in env else None
    matrix = _mode(env, ATTENTION_MATRIX, MATRIX_MODES)
    prefetch = _mode(env, ATTENTION_PREFETCH, PREFETCH_MODES)
    gemv = GemvPolicy.parse(env[GEMV]) if GEMV in env else None
    large_m = LargeMPolicy.parse(env[LARGE_M]) if LARGE_M in env else None
    return PluginSettings(env.get(ROOT), threads, policy, panel, matrix, prefetch, gemv, large_m)


def _mode(env: Mapping[str, str], name: str, modes: tuple[str, ...]) -> str:
    value = env.get(name, "auto").strip()
    if value not in modes:
        raise SettingError(f"{name}={env[name]!r} must be one of {', '.join(modes)}")
    return value
