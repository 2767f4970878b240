// Paged attention on the CPU (plugin-api cpu-arm-acl): plan, cache write, forward, split reduce.
//
// One work item = (request, KV heads, tile of query tokens, key range). All query heads of a KV
// head are processed together (GQA), so each K/V block is read once per item. A decode item takes
// up to kMaxHeadGroup KV heads: a cache block stores its heads next to each other, so the item
// reads one contiguous run of (heads x 2 x block x head size) elements per block instead of 4 KB
// pieces of it at unrelated times (random 4 KB reads get about 60% of the copy bandwidth on an
// EPYC VM; 64 KB runs all of it). Long key ranges
// are split so that a batch of one request still keeps every thread busy; split items write
// unnormalised partials (m, l, acc) that a second pass combines. Items are taken from a shared
// counter, largest first. Per-thread scratch is allocated once and reused across calls.
//
// Items of many rows (prefill tiles) can instead take the "matrix" layout (attend_matrix): their
// scores and P.V as bf16 GEMMs through torch's cpublas::brgemm, which runs oneDNN's AMX kernels
// where the CPU has AMX. Python decides per call (the attention-matrix setting).
//
// The entry points are plain C functions over raw pointers (called through ctypes): no pybind or
// torch/extension.h, which would multiply the build time. Python validates every argument first.
#include <ATen/Parallel.h>
#include <ATen/native/CPUBlas.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "attention_kernels.h"

#if defined(__x86_64__)
#include <fbgemm/Utils.h>  // transpose_simd: torch's x86 builds ship fbgemm
#endif

namespace pa_attn {

float g_fp8_table[256];

void init_fp8_table() {
  for (int i = 0; i < 256; ++i)
    g_fp8_table[i] = static_cast<float>(
        c10::Float8_e4m3fn(static_cast<uint8_t>(i), c10::Float8_e4m3fn::from_bits()));
}

namespace {

// A plan row (int32): see make_plan.
enum Field { kSeq, kKvh, kHeads, kQ0, kQn, kPos0, kK0, kK1, kProw, kFields };
// A reduce row (int32): query token range, first KV head and count, first partial row, splits.
enum RField { rQ0, rQn, rKvh, rHeads, rProw, rSplits, rFields };

// Rows at or above this use the "rows" score layout (see attention_kernels.h), or the matrix
// layout where the call asks for it.
constexpr int kRowsLayoutMin = 16;
// How an item's rows attend: attend_dot, attend_rows or attend_matrix.
enum class Layout { kDot, kRows, kMatrix };
// KV heads per decode item (dot layout); rows-layout items take one.
constexpr int64_t kMaxHeadGroup = 8;
// A run of the dot layout (attend_dot): whole blocks, at most kRunKeys keys and about
// kRunBytes of K and V over the item's heads (they stay in L2 between scores and P.V).
constexpr int64_t kRunKeys = 128;
constexpr int64_t kRunBytes = 128 << 10;
inline int64_t run_blocks(int64_t bs, int64_t heads, int64_t dim, int64_t elt) {
  const int64_t by_bytes = kRunBytes / (bs * dim * elt * 2 * heads);
  return std::max<int64_t>(1, std::min(kRunKeys / bs, by_bytes));
}

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
// Partials per query row that one reduction combines (finish_row's stack arrays).
constexpr int64_t kMaxSplits = 64;
// Largest head size (attention.py rejects larger ones): finish_row's stack row.
constexpr int64_t kMaxHeadSize = 512;

struct Geometry {
  int64_t heads, kv_heads, group, dim, block;
};

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

// ---- plan --------------------------------------------------------------------------------------

// Items for one step. tile_rows: target query rows (tokens x group) per item; long key ranges
// are cut into block-aligned parts of at least min_split_keys keys so that there are about 8
// items per thread.
struct Plan {
  std::vector<std::array<int32_t, kFields>> items;  // largest first
  std::vector<std::array<int32_t, rFields>> reduce;
  int64_t partial_rows = 0;
};

Plan make_plan(const int32_t* qsl, const int32_t* lens, int64_t S, int64_t group,
               int64_t kv_heads, int64_t block, bool causal, int64_t window, int64_t num_threads,
               int64_t tile_rows, int64_t min_split_keys) {
  const Masking mk{causal, window, 0.f};
  const int64_t T = std::max<int64_t>(1, tile_rows / group);

  struct Tile {
    int32_t seq, q0, qn, pos0, k0, k1;
    int64_t cost;
  };
  std::vector<Tile> tiles;
  int64_t total = 0;
  for (int64_t s = 0; s < S; ++s) {
    const int32_t n = qsl[s + 1] - qsl[s], len = lens[s];
    for (int32_t t0 = 0; t0 < n; t0 += T) {
      const int32_t qn = static_cast<int32_t>(std::min<int64_t>(T, n - t0));
      const int32_t pos0 = len - n + t0;
      int64_t lo0, hi0, lo1, hi1;
      visible(mk, pos0, len, &lo0, &hi0);
      visible(mk, pos0 + qn - 1, len, &lo1, &hi1);
      const int64_t k0 = std::min(lo0, lo1), k1 = std::max(hi0, hi1);
      const int64_t cost = (k1 - k0 + block) * qn * group;  // + block: per-item overhead
      tiles.push_back({static_cast<int32_t>(s), qsl[s] + t0, qn, pos0, static_cast<int32_t>(k0),
                       static_cast<int32_t>(k1), cost});
      total += cost * kv_heads;
    }
  }
  const int64_t target = num_threads > 1 ? std::max<int64_t>(1, total / (num_threads * 8)) : 0;

  Plan plan;
  std::vector<std::array<int32_t, kFields>> items;
  std::vector<int64_t> cost;
  for (const Tile& t : tiles) {
    const int64_t rows = static_cast<int64_t>(t.qn) * group;
    const int64_t hg = rows < kRowsLayoutMin ? std::min(kv_heads, kMaxHeadGroup) : 1;
    const int64_t first_block = t.k0 / block, last_block = (t.k1 - 1) / block;
    const int64_t nblocks = last_block - first_block + 1;
    int64_t splits = 1;
    if (target > 0 && t.cost * hg > target) {
      const int64_t by_cost = (t.cost * hg + target - 1) / target;
      const int64_t by_len = std::max<int64_t>(1, (t.k1 - t.k0) / min_split_keys);
      splits = std::min({by_cost, by_len, nblocks, kMaxSplits});
    }
    for (int64_t h = 0; h < kv_heads; h += hg) {
      const int64_t n = std::min(hg, kv_heads - h), item_rows = rows * n;
      const int32_t prow = static_cast<int32_t>(plan.partial_rows);
      if (splits > 1)
        plan.reduce.push_back({t.q0, t.qn, static_cast<int32_t>(h), static_cast<int32_t>(n),
                               prow, static_cast<int32_t>(splits)});
      for (int64_t p = 0; p < splits; ++p) {
        const int64_t b0 = first_block + nblocks * p / splits;
        const int64_t b1 = first_block + nblocks * (p + 1) / splits;
        const int32_t k0 = static_cast<int32_t>(std::max<int64_t>(t.k0, b0 * block));
        const int32_t k1 = static_cast<int32_t>(std::min<int64_t>(t.k1, b1 * block));
        items.push_back({t.seq, static_cast<int32_t>(h), static_cast<int32_t>(n), t.q0, t.qn,
                         t.pos0, k0, k1,
                         splits > 1 ? static_cast<int32_t>(plan.partial_rows) : -1});
        cost.push_back((k1 - k0 + block) * item_rows);
        if (splits > 1) plan.partial_rows += item_rows;
      }
    }
  }
  // largest first: the shared counter then balances the tail
  std::vector<int64_t> order(items.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return cost[a] > cost[b]; });
  plan.items.reserve(items.size());
  for (int64_t i : order) plan.items.push_back(items[i]);
  return plan;
}

// ---- per-thread scratch ------------------------------------------------------------------------

struct Scratch {
  std::vector<float> buf;
  float* q;      // dot: [R][D] ; rows: Q^T [D][Rp]
  float* acc;    // [Rp][D]
  float* s;      // dot: [R][run keys], with kDotBf16 [run keys][Rp] ; rows: [bs][Rp]
  float* kf;     // rows: K block as fp32 [bs][D]
  float* vf;     // rows: V block as fp32 [bs][D]
  float* m;      // [Rp]
  float* l;      // [Rp]
  float* alpha;  // [Rp]
  float* lo;     // [Rp] rows layout: visible key range as fp32
  float* hi;     // [Rp]
  c10::BFloat16* pb;  // the probabilities as bf16: dot layout with kDotBf16, paired words
                      // [run keys / 2][Rp] (pair_probs); matrix layout [R][run keys]
  std::vector<int> a, b;
  std::vector<c10::BFloat16> panels;  // matrix layout: B panels before and after packing

