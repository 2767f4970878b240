// The work plan of a paged-attention step (attention_plan.cpp) and the constants the Python side
// reads back through the `limits` op instead of repeating them. No torch types: the plan compiles
// in a second.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

// What the kernels admit, given by _attention_ext.py as -D definitions (attention.py's
// `supports` applies them without building anything); the kernels check their assumptions here.
#if !defined(PA_ATTN_HEAD_MULTIPLE) || !defined(PA_ATTN_MAX_HEAD_SIZE) || \
    !defined(PA_ATTN_BLOCK_MULTIPLE) || !defined(PA_ATTN_MAX_BLOCK_SIZE)
#error "compile with the PA_ATTN_* admission limits of _attention_ext.py"
#endif

namespace pa_attn {

constexpr int64_t kHeadMultiple = PA_ATTN_HEAD_MULTIPLE;
constexpr int64_t kMaxHeadSize = PA_ATTN_MAX_HEAD_SIZE;  // finish_row's stack row
constexpr int64_t kBlockMultiple = PA_ATTN_BLOCK_MULTIPLE;
constexpr int64_t kMaxBlockSize = PA_ATTN_MAX_BLOCK_SIZE;
// head rows are whole vectors (16 lanes at most); blocks hold whole 4-key score tiles, 16-key
// P.V pairs and at most kRunKeys / 16 blocks per dot-layout run
static_assert(kHeadMultiple % 16 == 0 && kMaxHeadSize % kHeadMultiple == 0);
static_assert(kBlockMultiple % 16 == 0 && kMaxBlockSize % kBlockMultiple == 0);

// Query rows per KV head from which an item takes the "rows" score layout, or the matrix layout
// where the call asks for it (attention_kernels.h); fewer take the "dot" layout.
constexpr int64_t kRowsLayoutMin = 16;
// KV heads per decode item (dot layout); rows-layout items take one.
constexpr int64_t kMaxHeadGroup = 8;
// Partials per query row that one reduction combines (finish_row's stack arrays).
constexpr int64_t kMaxSplits = 64;

// A plan row (int32): sequence, first KV head, KV heads, first query token, query tokens,
// position of the first query, key begin, key end, first partial row (-1: not split).
enum Field { kSeq, kKvh, kHeads, kQ0, kQn, kPos0, kK0, kK1, kProw, kFields };
// A reduce row (int32): query token range, first KV head and count, first partial row, splits.
enum RField { rQ0, rQn, rKvh, rHeads, rProw, rSplits, rFields };

struct Masking {
  bool causal;
  int64_t window;  // 0: none
  float soft_cap;  // 0: none
};

// Visible global key range [lo, hi) of the query at position `pos` in a sequence of `len`.
inline void visible(const Masking& mk, int64_t pos, int64_t len, int64_t* lo, int64_t* hi) {
  if (!mk.causal) {
    *lo = 0;
    *hi = len;
    return;
  }
  *hi = pos + 1;
  *lo = mk.window > 0 ? std::max<int64_t>(0, pos - mk.window + 1) : 0;
}

// Items for one step, largest first; split items write partial rows that `reduce` combines.
struct Plan {
  std::vector<std::array<int32_t, kFields>> items;
  std::vector<std::array<int32_t, rFields>> reduce;
  int64_t partial_rows = 0;
};

// qsl [S + 1] and lens [S] as AttentionBatch's query_start_loc and seq_lens. tile_rows: target
// query rows (tokens x group) per item; long key ranges are cut into block-aligned parts of at
// least min_split_keys keys so that there are about 8 items per thread.
Plan make_plan(const int32_t* qsl, const int32_t* lens, int64_t S, int64_t group,
               int64_t kv_heads, int64_t block, bool causal, int64_t window, int64_t num_threads,
               int64_t tile_rows, int64_t min_split_keys);

}  // namespace pa_attn
