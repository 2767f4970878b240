// Dot-layout scores on AMX tiles (a bf16 cache, few rows per KV head: decode). S^T = K . Q^T:
// an A tile is 16 of a block's K rows x 32 of the head dim straight from the cache, the B tile
// the item's rows of one KV head as (d, d + 1) pairs, packed once per item, and the C tile the
// 16 keys' scores for every row. One tile multiply per 1 KB of K replaces the head dim's
// vdpbf16ps and horizontal sums per key (qk_bf16).
#pragma once

#include "amx.h"
#include "attention_vec.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#if defined(__AVX512BF16__)
namespace pa_attn {

constexpr int kTileKeys = 16;

// Whether the scores of an item with R rows per KV head run on tiles: AMX granted, a head dim of
// whole 32-element chunks, blocks of whole 16-key groups, at most 16 rows (one B tile's columns).
inline bool tile_scores(int64_t D, int64_t block, int R) {
  return D % 32 == 0 && block % kTileKeys == 0 && R >= 1 && R <= 16 && pa_amx::granted();
}

// The rows' pairs: qt[h][c][p][r] = (q[h R + r][32 c + 2 p], ... + 1) as one 32-bit word, for
// `heads` KV heads of R rows each (q [heads R][D] bf16).
inline void pack_query_pairs(const c10::BFloat16* q, int heads, int R, int64_t D,
                             std::vector<uint32_t>& qt) {
  const int64_t chunks = D / 32;
  qt.resize(static_cast<size_t>(heads) * chunks * 16 * R);
  const auto* bits = reinterpret_cast<const uint16_t*>(q);
  for (int h = 0; h < heads; ++h)
    for (int r = 0; r < R; ++r) {
      const uint16_t* row = bits + (static_cast<int64_t>(h) * R + r) * D;
      uint32_t* dst = qt.data() + static_cast<int64_t>(h) * chunks * 16 * R + r;
      for (int64_t d = 0; d < D; d += 2)  // pair p of chunk c sits at (c * 16 + p) * R
        dst[(d / 2) * R] = static_cast<uint32_t>(row[d]) | (static_cast<uint32_t>(row[d + 1]) << 16);
    }
}

// KV head h's pairs in pack_query_pairs' buffer.
inline const uint32_t* query_pairs_of(const std::vector<uint32_t>& qt, int64_t h, int R,
                                      int64_t D) {
  return qt.data() + h * (D / 32) * 16 * R;
}

// Tiles 0 (C: 16 keys x R fp32), 1 (A: 16 K rows x 32 bf16), 2 (B: 16 pairs x R).
PA_AMX inline void configure_score_tiles(int R) {
  pa_amx::TileConfig cfg;
  cfg.set(0, kTileKeys, R * 4);
  cfg.set(1, kTileKeys, 64);
  cfg.set(2, 16, R * 4);
  cfg.load();
}

PA_AMX inline void release_tiles() { _tile_release(); }

// S^T[j][r] (st + j * ldt + r) for the keys [j0, j1) of one block (k: its K rows of one KV head,
// D apart) and R rows (qt: that head's pairs); the tiles configured for R. Keys of a 16-key group
// outside [j0, j1) are computed from whatever the block holds there and dropped: row j of the
// product reads only key j. next_k, l1: the next block's same rows, prefetched group by group
// (as qk_bf16's).
PA_AMX inline void qk_tiles(int R, const uint32_t* qt, const c10::BFloat16* k, int64_t D, int j0,
                            int j1, float* st, int64_t ldt, const c10::BFloat16* next_k, bool l1) {
  const int64_t chunks = D / 32;
  alignas(64) float part[kTileKeys][16];
  for (int g = j0 & ~(kTileKeys - 1); g < j1; g += kTileKeys) {
    if (next_k) prefetch(next_k + g * D, kTileKeys * D * 2, l1);
    _tile_zero(0);
    for (int64_t c = 0; c < chunks; ++c) {
      _tile_loadd(1, k + g * D + 32 * c, D * 2);
      _tile_loadd(2, qt + c * 16 * R, R * 4);
      _tile_dpbf16ps(0, 1, 2);
    }
    if (g >= j0 && g + kTileKeys <= j1) {
      _tile_stored(0, st + g * ldt, ldt * 4);
      continue;
    }
    _tile_stored(0, &part[0][0], 64);
    for (int j = std::max(g, j0); j < std::min(g + kTileKeys, j1); ++j)
      std::copy(part[j - g], part[j - g] + R, st + j * ldt);
  }
}

}  // namespace pa_attn
#endif