  void reserve(int64_t Rp, int64_t D, int64_t bs) {
    const int64_t align = 16;  // floats: 64 bytes
    auto up = [&](int64_t n) { return (n + align - 1) / align * align; };
    const int64_t keys = std::max(bs, kRunKeys);  // a rows block or a dot run
    const int64_t sizes[] = {Rp * D, Rp * D, Rp * keys, bs * D, bs * D, Rp, Rp, Rp, Rp, Rp,
                             (Rp * keys + 1) / 2};
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
    if (static_cast<int64_t>(a.size()) < Rp) {
      a.resize(Rp);
      b.resize(Rp);
    }
  }
};

Scratch& scratch() {
  thread_local Scratch w;
  return w;
}

// ---- one work item -----------------------------------------------------------------------------

struct Step {
  Geometry g;
  Masking mk;
  float scale;  // softmax scale, times k_scale for an fp8 cache
  const int32_t* block_table;
  int64_t bt_stride;
  const int32_t* seq_lens;
  bool ahead_l1;  // the dot layout prefetches the next block into L1, not L2 (see prefetch)
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

// The dot layout over runs of whole blocks (run_blocks): the scores of every block and KV head
// of the run, one softmax pass over the run, then P.V with the accumulators in registers across the
// run's blocks (per 16-key block instead, each row paid its max/exp/sum reductions and a reload
// of its accumulator every 16 keys). Rows of KV head i of the item: [i * Rh, (i + 1) * Rh).
// kBf16Dot: w.q holds the rows as bf16, unscaled, and the run's scores are S^T [key][Rp] (see
// attention_kernels.h); min_hi/max_lo as attend_rows'.
template <bool kBf16Dot, typename KT>
void attend_dot(const Step& st, const int32_t* item, const ItemBlocks<KT>& kv, Scratch& w, int R,
                int64_t Rp, int64_t first, int64_t last, float min_hi, float max_lo) {
  const Geometry& g = st.g;
  const int64_t D = g.dim, bs = g.block, heads = item[kHeads];
  const int Rh = R / static_cast<int>(heads);
  const int64_t k0 = item[kK0], k1 = item[kK1];
  const int64_t run = run_blocks(bs, heads, D, sizeof(KT)), lds = run * bs;
  static_assert(kRunKeys / 16 <= kMaxRunBlocks);
  const KT* vb[kMaxHeadGroup][kRunKeys / 16];
  const KT* kp = kv.k(first);
  const auto* q = [&] {  // the rows as load_queries left them
    if constexpr (kBf16Dot)
      return reinterpret_cast<const c10::BFloat16*>(w.q);
    else
      return static_cast<const float*>(w.q);
  }();
  for (int64_t c = first; c <= last; c += run) {
    const int64_t c_end = std::min(last + 1, c + run), kc = c * bs;
    const int cj0 = static_cast<int>(std::max<int64_t>(k0 - kc, 0));
    const int cj1 = static_cast<int>(std::min<int64_t>(k1 - kc, (c_end - c) * bs));
    for (int64_t b = c; b < c_end; ++b) {
      const int i = static_cast<int>(b - c), off = i * static_cast<int>(bs);
      const KT* next = b < last ? kv.k(b + 1) : nullptr;
      const int j0 = std::max(cj0 - off, 0), j1 = std::min(cj1 - off, static_cast<int>(bs));
      // heads in cache order, so that the block's K (and, prefetched, the next block's K) is
      // read front to back
      for (int64_t h = 0; h < heads; ++h) {
        const KT* kh = kp + h * kv.head;
        vb[h][i] = kh + kv.kv;
        const KT* next_k = next ? next + h * kv.head : nullptr;
#if defined(CPU_CAPABILITY_AVX512) && defined(__AVX512BF16__)
        if constexpr (kBf16Dot)
          qk_bf16(Rh, q + h * Rh * D, kh, D, j0, j1, w.s + off * Rp + h * Rh, Rp, next_k,
                  st.ahead_l1);
        else
#endif
          qk_dot(Rh, q + h * Rh * D, kh, D, j0, j1, w.s + h * Rh * lds + off, lds, next_k,
                 st.ahead_l1);
      }
      kp = next;
    }
    // head h's V rows of the next run, prefetched during head h's P.V
    const int64_t n_end = std::min(last + 1, c_end + run);
    auto next_v = [&](int64_t h) {
      LineQueue ahead;
      ahead.l1 = st.ahead_l1;
      for (int64_t b = c_end; b < n_end; ++b)
        ahead.add(kv.k(b) + h * kv.head + kv.kv, bs * D * static_cast<int64_t>(sizeof(KT)));
      return ahead;
    };
#if defined(CPU_CAPABILITY_AVX512) && defined(__AVX512BF16__)
    if constexpr (kBf16Dot) {
      const bool full = max_lo <= kc + cj0 && min_hi >= kc + cj1;
      softmax_rows(w.s, Rp, cj0, cj1, static_cast<float>(kc), w.lo, w.hi, full, st.scale,
                   st.mk.soft_cap, w.m, w.l, w.alpha);
      auto* pp = reinterpret_cast<uint32_t*>(w.pb);
      pair_probs(w.s, Rp, cj0, cj1, pp, Rp);
      for (int64_t h = 0; h < heads; ++h) {
        LineQueue ahead = next_v(h);
        pv(Rh, pp + h * Rh, Rp, VRows<KT>{vb[h], static_cast<int>(bs)}, D, cj0, cj1,
           w.alpha + h * Rh, w.acc + h * Rh * D, ahead);
      }
      continue;
    }
#endif
    run_ranges(w, R, kc, cj0, cj1);
    softmax_dot(w.s, lds, R, cj0, cj1, w.a.data(), w.b.data(), 1.f, st.mk.soft_cap, w.m, w.l,
                w.alpha);
    for (int64_t h = 0; h < heads; ++h) {
      LineQueue ahead = next_v(h);
      pv(Rh, w.s + h * Rh * lds, lds, 1, VRows<KT>{vb[h], static_cast<int>(bs)}, D, cj0, cj1,
         w.alpha + h * Rh, w.acc + h * Rh * D, ahead);
    }
  }
}

// The rows layout, one block at a time: the block's K and V widened to fp32 once, then scores,
// softmax and P.V vectorised over query rows. min_hi/max_lo: every row sees [max_lo, min_hi).
template <typename KT>
void attend_rows(const Step& st, const int32_t* item, const ItemBlocks<KT>& kv, Scratch& w, int R,
                 int64_t Rp, int64_t first, int64_t last, float min_hi, float max_lo) {
  const Geometry& g = st.g;
  const int64_t D = g.dim, bs = g.block;
  const int64_t k0 = item[kK0], k1 = item[kK1];
  const float* vf = w.vf;
  for (int64_t b = first; b <= last; ++b) {
    const int64_t kb = b * bs;
    const int j0 = static_cast<int>(std::max<int64_t>(k0 - kb, 0));
    const int j1 = static_cast<int>(std::min<int64_t>(k1 - kb, bs));
    const KT* kp = kv.k(b);
    const KT* vp = kp + kv.kv;
    const KT* next_k = b < last ? kv.k(b + 1) : nullptr;
    const KT* next_v = next_k ? next_k + kv.kv : nullptr;
    for (int j = 0; j < bs; ++j) {
      float* kr = w.kf + j * D;
      if (j < j0 || j >= j1) {
        std::fill(kr, kr + D, 0.f);
        continue;
      }
      float* vr = w.vf + j * D;
      prefetch_rows(next_k, next_v, j, 1, D);
      for (int64_t d = 0; d < D; d += kV) {
        load_f32(kp + j * D + d).store(kr + d);
        load_f32(vp + j * D + d).store(vr + d);
      }
    }
    qk_rows(w.kf, w.q, D, Rp, static_cast<int>(bs), w.s);
    const bool full = max_lo <= kb + j0 && min_hi >= kb + j1;
    softmax_rows(w.s, Rp, j0, j1, static_cast<float>(kb), w.lo, w.hi, full, 1.f,
                 st.mk.soft_cap, w.m, w.l, w.alpha);
    LineQueue none;  // the next block's V went out with its K above
    pv(R, w.s, 1, Rp, VRows<float>{&vf, static_cast<int>(bs)}, D, j0, j1, w.alpha, w.acc, none);
  }
}

// ---- the matrix layout: bf16 GEMMs through torch's cpublas::brgemm ---------------------------

// Columns of one B panel: cpublas::pack (oneDNN's transform) takes an output leading dimension
// of 16, 32, 48 or 64 only, so B is cut into panels of at most 64 columns (block and head sizes
// are multiples of 16, so every panel's width is one of those).
constexpr int64_t kPanel = 64;

// dst[j][i] = src[i][j] for an M x N bf16 matrix (leading dimensions as given).
inline void transpose(int64_t M, int64_t N, const c10::BFloat16* src, int64_t ld_src,
                      c10::BFloat16* dst, int64_t ld_dst) {
#if defined(__x86_64__)
  fbgemm::transpose_simd<uint16_t>(M, N, reinterpret_cast<const uint16_t*>(src), ld_src,
                                   reinterpret_cast<uint16_t*>(dst), ld_dst);
#else
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) dst[j * ld_dst + i] = src[i * ld_src + j];
#endif
}

// One B operand: `plain` [k][n] row-major (leading dimension n) as torch's gemm takes it, packed
// into `packed` when vnni (the layout oneDNN's AMX brgemm reads). Returns what brgemm gets.
inline const c10::BFloat16* finish_panel(const c10::BFloat16* plain, c10::BFloat16* packed,
                                         int64_t k, int64_t n, bool vnni) {
  if (!vnni) return plain;
  at::native::cpublas::pack(k, n, n, n, at::kBFloat16, at::kBFloat16, plain, packed);
  return packed;
}

// The rows of a many-row item (bf16 query as given in w.q [R][D], bf16 cache) over runs of whole
// blocks of about 64 keys: S = Q K^T by brgemm into w.s [R][run], the dot layout's online
// softmax (scale applied to the scores), P rounded to bf16 (as the Triton kernels round p to the
// model dtype for their P.V dot), then acc += P V by brgemm. K and V rows outside the item's key
// range enter the panels as zeros (a cache block past a sequence's end holds whatever was there
// before; 0 * NaN would poison the sum). vnni: B panels packed for oneDNN's AMX kernels
// (cpublas::could_pack); otherwise torch's gemm runs on the plain panels, the same loops, so
// that any machine tests them.
void attend_matrix(const Step& st, const int32_t* item, const ItemBlocks<c10::BFloat16>& kv,
                   Scratch& w, int R, int64_t first, int64_t last, bool vnni) {
  using BF = c10::BFloat16;
  namespace blas = at::native::cpublas;
  const int64_t D = st.g.dim, bs = st.g.block;
  const int64_t k0 = item[kK0], k1 = item[kK1];
  const int64_t run = std::max<int64_t>(1, kPanel / bs), lds = run * bs;
  const BF* q = reinterpret_cast<const BF*>(w.q);
  const int64_t panel = std::max(D, kPanel) * kPanel;
  if (static_cast<int64_t>(w.panels.size()) < 2 * panel) w.panels.resize(2 * panel);
  BF* plain = w.panels.data();
  BF* packed = plain + panel;
  for (int64_t c = first; c <= last; c += run) {
    const int64_t n = (std::min(last + 1, c + run) - c) * bs, kc = c * bs;
    const int64_t cj0 = std::max<int64_t>(k0 - kc, 0), cj1 = std::min<int64_t>(k1 - kc, n);
    // row j of the run (K: which = 0, V: which = 1); null outside the item's key range
    auto row = [&](int64_t j, int64_t which) -> const BF* {
      if (j < cj0 || j >= cj1) return nullptr;
      return kv.k(c + j / bs) + which * kv.kv + (j % bs) * D;
    };
    for (int64_t j = 0; j < n; j += kPanel) {  // scores, kPanel keys at a time
      const int64_t wn = std::min(kPanel, n - j);
      for (int64_t t = 0; t < wn;) {  // K^T panel [D][wn], one block's rows at a time
        const int64_t key = j + t;
        if (const BF* k = row(key, 0)) {
          const int64_t rows = std::min({wn - t, bs - key % bs, cj1 - key});
          transpose(rows, D, k, D, plain + t, wn);
          t += rows;
        } else {
          for (int64_t d = 0; d < D; ++d) plain[d * wn + t] = BF(0.f);
          ++t;
        }
      }
      blas::brgemm(R, wn, D, D, wn, lds, false, q, finish_panel(plain, packed, D, wn, vnni),
                   w.s + j, vnni);
    }
    run_ranges(w, R, kc, cj0, cj1);
    softmax_dot(w.s, lds, R, 0, static_cast<int>(n), w.a.data(), w.b.data(), st.scale,
                st.mk.soft_cap, w.m, w.l, w.alpha);
    for (int r = 0; r < R; ++r) {
      at::vec::convert(w.s + r * lds, w.pb + r * lds, n);
      if (w.alpha[r] != 1.f) {
        float* a = w.acc + r * D;
        for (int64_t d = 0; d < D; d += kV) (Vec::loadu(a + d) * Vec(w.alpha[r])).store(a + d);
      }
    }
    for (int64_t d0 = 0; d0 < D; d0 += kPanel) {  // P.V, kPanel output columns at a time
      const int64_t wc = std::min(kPanel, D - d0);
      for (int64_t j = 0; j < n; j += kPanel) {
        const int64_t wn = std::min(kPanel, n - j);
        for (int64_t t = 0; t < wn; ++t) {  // V panel [wn][wc]
          const BF* v = row(j + t, 1);
          if (v)
            std::memcpy(plain + t * wc, v + d0, sizeof(BF) * wc);
          else
            std::fill(plain + t * wc, plain + (t + 1) * wc, BF(0.f));
        }
        blas::brgemm(R, wc, wn, lds, wc, D, true, w.pb + j,
                     finish_panel(plain, packed, wn, wc, vnni), w.acc + d0, vnni);
      }
    }
  }
}

// Attend one item's rows (prepared in w.q) over its key range; leaves m, l, acc in w.
// vnni: the matrix layout's B panels are packed for oneDNN's AMX kernels.
template <bool kBf16Dot, typename KT>
void attend(const Step& st, const int32_t* item, const KT* cache, Scratch& w, Layout layout,
            int64_t Rp, bool vnni) {
  const Geometry& g = st.g;
  const int64_t D = g.dim, bs = g.block, G = g.group;
  const Rows rows{item[kQn] * G, G};
  const int R = static_cast<int>(rows.per_head * item[kHeads]);
  const int64_t len = st.seq_lens[item[kSeq]], k0 = item[kK0], k1 = item[kK1];
  // per-row visible key range, clipped to the item's range
  for (int64_t r = 0; r < Rp; ++r) {
    int64_t lo = 0, hi = 0;
    if (r < R) {
      visible(st.mk, item[kPos0] + rows.token(r), len, &lo, &hi);
      lo = std::max(lo, k0);
      hi = std::min(hi, k1);
    }
    w.lo[r] = static_cast<float>(lo);
    w.hi[r] = static_cast<float>(std::max(lo, hi));
    w.m[r] = kNegInf;
    w.l[r] = 0.f;
  }
  std::fill(w.acc, w.acc + static_cast<int64_t>(R) * D, 0.f);
  float min_hi = k1, max_lo = k0;
  for (int r = 0; r < R; ++r) {
    min_hi = std::min(min_hi, w.hi[r]);
    max_lo = std::max(max_lo, w.lo[r]);
  }
  const ItemBlocks<KT> kv{cache, st.block_table + item[kSeq] * st.bt_stride, g.kv_heads,
                          item[kKvh], bs * D, g.kv_heads * bs * D};
  const int64_t first = k0 / bs, last = (k1 - 1) / bs;
  if constexpr (std::is_same_v<KT, c10::BFloat16>)
    if (layout == Layout::kMatrix) return attend_matrix(st, item, kv, w, R, first, last, vnni);
  if (layout == Layout::kRows)
    attend_rows(st, item, kv, w, R, Rp, first, last, min_hi, max_lo);
  else
    attend_dot<kBf16Dot>(st, item, kv, w, R, Rp, first, last, min_hi, max_lo);
}

// Query rows of an item, scaled, as fp32: dot layout [R][D], rows layout Q^T [D][Rp].
// pair_split: the dot layout stores each row in load_pair's order for a bf16 cache.
// bf16_dot (dot layout with kDotBf16, and the matrix layout): the rows as given, bf16 and
// unscaled.
template <typename QT>
void load_queries(const Step& st, const int32_t* item, const QT* query, Scratch& w,
                  bool rows_layout, int64_t Rp, bool pair_split, bool bf16_dot) {
  const int64_t D = st.g.dim, G = st.g.group, H = st.g.heads;
  const Rows rows{item[kQn] * G, G};
  const int R = static_cast<int>(rows.per_head * item[kHeads]);
  for (int r = 0; r < R; ++r) {
    const QT* src = query + ((item[kQ0] + rows.token(r)) * H + rows.head(item[kKvh], r)) * D;
    if (rows_layout) {
      for (int64_t d = 0; d < D; ++d) w.q[d * Rp + r] = static_cast<float>(src[d]) * st.scale;
    } else if (bf16_dot) {
      std::memcpy(reinterpret_cast<c10::BFloat16*>(w.q) + r * D, src, sizeof(QT) * D);
    } else {
      float* row = w.q + r * D;
      const Vec scale(st.scale);
      int64_t d = 0;
      if (pair_split)  // whole chunks of 2 * kV in load_pair's order: even, then odd elements
        for (; d + 2 * kV <= D; d += 2 * kV) {
          const auto [even, odd] =
              at::vec::deinterleave2(load_f32(src + d), load_f32(src + d + kV));
          (even * scale).store(row + d);
          (odd * scale).store(row + d + kV);
        }
      for (; d + kV <= D; d += kV) (load_f32(src + d) * scale).store(row + d);
      for (; d < D; ++d) row[d] = static_cast<float>(src[d]) * st.scale;
    }
  }
  if (rows_layout)
    for (int64_t d = 0; d < D; ++d) std::fill(w.q + d * Rp + R, w.q + (d + 1) * Rp, 0.f);
}

// out_row = sum_s w_s acc_s / (sum_s w_s l_s + sink term), w_s = e^(m_s - M), times v_scale.
// pair_split: the accumulators are in load_pair's order (a dot-layout item over a bf16 cache).
template <typename QT>
void finish_row(const float* const* acc, const float* m, const float* l, int splits,
                const float* sink, float v_scale, int64_t D, bool pair_split, QT* out) {
  float M = sink ? *sink : kNegInf;
  for (int s = 0; s < splits; ++s) M = std::max(M, m[s]);
  if (M == kNegInf) {  // no visible key and no sink
    std::fill(out, out + D, static_cast<QT>(0.f));
    return;
  }
  float wts[kMaxSplits];
  float denom = sink ? std::exp(*sink - M) : 0.f;
  for (int s = 0; s < splits; ++s) {
    wts[s] = m[s] == kNegInf ? 0.f : std::exp(m[s] - M);
    denom += wts[s] * l[s];
  }
  const float norm = denom > 0.f ? v_scale / denom : 0.f;
  auto weighted = [&](int64_t d) {
    Vec o(0.f);
    for (int s = 0; s < splits; ++s) o = at::vec::fmadd(Vec(wts[s]), Vec::loadu(acc[s] + d), o);
    return o * Vec(norm);
  };
  alignas(64) float row[kMaxHeadSize];  // in natural order
  int64_t d = 0;
  if (pair_split)  // whole chunks of 2 * kV are even then odd elements: interleave them back
    for (; d + 2 * kV <= D; d += 2 * kV) {
      const auto [lo, hi] = at::vec::interleave2(weighted(d), weighted(d + kV));
      lo.store(row + d);
      hi.store(row + d + kV);
    }
  for (; d < D; d += kV) weighted(d).store(row + d);
  for (d = 0; d < D; ++d) out[d] = static_cast<QT>(row[d]);
}

struct Buffers {
  float* pacc;  // [partial_rows, D]
  float* pml;   // [partial_rows, 2]
  const float* sinks;
  float v_scale;
};

// matrix: items of kRowsLayoutMin rows or more per KV head take the matrix layout (bf16 query and
// cache only); vnni: its B panels are packed for oneDNN's AMX kernels.
template <typename KT, typename QT>
void run_items(const Step& st, const int32_t* it, int64_t U, const KT* cache, const QT* query,
               QT* out, const Buffers& bufs, bool matrix, bool vnni) {
  const int64_t D = st.g.dim, G = st.g.group, H = st.g.heads;
  constexpr bool kMatrixTypes =
      std::is_same_v<KT, c10::BFloat16> && std::is_same_v<QT, c10::BFloat16>;
  std::atomic<int64_t> next{0};
  const int64_t workers = std::min<int64_t>(at::get_num_threads(), std::max<int64_t>(U, 1));
  at::parallel_for(0, workers, 1, [&](int64_t, int64_t) {
    Scratch& w = scratch();
    bool brgemm_used = false;
    for (int64_t u = next.fetch_add(1); u < U; u = next.fetch_add(1)) {
      const int32_t* item = it + u * kFields;
      const Rows rows{item[kQn] * G, G};
      const int R = static_cast<int>(rows.per_head * item[kHeads]);
      // make_plan gives a rows-layout item a single KV head
      const bool rows_layout = rows.per_head >= kRowsLayoutMin;
      const Layout layout = !rows_layout                     ? Layout::kDot
                            : matrix && kMatrixTypes ? Layout::kMatrix
                                                             : Layout::kRows;
      constexpr bool kBf16Dot = kDotBf16<KT, QT>;
      // the rows layout and kBf16Dot's S^T take whole vectors of rows
      const bool padded = layout == Layout::kRows || (kBf16Dot && layout == Layout::kDot);
      const int64_t Rp = padded ? (R + kV - 1) / kV * kV : R;
      w.reserve(Rp, D, st.g.block);
      if (layout == Layout::kMatrix) {  // the rows as given: bf16, unscaled
        load_queries(st, item, query, w, false, Rp, false, true);
        brgemm_used = true;
      } else {
        load_queries(st, item, query, w, rows_layout, Rp, kPairSplit<KT>,
                     kBf16Dot && !rows_layout);
      }
      attend<kBf16Dot>(st, item, cache, w, layout, Rp, vnni);
      if (item[kProw] >= 0) {
        float* pacc = bufs.pacc + static_cast<int64_t>(item[kProw]) * D;
        float* pml = bufs.pml + static_cast<int64_t>(item[kProw]) * 2;
        std::memcpy(pacc, w.acc, sizeof(float) * R * D);
        for (int r = 0; r < R; ++r) {
          pml[2 * r] = w.m[r];
          pml[2 * r + 1] = w.l[r];
        }
        continue;
      }
      for (int r = 0; r < R; ++r) {
        const int64_t h = rows.head(item[kKvh], r);
        const float* acc = w.acc + r * D;
        finish_row(&acc, w.m + r, w.l + r, 1, bufs.sinks ? bufs.sinks + h : nullptr,
                   bufs.v_scale, D, kPairSplit<KT> && !rows_layout,
                   out + ((item[kQ0] + rows.token(r)) * H + h) * D);
      }
    }
    // AMX tiles stay configured after a brgemm until released (as torch's own kernels do)
    if (brgemm_used && vnni) at::native::cpublas::brgemm_release(true);
  });
}

// pair_split: dot-layout partials (fewer than kRowsLayoutMin rows) are in load_pair's order.
template <typename QT>
void run_reduce(const Step& st, const int32_t* rd, int64_t E, QT* out, const Buffers& bufs,
                bool pair_split) {
  const int64_t D = st.g.dim, G = st.g.group, H = st.g.heads;
  at::parallel_for(0, E, 1, [&](int64_t e0, int64_t e1) {
    const float* acc[kMaxSplits];
    float m[kMaxSplits], l[kMaxSplits];
    for (int64_t e = e0; e < e1; ++e) {
      const int32_t* x = rd + e * rFields;
      const Rows rows{x[rQn] * G, G};
      const int64_t R = rows.per_head * x[rHeads];
      for (int64_t r = 0; r < R; ++r) {
        for (int s = 0; s < x[rSplits]; ++s) {
          const int64_t row = x[rProw] + s * R + r;
          acc[s] = bufs.pacc + row * D;
          m[s] = bufs.pml[2 * row];
          l[s] = bufs.pml[2 * row + 1];
        }
        const int64_t h = rows.head(x[rKvh], r);
        finish_row(acc, m, l, x[rSplits], bufs.sinks ? bufs.sinks + h : nullptr, bufs.v_scale,
                   D, pair_split && rows.per_head < kRowsLayoutMin,
                   out + ((x[rQ0] + rows.token(r)) * H + h) * D);
      }
    }
  });
}

// Element types by the dtype codes Python passes.
enum DType : int64_t { kF32 = 0, kBF16 = 1, kF16 = 2, kFP8 = 3 };

template <typename F>
bool dispatch_model(int64_t code, F&& f) {
  switch (code) {
    case kF32: f(float{}); return true;
    case kBF16: f(c10::BFloat16{}); return true;
    case kF16: f(c10::Half{}); return true;
    default: return false;
  }
}

template <typename F>
bool dispatch_cache(int64_t code, F&& f) {
  if (code == kFP8) {
    f(c10::Float8_e4m3fn{});
    return true;
  }
  return dispatch_model(code, f);
}

// key/value rows (last dim contiguous, strides in elements) -> cache [nb, 2, KH, bs, D] at
// slots[t]; slot -1 is skipped. An fp8 cache stores cast_rne(clamp(x / scale, -448, 448)).
template <typename IT, typename CT>
void write_kv_typed(const IT* ks, const IT* vs, int64_t tok_stride_k, int64_t head_stride_k,
                    int64_t tok_stride_v, int64_t head_stride_v, CT* cache, const int64_t* slots,
                    int64_t tokens, int64_t KH, int64_t D, int64_t bs, float k_scale,
                    float v_scale) {
  constexpr bool fp8 = std::is_same_v<CT, c10::Float8_e4m3fn>;
  at::parallel_for(0, tokens, 16, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t slot = slots[t];
      if (slot < 0) continue;
      const int64_t blk = slot / bs, off = slot % bs;
      for (int kv = 0; kv < 2; ++kv) {
        const IT* src = kv == 0 ? ks + t * tok_stride_k : vs + t * tok_stride_v;
        const int64_t hs = kv == 0 ? head_stride_k : head_stride_v;
        const float scale = kv == 0 ? k_scale : v_scale;
        for (int64_t h = 0; h < KH; ++h) {
          CT* dst = cache + (((blk * 2 + kv) * KH + h) * bs + off) * D;
          const IT* x = src + h * hs;
          for (int64_t d = 0; d < D; ++d) {
            float f = static_cast<float>(x[d]);
            if constexpr (fp8) f = std::min(std::max(f / scale, -448.f), 448.f);
            dst[d] = static_cast<CT>(f);
          }
        }
      }
    }
  });
}

}  // namespace
}  // namespace pa_attn

