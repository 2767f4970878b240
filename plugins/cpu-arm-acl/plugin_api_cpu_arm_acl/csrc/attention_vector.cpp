// Paged attention on the CPU: the vector layouts ("dot" for few rows per KV head, "rows" for
// many; attention_kernels.h), the cache write and the split reduction, compiled once per ISA
// variant over torch's at::vec. Items of the matrix layout go to attend_matrix
// (attention_matrix.cpp); the plan is attention_plan.cpp's.
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <type_traits>

#include "attention.h"
#include "attention_item.h"
#include "attention_tiles.h"

namespace pa_attn {

float g_fp8_table[256];

void init_fp8_table() {
  for (int i = 0; i < 256; ++i)
    g_fp8_table[i] = static_cast<float>(
        c10::Float8_e4m3fn(static_cast<uint8_t>(i), c10::Float8_e4m3fn::from_bits()));
}

Scratch& scratch() {
  thread_local Scratch w;
  return w;
}

namespace {

// the alpha of a P.V call that adds to an accumulator already rescaled (pv_visible's `one`)
constexpr float kOne = 1.f;

// filled when the library loads, before any op can run
[[maybe_unused]] const bool kFp8TableReady = (init_fp8_table(), true);

// The dot layout over runs of whole blocks (run_blocks): the scores of every block and KV head
// of the run, one softmax pass over the run, then P.V with the accumulators in registers across the
// run's blocks. Rows of KV head i of the item: [i * Rh, (i + 1) * Rh).
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
#if defined(CPU_CAPABILITY_AVX512) && defined(__AVX512BF16__)
  // a bf16 cache's scores on AMX tiles where granted (attention_tiles.h)
  constexpr bool kTileable = kBf16Dot && std::is_same_v<KT, c10::BFloat16>;
  const bool tiles = kTileable && tile_scores(D, bs, Rh);
  thread_local std::vector<uint32_t> qt;
  if constexpr (kTileable) {
    if (tiles) {
      pack_query_pairs(q, static_cast<int>(heads), Rh, D, qt);
      configure_score_tiles(Rh);
    }
  }
#endif
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
        if constexpr (kTileable) {
          if (tiles) {
            qk_tiles(Rh, query_pairs_of(qt, h, Rh, D), kh, D, j0, j1, w.s + off * Rp + h * Rh,
                     Rp, next_k, st.ahead_l1);
            continue;
          }
        }
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
      if (!full) run_ranges(w, R, kc, cj0, cj1);
      for (int64_t h = 0; h < heads; ++h) {
        LineQueue ahead = next_v(h);
        const VRows<KT> v{vb[h], static_cast<int>(bs)};
        const int64_t r0 = h * Rh;
        auto all = [&](int x, int y) {
          pv(Rh, pp + r0, Rp, v, D, x, y, w.alpha + r0, w.acc + r0 * D, ahead);
        };
        if (full) {
          all(cj0, cj1);
          continue;
        }
        pv_visible(Rh, w.a.data() + r0, w.b.data() + r0, cj0, cj1, all, [&](int r, int x, int y) {
          LineQueue none;
          pv(1, pp + r0 + r, Rp, v, D, x, y, &kOne, w.acc + (r0 + r) * D, none);
        });
      }
      continue;
    }
#endif
    run_ranges(w, R, kc, cj0, cj1);
    softmax_dot(w.s, lds, R, cj0, cj1, w.a.data(), w.b.data(), 1.f, st.mk.soft_cap, w.m, w.l,
                w.alpha);
    for (int64_t h = 0; h < heads; ++h) {
      LineQueue ahead = next_v(h);
      const VRows<KT> v{vb[h], static_cast<int>(bs)};
      const int64_t r0 = h * Rh;
      pv_visible(
          Rh, w.a.data() + r0, w.b.data() + r0, cj0, cj1,
          [&](int x, int y) {
            pv(Rh, w.s + r0 * lds, lds, 1, v, D, x, y, w.alpha + r0, w.acc + r0 * D, ahead);
          },
          [&](int r, int x, int y) {
            LineQueue none;
            pv(1, w.s + (r0 + r) * lds, lds, 1, v, D, x, y, &kOne, w.acc + (r0 + r) * D, none);
          });
    }
  }
#if defined(CPU_CAPABILITY_AVX512) && defined(__AVX512BF16__)
  if constexpr (kTileable)
    if (tiles) release_tiles();
#endif
}

