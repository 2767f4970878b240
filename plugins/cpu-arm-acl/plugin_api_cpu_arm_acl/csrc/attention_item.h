// What the attention kernels' translation units share (attention_vector.cpp, the vector
// layouts; attention_matrix.cpp, the matrix layout): one work item's geometry, its per-thread
// scratch and where its K/V rows are.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "attention_kernels.h"
#include "attention_plan.h"

namespace pa_attn {

// How an item's rows attend: attend_dot, attend_rows or attend_matrix.
enum class Layout { kDot, kRows, kMatrix };
// A run of the dot layout (attend_dot): whole blocks, at most kRunKeys keys and about
// kRunBytes of K and V over the item's heads (they stay in L2 between scores and P.V).
constexpr int64_t kRunKeys = 128;
constexpr int64_t kRunBytes = 128 << 10;
inline int64_t run_blocks(int64_t bs, int64_t heads, int64_t dim, int64_t elt) {
  const int64_t by_bytes = kRunBytes / (bs * dim * elt * 2 * heads);
  return std::max<int64_t>(1, std::min(kRunKeys / bs, by_bytes));
}
// A chunk of the matrix layout (attend_matrix): whole blocks, about kMatrixKeys keys per pass of
// the online softmax (its per-row cost, the reductions and the accumulator's rescale, is paid
// once per chunk).
constexpr int64_t kMatrixKeys = 256;
inline int64_t matrix_blocks(int64_t bs) { return std::max<int64_t>(1, kMatrixKeys / bs); }
// A run of the rows layout (attend_rows): whole blocks, about kRowsRunKeys keys, whose K and V
// as fp32 (2 x 32 KB at head size 128) stay in L1/L2 between scores and P.V.
constexpr int64_t kRowsRunKeys = 64;
inline int64_t rows_run_blocks(int64_t bs) { return std::max<int64_t>(1, kRowsRunKeys / bs); }

// Rows of an item: per KV head of the item (outer), per query token, per query head of the
// group (inner). per_head = tokens x group.
struct Rows {
  int64_t per_head, group;
  int64_t token(int64_t r) const { return r % per_head / group; }
  // query head of row r for an item whose first KV head is kvh
  int64_t head(int64_t kvh, int64_t r) const {
    return (kvh + r / per_head) * group + r % per_head % group;
  }
};

struct Geometry {
  int64_t heads, kv_heads, group, dim, block;
};

// ---- per-thread scratch ------------------------------------------------------------------------

struct Scratch {
  std::vector<float> buf;
  float* q;      // dot: [R][D] ; rows: Q^T [D][Rp]
  float* acc;    // [Rp][D]
  float* s;      // dot: [R][run keys], with kDotBf16 [run keys][Rp] ; rows: [run keys][Rp]
  float* kf;     // rows: the run's K as fp32 [run keys][D]
  float* vf;     // rows: the run's V as fp32 [run keys][D]
  float* m;      // [Rp]
  float* l;      // [Rp]
  float* alpha;  // [Rp]
  float* lo;     // [Rp] rows layout: visible key range as fp32
  float* hi;     // [Rp]
  c10::BFloat16* pb;  // the probabilities as bf16: dot layout with kDotBf16, paired words
                      // [run keys / 2][Rp] (pair_probs); matrix layout [R][run keys]
  c10::BFloat16* pb_lo;  // matrix layout, P as two bf16 terms: pb's rounding error [R][run keys]
  std::vector<int> a, b;
  std::vector<c10::BFloat16> panels;  // matrix layout: the B panel of a brgemm
  std::vector<c10::BFloat16> widened;  // matrix layout, fp8 cache: a chunk's K and V as bf16