using namespace pa_attn;

#define PA_EXPORT extern "C" __attribute__((visibility("default")))

PA_EXPORT void pa_attn_init() { init_fp8_table(); }

PA_EXPORT const float* pa_attn_fp8_table() { return g_fp8_table; }

PA_EXPORT int64_t pa_attn_vector_width() { return kV; }

// 1 when torch's oneDNN ukernel packs bf16 B panels for a matrix engine (AMX) on this CPU: the
// matrix layout then runs oneDNN's AMX brgemm, else torch's gemm.
PA_EXPORT int64_t pa_attn_matrix_engine() {
  return at::native::cpublas::could_pack(at::kBFloat16) ? 1 : 0;
}

namespace {
thread_local std::string g_last_error;  // what the last failed call on this thread raised
}

// The message of the exception that made this thread's last pa_attn_forward return -2.
PA_EXPORT const char* pa_attn_last_error() { return g_last_error.c_str(); }

// Plans a step. counts[3] receives (items, reduce rows, partial rows); items_out
// [items, kFields] and reduce_out [reduce rows, rFields] (ITEM_FIELDS, REDUCE_FIELDS in
// attention.py) are filled when not null (call once to size them).
PA_EXPORT void pa_attn_plan(const int32_t* qsl, const int32_t* lens, int64_t S, int64_t group,
                            int64_t kv_heads, int64_t block, int64_t causal, int64_t window,
                            int64_t num_threads, int64_t tile_rows, int64_t min_split_keys,
                            int64_t* counts, int32_t* items_out, int32_t* reduce_out) {
  const Plan p = make_plan(qsl, lens, S, group, kv_heads, block, causal != 0, window,
                           num_threads, tile_rows, min_split_keys);
  counts[0] = static_cast<int64_t>(p.items.size());
  counts[1] = static_cast<int64_t>(p.reduce.size());
  counts[2] = p.partial_rows;
  if (items_out && !p.items.empty())
    std::memcpy(items_out, p.items.data(), sizeof(int32_t) * kFields * p.items.size());
  if (reduce_out && !p.reduce.empty())
    std::memcpy(reduce_out, p.reduce.data(), sizeof(int32_t) * rFields * p.reduce.size());
}

