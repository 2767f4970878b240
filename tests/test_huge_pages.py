"""The KV cache and large GEMM outputs ask for transparent huge pages before their first write
(ops/huge_pages.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import plugin_api as pa
from plugin_api.backend import backend_for
from plugin_api.ops.attention import AttentionSpec, allocate_kv_cache
from plugin_api.ops.gemm import HUGE_OUT_BYTES
from plugin_api.ops.huge_pages import (
    HUGE_PAGE,
    MADV_HUGEPAGE,
    advise_huge_pages,
    kv_cache_pages,
    thp_mode,
)

linux = pytest.mark.skipif(
    sys.platform != "linux" or MADV_HUGEPAGE is None, reason="madvise(MADV_HUGEPAGE) is Linux's"
)


def advised_ranges() -> list[tuple[int, int]]:
    """Address ranges of this process that carry the huge-page advice ("hg" in VmFlags)."""
    ranges: list[tuple[int, int]] = []
    current = (0, 0)
    for line in Path("/proc/self/smaps").read_text().splitlines():
        words = line.split()
        if "-" in words[0] and not words[0].endswith(":"):  # a mapping's header line
            lo, hi = (int(x, 16) for x in words[0].split("-"))
            current = (lo, hi)
        elif words[0] == "VmFlags:" and "hg" in words[1:]:
            ranges.append(current)
    return ranges


def covers(ranges: list[tuple[int, int]], inner: int) -> bool:
    """Whether the huge page starting at ``inner`` lies inside one of ``ranges``."""
    return any(lo <= inner and inner + HUGE_PAGE <= hi for lo, hi in ranges)


def test_less_than_one_huge_page_is_not_advised():
    assert not advise_huge_pages(torch.empty(HUGE_PAGE // 2, dtype=torch.uint8))


@linux
def test_a_large_cache_carries_the_advice_and_starts_zeroed():
    spec = AttentionSpec(8, 2, 128, torch.bfloat16, block_size=16)
    cache = allocate_kv_cache(spec, 1024, "cpu")  # 16 MiB
    assert cache.huge_pages
    start = cache.data.data_ptr()
    end = start + cache.data.nbytes
    inner = -(-start // HUGE_PAGE) * HUGE_PAGE  # the first whole huge page inside the cache
    assert covers(advised_ranges(), inner)
    assert inner + HUGE_PAGE <= end
    assert not cache.data.any()


@linux
def test_a_large_gemm_output_carries_the_advice_and_a_small_one_does_not():
    """mm's own output of at least HUGE_OUT_BYTES is advised before the kernel writes it (the
    allocator maps such a buffer afresh each call: 4 KB page faults otherwise), a smaller one is
    not (one just under the threshold still holds a whole huge page, so the advice would show);
    the result is the same either way. The smaller output may land in heap memory that an earlier
    large buffer left advised, so for it the test asks whether the call advised it."""
    ref = backend_for("reference")
    w = torch.randn(1024, 64) * 0.1
    packed = pa.prepare(w, backend=ref)
    rows = HUGE_OUT_BYTES // (1024 * 4)  # fp32 [rows, 1024] is exactly the threshold
    for m, advised in ((rows + 512, True), (rows - 1, False)):
        x = torch.randn(m, 64)
        before = advised_ranges()
        out = pa.mm(x, packed)
        torch.testing.assert_close(out, x @ w.t(), atol=1e-4, rtol=1e-5)
        inner = -(-out.data_ptr() // HUGE_PAGE) * HUGE_PAGE
        now = covers(advised_ranges(), inner)
        if advised:
            assert now, (m, out.nbytes)
        else:
            assert not (now and not covers(before, inner)), (m, out.nbytes)


@pytest.mark.parametrize(
    ("text", "mode"),
    [
        ("always [madvise] never\n", "madvise"),
        ("[always] madvise never\n", "always"),
        ("always madvise [never]\n", "never"),
        ("always madvise never\n", None),  # no choice marked: not a file we understand
    ],
)
def test_thp_mode_is_the_bracketed_word(tmp_path: Path, text: str, mode: str | None):
    f = tmp_path / "enabled"
    f.write_text(text)
    assert thp_mode(f) == mode


def test_thp_mode_of_a_missing_file_is_none(tmp_path: Path):
    assert thp_mode(tmp_path / "absent") is None


def test_kv_cache_pages_says_why():
    assert kv_cache_pages("madvise")["huge_pages"] is True
    assert kv_cache_pages("always")["huge_pages"] is True
    never = kv_cache_pages("never")
    assert never["huge_pages"] is False and "echo madvise >" in str(never["reason"])
    unknown = kv_cache_pages(None)
    assert unknown["huge_pages"] is False and "not readable" in str(unknown["reason"])