  void reserve(int64_t Rp, int64_t D, int64_t bs) {
    const int64_t align = 16;  // floats: 64 bytes
    auto up = [&](int64_t n) { return (n + align - 1) / align * align; };
    // a rows block, a dot run or a matrix chunk
    const int64_t rows_keys = rows_run_blocks(bs) * bs;
    const int64_t keys = std::max({rows_keys, kRunKeys, matrix_blocks(bs) * bs});
    const int64_t sizes[] = {Rp * D,        Rp * D, Rp * keys, rows_keys * D, rows_keys * D,
                             Rp,            Rp,     Rp,        Rp,            Rp,
                             (Rp * keys + 1) / 2, (Rp * keys + 1) / 2};
    int64_t total = align;
    for (int64_t n : sizes) total += up(n);
    if (static_cast<int64_t>(buf.size()) < total) buf.resize(total);  // grows once, then reused
    float* p = buf.data();
    p += (align - (reinterpret_cast<uintptr_t>(p) / sizeof(float)) % align) % align;
    float** slots[] = {&q, &acc, &s, &kf, &vf, &m, &l, &alpha, &lo, &hi};
    for (int i = 0; i < 10; ++i) {
      *slots[i] = p;
      p += up(sizes[i]);
    }
    pb = reinterpret_cast<c10::BFloat16*>(p);
    pb_lo = reinterpret_cast<c10::BFloat16*>(p + up(sizes[10]));
    if (static_cast<int64_t>(a.size()) < Rp) {
      a.resize(Rp);
      b.resize(Rp);
    }
  }
};


// This thread's scratch (attention_vector.cpp), allocated once and reused across calls.
Scratch& scratch();

// ---- one work item -----------------------------------------------------------------------------

struct Step {
  Geometry g;
  Masking mk;
  float scale;  // softmax scale, times k_scale for an fp8 cache
  const int32_t* block_table;
  int64_t bt_stride;
  const int32_t* seq_lens;
  bool ahead_l1;  // the dot layout prefetches the next block into L1, not L2 (see prefetch)
  int64_t q_tok_stride, q_head_stride;  // query row and head strides (elements; last dim is 1)
};

// Where an item's K and V rows are: block b's K of the item's first KV head; head i of the item
// is i * head further, and a head's V is kv further than its K.
template <typename KT>
struct ItemBlocks {
  const KT* cache;
  const int32_t* table;  // the request's row of the block table
  int64_t kv_heads, first_head, head, kv;
  const KT* k(int64_t b) const {
    return cache + (static_cast<int64_t>(table[b]) * 2 * kv_heads + first_head) * head;
  }
};

// w.a, w.b: each row's visible keys [lo, hi) relative to a run starting at key kc, clipped to the
// run's keys [j0, j1) (softmax_dot's per-row range).
inline void run_ranges(Scratch& w, int R, int64_t kc, int64_t j0, int64_t j1) {
  for (int r = 0; r < R; ++r) {
    w.a[r] = static_cast<int>(std::clamp(static_cast<int64_t>(w.lo[r]) - kc, j0, j1));
    w.b[r] = static_cast<int>(std::clamp(static_cast<int64_t>(w.hi[r]) - kc, j0, j1));
  }
}

// The keys [*ca, *cb) that every one of R rows sees, given each row's visible keys [a[r], b[r])
// within [j0, j1); empty (*ca = *cb = j0) when no key is seen by all (a row seeing none included).
inline void common_keys(int R, const int* a, const int* b, int j0, int j1, int* ca, int* cb) {
  int lo = j0, hi = j1;
  for (int r = 0; r < R; ++r) {
    lo = std::max(lo, a[r]);
    hi = std::min(hi, b[r]);
  }
  if (lo >= hi) lo = hi = j0;
  *ca = lo;
  *cb = hi;
}

// P.V that sums over visible keys only: a masked key's V row (which may hold NaN or Inf) never
// meets a row's p = 0, since 0 * inf = NaN. The keys every row sees, [ca, cb) of common_keys, go
// through all(ca, cb) for the R rows together (which also rescales the accumulators by alpha,
// even over no keys); the keys only some rows see go through one(r, x, y) for row r alone (no
// rescaling). Rows that see the same keys (a decode) take the one call of `all`.
template <typename All, typename One>
inline void pv_visible(int R, const int* a, const int* b, int j0, int j1, All&& all, One&& one) {
  int ca, cb;
  common_keys(R, a, b, j0, j1, &ca, &cb);
  all(ca, cb);
  for (int r = 0; r < R; ++r) {
    if (a[r] >= b[r]) continue;
    if (a[r] < std::min(b[r], ca)) one(r, a[r], std::min(b[r], ca));
    if (std::max(a[r], cb) < b[r]) one(r, std::max(a[r], cb), b[r]);
  }
}

// The matrix layout (attention_matrix.cpp): the rows of a many-row item (bf16 query as given in
// w.q [R][D], a bf16 or fp8 cache) over blocks [first, last]; leaves m, l, acc in w. vnni: B
// panels in the VNNI layout of oneDNN's AMX kernels.
template <typename KT>
void attend_matrix(const Step& st, const int32_t* item, const ItemBlocks<KT>& kv, Scratch& w,
                   int R, int64_t first, int64_t last, bool vnni);
// a matrix-layout cache type
template <typename KT>
constexpr bool kMatrixCache =
    std::is_same_v<KT, c10::BFloat16> || std::is_same_v<KT, c10::Float8_e4m3fn>;
// After a thread's last AMX brgemm: AMX tiles stay configured until released.
void release_matrix_tiles();

}  // namespace pa_attn