// The rows layout, over runs of whole blocks (rows_run_blocks): the run's K and V widened to fp32
// once, then scores, one softmax pass and P.V vectorised over query rows, so that P.V keeps its
// accumulators in registers across the run (a pass per block reloaded and rescaled them every
// block). min_hi/max_lo: every row sees [max_lo, min_hi).
template <typename KT>
void attend_rows(const Step& st, const int32_t* item, const ItemBlocks<KT>& kv, Scratch& w, int R,
                 int64_t Rp, int64_t first, int64_t last, float min_hi, float max_lo) {
  const Geometry& g = st.g;
  const int64_t D = g.dim, bs = g.block, run = rows_run_blocks(bs);
  const int64_t k0 = item[kK0], k1 = item[kK1];
  const float* vf = w.vf;
  for (int64_t c = first; c <= last; c += run) {
    const int64_t c_end = std::min(last + 1, c + run), kc = c * bs;
    const int n = static_cast<int>((c_end - c) * bs);
    const int j0 = static_cast<int>(std::max<int64_t>(k0 - kc, 0));
    const int j1 = static_cast<int>(std::min<int64_t>(k1 - kc, n));
    for (int64_t b = c; b < c_end; ++b) {
      const int off = static_cast<int>((b - c) * bs);
      const KT* kp = kv.k(b);
      const KT* vp = kp + kv.kv;
      const KT* next_k = b < last ? kv.k(b + 1) : nullptr;
      const KT* next_v = next_k ? next_k + kv.kv : nullptr;
      for (int j = 0; j < bs; ++j) {
        float* kr = w.kf + (off + j) * D;
        if (off + j < j0 || off + j >= j1) {
          std::fill(kr, kr + D, 0.f);
          continue;
        }
        float* vr = w.vf + (off + j) * D;
        prefetch_rows(next_k, next_v, j, 1, D);
        for (int64_t d = 0; d < D; d += kV) {
          load_f32(kp + j * D + d).store(kr + d);
          load_f32(vp + j * D + d).store(vr + d);
        }
      }
    }
    qk_rows(w.kf, w.q, D, Rp, n, w.s);
    const bool full = max_lo <= kc + j0 && min_hi >= kc + j1;
    softmax_rows(w.s, Rp, j0, j1, static_cast<float>(kc), w.lo, w.hi, full, 1.f,
                 st.mk.soft_cap, w.m, w.l, w.alpha);
    LineQueue none;  // the next block's V went out with its K above
    const VRows<float> v{&vf, n};
    auto all = [&](int x, int y) { pv(R, w.s, 1, Rp, v, D, x, y, w.alpha, w.acc, none); };
    if (full) {
      all(j0, j1);
      continue;
    }
    run_ranges(w, R, kc, j0, j1);
    pv_visible(R, w.a.data(), w.b.data(), j0, j1, all, [&](int r, int x, int y) {
      pv(1, w.s + r, 1, Rp, v, D, x, y, &kOne, w.acc + r * D, none);
    });
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
  if constexpr (kMatrixCache<KT>)
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
  const int64_t D = st.g.dim, G = st.g.group;
  const Rows rows{item[kQn] * G, G};
  const int R = static_cast<int>(rows.per_head * item[kHeads]);
  for (int r = 0; r < R; ++r) {
    const QT* src = query + (item[kQ0] + rows.token(r)) * st.q_tok_stride +
                    rows.head(item[kKvh], r) * st.q_head_stride;
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
// pair_split: the accumulators are in pair order (kPairAcc: a dot-layout item over a bf16 cache,
// or any cache on the vdpbf16ps path).
template <typename QT>
void finish_row(const float* const* acc, const float* m, const float* l, int splits,
                const float* sink, float v_scale, int64_t D, bool pair_split, QT* out) {
  float M = sink ? *sink : kNegInf;
  for (int s = 0; s < splits; ++s) {
    if (std::isnan(m[s])) {  // a visible key's score was NaN: so is every output, per IEEE
      std::fill(out, out + D, static_cast<QT>(std::numeric_limits<float>::quiet_NaN()));
      return;
    }
    M = std::max(M, m[s]);
  }
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

// matrix: items of kRowsLayoutMin rows or more per KV head take the matrix layout (bf16 query, bf16
// or fp8 cache only); vnni: its B panels are packed for oneDNN's AMX kernels.
template <typename KT, typename QT>
void run_items(const Step& st, const int32_t* it, int64_t U, const KT* cache, const QT* query,
               QT* out, const Buffers& bufs, bool matrix, bool vnni) {
  const int64_t D = st.g.dim, G = st.g.group, H = st.g.heads;
  constexpr bool kMatrixTypes = kMatrixCache<KT> && std::is_same_v<QT, c10::BFloat16>;
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
                   bufs.v_scale, D, kPairAcc<KT, QT> && !rows_layout,
                   out + ((item[kQ0] + rows.token(r)) * H + h) * D);
      }
    }
    // AMX tiles stay configured after a brgemm until released (as torch's own kernels do)
    if (brgemm_used && vnni) release_matrix_tiles();
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

void forward(const ForwardArgs& a) {
  const Step st{{a.heads, a.kv_heads, a.heads / a.kv_heads, a.dim, a.block},
                {a.causal, a.window, static_cast<float>(a.soft_cap)},
                static_cast<float>(a.scale * a.k_scale),
                a.block_table,
                a.bt_stride,
                a.seq_lens,
                a.ahead_l1,
                a.q_tok_stride,
                a.q_head_stride};
  const Buffers bufs{a.partial_acc, a.partial_ml, a.sinks, static_cast<float>(a.v_scale)};
  const bool vnni = a.matrix && matrix_engine();
  const bool ok = dispatch_model(a.model_dtype, [&](auto qtag) {
    using QT = decltype(qtag);
    const QT* q = static_cast<const QT*>(a.query);
    QT* o = static_cast<QT*>(a.out);
    const bool cache_ok = dispatch_cache(a.cache_dtype, [&](auto ctag) {
      using KT = decltype(ctag);
      run_items(st, a.items, a.num_items, static_cast<const KT*>(a.cache), q, o, bufs, a.matrix,
                vnni);
      if (a.num_reduce > 0) run_reduce(st, a.reduce, a.num_reduce, o, bufs, kPairAcc<KT, QT>);
    });
    if (!cache_ok) throw std::invalid_argument("attention forward: bad cache dtype code");
  });
  if (!ok) throw std::invalid_argument("attention forward: bad model dtype code");
}

void write_kv(const WriteKvArgs& a) {
  const bool ok = dispatch_model(a.model_dtype, [&](auto itag) {
    using IT = decltype(itag);
    const bool cache_ok = dispatch_cache(a.cache_dtype, [&](auto ctag) {
      using CT = decltype(ctag);
      write_kv_typed(static_cast<const IT*>(a.key), static_cast<const IT*>(a.value),
                     a.tok_stride_k, a.head_stride_k, a.tok_stride_v, a.head_stride_v,
                     static_cast<CT*>(a.cache), a.slots, a.tokens, a.kv_heads, a.dim, a.block,
                     static_cast<float>(a.k_scale), static_cast<float>(a.v_scale));
    });
    if (!cache_ok) throw std::invalid_argument("attention write_kv: bad cache dtype code");
  });
  if (!ok) throw std::invalid_argument("attention write_kv: bad model dtype code");
}

int64_t vector_width() { return kV; }

void fp8_values(float* out) {
  uint8_t bytes[256];
  for (int i = 0; i < 256; ++i) bytes[i] = static_cast<uint8_t>(i);
  for (int i = 0; i < 256; i += kV)
    load_f32(reinterpret_cast<const c10::Float8_e4m3fn*>(bytes + i)).store(out + i);
}

bool fp8_bf16_values([[maybe_unused]] uint16_t* out) {
#if defined(CPU_CAPABILITY_AVX512) && defined(__AVX512BF16__)
  uint8_t bytes[256];
  for (int i = 0; i < 256; ++i) bytes[i] = static_cast<uint8_t>(i);
  // bytes 0-127 one row at a time, 128-255 two rows per lookup (the other index tables)
  for (int i = 0; i < 128; i += 32)
    _mm512_storeu_si512(out + i, load_bf16(reinterpret_cast<const c10::Float8_e4m3fn*>(bytes + i),
                                           ~__mmask32{0}));
  for (int i = 128; i < 256; i += 64) {
    __m512i x, y;
    fp8_to_bf16_x2(_mm512_loadu_si512(bytes + i), x, y);
    _mm512_storeu_si512(out + i, x);
    _mm512_storeu_si512(out + i + 32, y);
  }
  return true;
#elif defined(CPU_CAPABILITY_AVX2)
  // every byte through both 128-bit lanes (the vpshufb table is per lane): the lower lanes'
  // words, then 0xFFFF where an upper lane's word differs
  uint8_t bytes[256 + 16];
  for (int i = 0; i < 256 + 16; ++i) bytes[i] = static_cast<uint8_t>(i);
  alignas(32) uint16_t w[16];
  for (int pass = 0; pass < 2; ++pass)
    for (int i = 0; i < 256; i += 8) {
      const auto* p = reinterpret_cast<const c10::Float8_e4m3fn*>(bytes + i);
      _mm256_store_si256(reinterpret_cast<__m256i*>(w), fp8_bf16_words_avx2(p));
      for (int e = 0; e < 8; ++e) {
        if (pass == 0) {
          out[i + e] = w[e];
        } else {
          uint16_t& o = out[(i + 8 + e) & 255];
          o = o == w[8 + e] ? o : 0xFFFF;
        }
      }
    }
  return true;
#else
  return false;
#endif
}

}  // namespace pa_attn