// query/out [T, H, D] contiguous (model dtype), cache [nb, 2, KH, bs, D] (cache dtype),
// block_table int32 [S, bt_stride], sinks fp32 [H] or null. matrix != 0: items of 16 or more rows
// per KV head take the matrix layout (bf16 query and cache). ahead_l1 != 0: the dot layout's
// prefetches of the next block go to L1 (Step::ahead_l1). Returns 0, -1 on a bad dtype code,
// or -2 when a torch call raised (pa_attn_last_error says what; out is then incomplete).
PA_EXPORT int64_t pa_attn_forward(const void* query, const void* cache, int64_t model_dtype,
                                  int64_t cache_dtype, const int32_t* block_table,
                                  int64_t bt_stride, const int32_t* seq_lens, const int32_t* items,
                                  int64_t num_items, const int32_t* reduce, int64_t num_reduce,
                                  float* partial_acc, float* partial_ml, const float* sinks,
                                  void* out, int64_t heads, int64_t kv_heads, int64_t dim,
                                  int64_t block, double scale, double k_scale, double v_scale,
                                  int64_t causal, int64_t window, double soft_cap,
                                  int64_t matrix, int64_t ahead_l1) {
  const Step st{{heads, kv_heads, heads / kv_heads, dim, block},
                {causal != 0, window, static_cast<float>(soft_cap)},
                static_cast<float>(scale * k_scale),
                block_table,
                bt_stride,
                seq_lens,
                ahead_l1 != 0};
  const Buffers bufs{partial_acc, partial_ml, sinks, static_cast<float>(v_scale)};
  const bool vnni = matrix != 0 && at::native::cpublas::could_pack(at::kBFloat16);
  bool ok = false;
  try {
    dispatch_model(model_dtype, [&](auto qtag) {
      using QT = decltype(qtag);
      const QT* q = static_cast<const QT*>(query);
      QT* o = static_cast<QT*>(out);
      ok = dispatch_cache(cache_dtype, [&](auto ctag) {
        using KT = decltype(ctag);
        run_items(st, items, num_items, static_cast<const KT*>(cache), q, o, bufs, matrix != 0,
                  vnni);
        if (num_reduce > 0) run_reduce(st, reduce, num_reduce, o, bufs, kPairSplit<KT>);
      });
    });
  } catch (const std::exception& e) {  // a C++ exception must not cross the C boundary
    g_last_error = e.what();
    return -2;
  }
  return ok ? 0 : -1;
}

// Stores this step's key/value rows into the cache. Returns 0, or -1 on a bad dtype code.
PA_EXPORT int64_t pa_attn_write_kv(const void* key, const void* value, int64_t model_dtype,
                                   int64_t tok_stride_k, int64_t head_stride_k,
                                   int64_t tok_stride_v, int64_t head_stride_v, void* cache,
                                   int64_t cache_dtype, const int64_t* slots, int64_t tokens,
                                   int64_t kv_heads, int64_t dim, int64_t block, double k_scale,
                                   double v_scale) {
  bool ok = false;
  dispatch_model(model_dtype, [&](auto itag) {
    using IT = decltype(itag);
    ok = dispatch_cache(cache_dtype, [&](auto ctag) {
      using CT = decltype(ctag);
      write_kv_typed(static_cast<const IT*>(key), static_cast<const IT*>(value), tok_stride_k,
                     head_stride_k, tok_stride_v, head_stride_v, static_cast<CT*>(cache), slots,
                     tokens, kv_heads, dim, block, static_cast<float>(k_scale),
                     static_cast<float>(v_scale));
    });
  });
  return ok ? 0 : -1;
}
