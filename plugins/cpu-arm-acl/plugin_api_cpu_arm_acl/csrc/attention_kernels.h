// The inner loops of paged attention for one (request, KV head, key range) work item: scores,
// online softmax and P.V, in fp32 over at::vec (with AVX-512 BF16, bf16 operands of fp32
// dot products: kDotBf16). Two score layouts:
// - "dot" (few rows, decode): S[r][j] = q_r . k_j, vectorised over the head dim, K read straight
//   from the cache; every K element is converted once and used by all rows of the tile. With
//   kDotBf16 the sums are stored as S^T[j][r] and the softmax runs vertically, as in "rows".
// - "rows" (many rows, prefill or wide GQA): S^T[j][r] = sum_d K[j][d] Q^T[d][r], vectorised over
//   query rows with K broadcast from an fp32 copy of the block; softmax is then vertical too.
#pragma once

#include "attention_vec.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace pa_attn {

// Fully unroll loops over register tiles early, so that the tile arrays live in registers.
#define PA_UNROLL _Pragma("GCC unroll 16")
// The tile kernels go inline into their row loops (gcc leaves them as calls at -O3, measurably
// slower).
#define PA_TILE __attribute__((always_inline)) inline
#define PA_TILE_LAMBDA __attribute__((always_inline))

// ---- scores, dot layout ------------------------------------------------------------------------

// s[r * lds + j + t] = the lanes of acc[r][t] summed.
template <int MR, int NT>
PA_TILE void store_scores(const Vec (&acc)[MR][NT], int j, float* s, int64_t lds) {
  if constexpr (MR * NT == 8) {
    alignas(32) float sums[8];
    Vec flat[8];  // a copy, so that acc itself never has its address taken
    PA_UNROLL
    for (int i = 0; i < 8; ++i) flat[i] = acc[i / NT][i % NT];
    reduce_add_8(flat, sums);
    PA_UNROLL
    for (int r = 0; r < MR; ++r)
      PA_UNROLL
      for (int t = 0; t < NT; ++t) s[r * lds + j + t] = sums[r * NT + t];
  } else {
    PA_UNROLL
    for (int r = 0; r < MR; ++r)
      PA_UNROLL
      for (int t = 0; t < NT; ++t) s[r * lds + j + t] = reduce_add(acc[r][t]);
  }
}

// S[r][j..j+NT) for MR rows: q fp32 [MR][D], k cache rows [.][D].
template <int MR, int NT, typename KT>
PA_TILE void qk_dot_tile(const float* q, const KT* k, int64_t D, int j, float* s, int64_t lds) {
  Vec acc[MR][NT];
  PA_UNROLL
  for (int r = 0; r < MR; ++r)
    PA_UNROLL
    for (int t = 0; t < NT; ++t) acc[r][t] = Vec(0.f);
  int64_t d = 0;
  for (; d + 2 * kV <= D; d += 2 * kV) {  // q is stored in load_pair's order
    Vec k0[NT], k1[NT];
    PA_UNROLL
    for (int t = 0; t < NT; ++t) load_pair(k + (j + t) * D + d, k0[t], k1[t]);
    PA_UNROLL
    for (int r = 0; r < MR; ++r) {
      const Vec q0 = Vec::loadu(q + r * D + d);
      PA_UNROLL
      for (int t = 0; t < NT; ++t) acc[r][t] = at::vec::fmadd(q0, k0[t], acc[r][t]);
      const Vec q1 = Vec::loadu(q + r * D + d + kV);
      PA_UNROLL
      for (int t = 0; t < NT; ++t) acc[r][t] = at::vec::fmadd(q1, k1[t], acc[r][t]);
    }
  }
  for (; d < D; d += kV) {
    Vec kv[NT];
    PA_UNROLL
    for (int t = 0; t < NT; ++t) kv[t] = load_f32(k + (j + t) * D + d);
    PA_UNROLL
    for (int r = 0; r < MR; ++r) {
      const Vec qv = Vec::loadu(q + r * D + d);
      PA_UNROLL
      for (int t = 0; t < NT; ++t) acc[r][t] = at::vec::fmadd(qv, kv[t], acc[r][t]);
    }
  }
  store_scores<MR, NT>(acc, j, s, lds);
}


// Rows [j, j + n) of the next block's K and V (null when there is none), spread over the
// current block's tiles so that the requests never pile up.
template <typename KT>
inline void prefetch_rows(const KT* next_k, const KT* next_v, int j, int n, int64_t D) {
  if (next_k == nullptr) return;
  prefetch(next_k + j * D, n * D * static_cast<int64_t>(sizeof(KT)));
  prefetch(next_v + j * D, n * D * static_cast<int64_t>(sizeof(KT)));
}

template <int MR, typename QT, typename KT>
inline void qk_dot_rows(const QT* q, const KT* k, int64_t D, int j0, int j1, float* s,
                        int64_t lds, const KT* next_k, bool l1) {
  // enough independent accumulators to keep both FMA pipes busy, few enough not to spill
  // (AVX2 has 16 vector registers: MR * NT accumulators + NT loads + 1)
  constexpr int NT = MR >= 3 ? 2 : 4;
  constexpr int64_t elt = sizeof(KT);
  int j = j0;
  for (; j + NT <= j1; j += NT) {
    if (next_k) prefetch(next_k + j * D, NT * D * elt, l1);
    // this block's K rows two tiles ahead, from L2 into L1, on AVX-512 builds (measured faster
    // there, slower on AVX2: docs/measurements/cpu-arm-acl/2026-12-03-zen4.md); not when the next block's prefetches go
    // to L1 already (l1)
    if constexpr (kV >= 16)
      if (!l1 && j + 3 * NT <= j1) prefetch_l1(k + (j + 2 * NT) * D, NT * D * elt);
    qk_dot_tile<MR, NT>(q, k, D, j, s, lds);
  }
  for (; j < j1; ++j) {
    if (next_k) prefetch(next_k + j * D, D * elt, l1);
    qk_dot_tile<MR, 1>(q, k, D, j, s, lds);
  }
}

// next_k: the next block's K rows to prefetch (null: none), read while the first row tile runs
// (its V rows go out during P.V: LineQueue); into L1 with l1 (see prefetch).
template <typename QT, typename KT>
inline void qk_dot(int R, const QT* q, const KT* k, int64_t D, int j0, int j1, float* s,
                   int64_t lds, const KT* next_k, bool l1) {
  int r = 0;
  for (; r + 4 <= R; r += 4) {
    qk_dot_rows<4>(q + r * D, k, D, j0, j1, s + r * lds, lds, next_k, l1);
    next_k = nullptr;
  }
  switch (R - r) {
    case 3: qk_dot_rows<3>(q + r * D, k, D, j0, j1, s + r * lds, lds, next_k, l1); break;
    case 2: qk_dot_rows<2>(q + r * D, k, D, j0, j1, s + r * lds, lds, next_k, l1); break;
    case 1: qk_dot_rows<1>(q + r * D, k, D, j0, j1, s + r * lds, lds, next_k, l1); break;
    default: break;
  }
}

// ---- scores, rows layout -----------------------------------------------------------------------

// S^T[j..j+NT)[r..r+NV*kV): kf fp32 [bs][D], qt fp32 [D][Rp].
template <int NT, int NV>
inline void qk_rows_tile(const float* kf, const float* qt, int64_t D, int64_t Rp, int j, int64_t r,
                         float* st) {
  Vec acc[NT][NV];
  PA_UNROLL
  for (int t = 0; t < NT; ++t)
    PA_UNROLL
    for (int v = 0; v < NV; ++v) acc[t][v] = Vec(0.f);
  for (int64_t d = 0; d < D; ++d) {
    Vec qv[NV];
    PA_UNROLL
    for (int v = 0; v < NV; ++v) qv[v] = Vec::loadu(qt + d * Rp + r + v * kV);
    PA_UNROLL
    for (int t = 0; t < NT; ++t) {
      const Vec kb(kf[(j + t) * D + d]);
      PA_UNROLL
      for (int v = 0; v < NV; ++v) acc[t][v] = at::vec::fmadd(kb, qv[v], acc[t][v]);
    }
  }
  PA_UNROLL
  for (int t = 0; t < NT; ++t)
    PA_UNROLL
    for (int v = 0; v < NV; ++v) acc[t][v].store(st + (j + t) * Rp + r + v * kV);
}

// All n keys (a multiple of 16; rows of kf outside the valid range are zero, so their scores are
// finite). Row tiles outside, keys inside: a tile's Q^T columns (D x 2-3 vectors) stay in L1 while
// every key passes, where keys outside swept all of Q^T from L2 for every 4 keys.
inline void qk_rows(const float* kf, const float* qt, int64_t D, int64_t Rp, int n, float* st) {
  constexpr int NT = 4;
  int64_t r = 0;
  if constexpr (kV < 16)  // twelve accumulators (on AVX2 all 16 registers), as kPvRows
    for (; r + 3 * kV <= Rp; r += 3 * kV)
      for (int j = 0; j < n; j += NT) qk_rows_tile<NT, 3>(kf, qt, D, Rp, j, r, st);
  for (; r + 2 * kV <= Rp; r += 2 * kV)
    for (int j = 0; j < n; j += NT) qk_rows_tile<NT, 2>(kf, qt, D, Rp, j, r, st);
  for (; r < Rp; r += kV)
    for (int j = 0; j < n; j += NT) qk_rows_tile<NT, 1>(kf, qt, D, Rp, j, r, st);
}

// ---- online softmax ----------------------------------------------------------------------------

inline Vec soft_cap(const Vec& z, float cap) {
  const Vec c(cap);
  return c * (z / c).tanh();
}

// Dot layout: row r sees local tokens [a[r], b[r]) of the block; P must be finite on [j0, j1)
// (the range P.V walks). Updates m, l; alpha[r] rescales the row's accumulator.
// zscale multiplies every score first (the softmax scale when the scores were not taken from a
// scaled query; 1 otherwise). pb (the matrix layout's P.V operand): each row's P also rounded to
// bf16 into pb [R][lds] while it is in L1 (a pass over all rows afterwards read them from L2).
inline void softmax_dot(float* s, int64_t lds, int R, int j0, int j1, const int* a, const int* b,
                        float zscale, float cap, float* m, float* l, float* alpha,
                        c10::BFloat16* pb = nullptr) {
  for (int r = 0; r < R; ++r) {
    float* z = s + r * lds;
    if (a[r] >= b[r]) {
      std::fill(z + j0, z + j1, 0.f);
      if (pb) std::fill(pb + r * lds + j0, pb + r * lds + j1, c10::BFloat16(0.f));
      alpha[r] = 1.f;
      continue;
    }
    const int ja = a[r] / kV * kV;
    const int jb = (b[r] + kV - 1) / kV * kV;
    // one pass: scale, cap, mask the edge lanes (after the cap, which maps -inf to -cap), max
    Vec mx(kNegInf);
    for (int j = ja; j < jb; j += kV) {
      Vec x = Vec::loadu(z + j);
      if (zscale != 1.f) x = x * Vec(zscale);
      if (cap > 0.f) x = soft_cap(x, cap);
      if (j < a[r] || j + kV > b[r]) {
        const Vec key = Vec::arange(static_cast<float>(j), 1.f);
        x = Vec::blendv(Vec(kNegInf), x,
                        (key >= Vec(static_cast<float>(a[r]))) & (key < Vec(static_cast<float>(b[r]))));
      }
      x.store(z + j);
      mx = at::vec::maximum(mx, x);
    }
    // a visible NaN score keeps m NaN (std::max would drop it), so that finish_row makes the
    // row NaN as IEEE's exp(z - m) would (exp_softmax maps NaN to 0)
    const float mz = reduce_max(mx);
    const float m_new = std::isnan(mz) ? mz : std::max(m[r], mz);
    const Vec mv(m_new);
    Vec sum(0.f);
    for (int j = ja; j < jb; j += kV) {
      const Vec p = exp_softmax(Vec::loadu(z + j) - mv);
      p.store(z + j);
      sum = sum + p;
    }
    std::fill(z + j0, z + std::max(j0, std::min(ja, j1)), 0.f);
    std::fill(z + std::min(j1, std::max(jb, j0)), z + j1, 0.f);
    if (pb) at::vec::convert(z + j0, pb + r * lds + j0, j1 - j0);
    alpha[r] = std::exp(m[r] - m_new);  // m[r] = -inf gives 0: the accumulator is still zero
    l[r] = l[r] * alpha[r] + reduce_add(sum);
    m[r] = m_new;
  }
}

// Matrix layout: softmax_dot over keys [0, n) (a multiple of kV) with P written only as bf16,
// into pb [R][lds] (P.V's operand); the fp32 scores in s are left as they were. With AVX-512 BF16
// and no soft cap: the max over the raw scores (no store), then p = 2^(z c - m log2(e)) with
// c = zscale log2(e) in one FMA, rounded to bf16 in registers: half the operations and none of
// the fp32 P traffic of softmax_dot; 16 rows at a time, so that their reductions and the m, l,
// alpha updates are vector operations. A NaN score stays NaN through the exp and the sum, and
// then makes m NaN as softmax_dot's max does. Elsewhere softmax_dot.
//
// pb_lo (optional): P's rounding error, p - bf16(p), as bf16 too, so that P.V can take P as two
// bf16 terms (p to about 2^-17 of itself, where one bf16 term leaves 2^-9).
inline void softmax_bf16(float* s, int64_t lds, int R, int n, const int* a, const int* b,
                         float zscale, float cap, float* m, float* l, float* alpha,
                         c10::BFloat16* pb, c10::BFloat16* pb_lo = nullptr) {
#if defined(CPU_CAPABILITY_AVX512) && defined(__AVX512BF16__)
  if (cap == 0.f && zscale > 0.f) {
    constexpr float kLog2e = 1.44269504088896341f;
    const __m512 neg_inf = _mm512_set1_ps(kNegInf), c = _mm512_set1_ps(zscale * kLog2e);
    const __m512 lo = _mm512_set1_ps(-151.f);  // 2^t < 2^-150 rounds to 0
    // p for the 16 keys from z: 2^(z c + mc), NaN t kept (vmaxps returns its second operand then)
    auto p16 = [&](const float* z, __m512 mc) {
      return exp2_bf16_avx512(_mm512_max_ps(lo, _mm512_fmadd_ps(_mm512_loadu_ps(z), c, mc)));
    };
    auto lanes = [](int j, int ra, int rb) {  // of the 16 keys from j, those in [ra, rb)
      const int lo_k = std::max(ra - j, 0), hi_k = std::min(rb - j, kV);
      return static_cast<__mmask16>(((1u << hi_k) - 1) & ~((1u << lo_k) - 1));
    };
    // e rounded to bf16 at p[j], and (q: pb_lo's row) its rounding error at q[j]
    auto store16 = [](c10::BFloat16* p, c10::BFloat16* q, int j, __m512 e) {
      const __m256i hi = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(e));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(p + j), hi);
      if (!q) return;
      const __m512 back = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(hi), 16));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + j),
                          reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_sub_ps(e, back))));
    };
    for (int r0 = 0; r0 < R; r0 += kV) {
      const int nr = std::min(kV, R - r0);
      const __mmask16 rows = static_cast<__mmask16>((1u << nr) - 1);
      __m512 part[kV];  // per row: lane-wise max, then lane-wise sum
      for (int i = 0; i < kV; ++i) {
        part[i] = neg_inf;
        const int r = r0 + i, ra = i < nr ? a[r] : 0, rb = i < nr ? b[r] : 0;
        if (ra >= rb) continue;
        const float* z = s + r * lds;
        const int ja = ra / kV * kV, jb = (rb + kV - 1) / kV * kV;
        const int fa = (ra + kV - 1) / kV * kV, fb = rb / kV * kV;  // whole vectors [fa, fb)
        __m512 mx0 = neg_inf, mx1 = neg_inf;
        if (ja < fa) mx1 = _mm512_mask_loadu_ps(neg_inf, lanes(ja, ra, rb), z + ja);
        int j = fa;
        for (; j + 2 * kV <= fb; j += 2 * kV) {
          mx0 = _mm512_max_ps(mx0, _mm512_loadu_ps(z + j));
          mx1 = _mm512_max_ps(mx1, _mm512_loadu_ps(z + j + kV));
        }
        if (j < fb) mx0 = _mm512_max_ps(mx0, _mm512_loadu_ps(z + j));
        if (fb < jb && fb >= fa)
          mx1 = _mm512_max_ps(mx1, _mm512_mask_loadu_ps(neg_inf, lanes(fb, ra, rb), z + fb));
        part[i] = _mm512_max_ps(mx0, mx1);
      }
      const __m512 m_old = _mm512_mask_loadu_ps(neg_inf, rows, m + r0);
      const __m512 mz = _mm512_mul_ps(reduce_16(part, [](__m512 x, __m512 y) {
                                        return _mm512_max_ps(x, y);
                                      }), _mm512_set1_ps(zscale));
      // a NaN m (an earlier chunk's NaN score) stays NaN: vmaxps returns its second operand
      const __m512 m_new = _mm512_max_ps(mz, m_old);
      // every visible score -inf: p = 0 (as softmax_dot's exp of NaN), not NaN
      const __m512 mc_all = _mm512_maskz_mul_ps(
          _mm512_cmp_ps_mask(m_new, neg_inf, _CMP_NEQ_UQ), m_new, _mm512_set1_ps(-kLog2e));
      alignas(64) float mc_row[kV];
      _mm512_store_ps(mc_row, mc_all);
      for (int i = 0; i < kV; ++i) {
        const int r = r0 + i, ra = i < nr ? a[r] : 0, rb = i < nr ? b[r] : 0;
        part[i] = _mm512_setzero_ps();
        if (i >= nr) continue;
        c10::BFloat16* p = pb + r * lds;
        c10::BFloat16* q = pb_lo ? pb_lo + r * lds : nullptr;
        if (ra >= rb) {
          std::fill(p, p + n, c10::BFloat16(0.f));
          if (q) std::fill(q, q + n, c10::BFloat16(0.f));
          continue;
        }
        const float* z = s + r * lds;
        const __m512 mc = _mm512_set1_ps(mc_row[i]);
        const int ja = ra / kV * kV, jb = (rb + kV - 1) / kV * kV;
        const int fa = (ra + kV - 1) / kV * kV, fb = rb / kV * kV;  // whole vectors [fa, fb)
        __m512 sum0 = _mm512_setzero_ps(), sum1 = _mm512_setzero_ps();
        auto edge = [&](int j) {  // a vector with keys outside [ra, rb): those get p = 0
          const __m512 e = _mm512_maskz_mov_ps(lanes(j, ra, rb), p16(z + j, mc));
          sum1 = _mm512_add_ps(sum1, e);
          store16(p, q, j, e);
        };
        if (ja < fa) edge(ja);
        int j = fa;
        for (; j + 2 * kV <= fb; j += 2 * kV) {
          const __m512 e0 = p16(z + j, mc), e1 = p16(z + j + kV, mc);
          sum0 = _mm512_add_ps(sum0, e0);
          sum1 = _mm512_add_ps(sum1, e1);
          if (q) {
            store16(p, q, j, e0);
            store16(p, q, j + kV, e1);
          } else {
            _mm512_storeu_si512(p + j, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(e1, e0)));
          }
        }
        if (j < fb) {
          const __m512 e = p16(z + j, mc);
          sum0 = _mm512_add_ps(sum0, e);
          store16(p, q, j, e);
        }
        if (fb < jb && fb >= fa) edge(fb);
        std::fill(p, p + ja, c10::BFloat16(0.f));
        std::fill(p + jb, p + n, c10::BFloat16(0.f));
        if (q) {
          std::fill(q, q + ja, c10::BFloat16(0.f));
          std::fill(q + jb, q + n, c10::BFloat16(0.f));
        }
        part[i] = _mm512_add_ps(sum0, sum1);
      }
      const __m512 total = reduce_16(part, [](__m512 x, __m512 y) { return _mm512_add_ps(x, y); });
      // both -inf (no key seen yet): 1, not NaN
      const __m512 al = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(m_old, m_new, _CMP_EQ_OQ),
                                             exp_softmax(Vec(_mm512_sub_ps(m_old, m_new))),
                                             _mm512_set1_ps(1.f));
      const __m512 l_new = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(rows, l + r0), al, total);
      _mm512_mask_storeu_ps(alpha + r0, rows, al);
      _mm512_mask_storeu_ps(l + r0, rows, l_new);
      _mm512_mask_storeu_ps(
          m + r0, rows,
          _mm512_mask_blend_ps(_mm512_cmp_ps_mask(total, total, _CMP_UNORD_Q), m_new, total));
    }
    return;
  }
#endif
  softmax_dot(s, lds, R, 0, n, a, b, zscale, cap, m, l, alpha, pb);
  if (pb_lo)  // softmax_dot leaves P in s as fp32
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < n; ++j) {
        const int64_t i = r * lds + j;
        pb_lo[i] = c10::BFloat16(s[i] - static_cast<float>(pb[i]));
      }
}

// Rows layout: st [bs][Rp]; row r sees global keys [lo[r], hi[r]) (as fp32, exact below 2^24);
// kb is the global key of local token 0. `full`: every row sees every token of [j0, j1).
// zscale: as softmax_dot's.
inline void softmax_rows(float* st, int64_t Rp, int j0, int j1, float kb, const float* lo,
                         const float* hi, bool full, float zscale, float cap, float* m, float* l,
                         float* alpha) {
  const Vec neg_inf(kNegInf);
  for (int64_t r = 0; r < Rp; r += kV) {
    const Vec lo_v = Vec::loadu(lo + r), hi_v = Vec::loadu(hi + r);
    Vec mx(kNegInf);
    for (int j = j0; j < j1; ++j) {
      Vec z = Vec::loadu(st + j * Rp + r);
      if (zscale != 1.f) z = z * Vec(zscale);
      if (cap > 0.f) z = soft_cap(z, cap);
      if (!full) {
        const Vec key(kb + static_cast<float>(j));
        z = Vec::blendv(neg_inf, z, (key >= lo_v) & (key < hi_v));
      }
      z.store(st + j * Rp + r);
      mx = at::vec::maximum(mx, z);
    }
    const Vec m_old = Vec::loadu(m + r);
    const Vec m_new = at::vec::maximum(m_old, mx);
    // rows that have seen no key yet keep m = -inf; subtract 0 there so nothing becomes NaN
    const Vec m_use = Vec::blendv(m_new, Vec(0.f), m_new == neg_inf);
    const Vec a = exp_softmax(m_old - m_use);
    Vec sum(0.f);
    for (int j = j0; j < j1; ++j) {
      const Vec p = exp_softmax(Vec::loadu(st + j * Rp + r) - m_use);
      p.store(st + j * Rp + r);
      sum = sum + p;
    }
    a.store(alpha + r);
    (Vec::loadu(l + r) * a + sum).store(l + r);
    m_new.store(m + r);
  }
}

// ---- P.V ---------------------------------------------------------------------------------------

// V rows of a run of keys spread over blocks: key j of the run is row j % bs of block vb[j / bs].
template <typename VT>
struct VRows {
  const VT* const* vb;
  int bs;
};

// Blocks of a dot-layout run at most (attention_item.h's kRunKeys over the smallest block, 16).
constexpr int kMaxRunBlocks = 8;

// Cache lines to prefetch, handed out a few per P.V step: the P.V of a run takes the next run's
// V rows this way, so that the memory keeps streaming while P.V computes.
struct LineQueue {
  bool l1 = false;  // into L1 rather than L2 (see prefetch)
  const char* chunk[kMaxRunBlocks] = {};
  int chunks = 0;
  int64_t chunk_bytes = 0;
  int at = 0;
  int64_t off = 0;
  int per_step = 0;

  void add(const void* p, int64_t bytes) {
    chunk[chunks++] = static_cast<const char*>(p);
    chunk_bytes = bytes;
  }
  // Hand the lines out over about `steps` calls of pop().
  void spread(int64_t steps) {
    const int64_t lines = chunks * ((chunk_bytes + 63) / 64);
    per_step = static_cast<int>((lines + steps - 1) / std::max<int64_t>(steps, 1));
  }
  // per_step lines (fewer at the end of a chunk): one test per call, not per line
  inline void pop() {
    if (at == chunks) return;
    const int64_t n = std::min<int64_t>(per_step * int64_t{64}, chunk_bytes - off);
    if (l1)
      for (int64_t o = 0; o < n; o += 64) __builtin_prefetch(chunk[at] + off + o, 0, 3);
    else
      for (int64_t o = 0; o < n; o += 64) __builtin_prefetch(chunk[at] + off + o, 0, 2);
    off += n;
    if (off >= chunk_bytes) off = 0, ++at;
  }
  void drain() {
    for (; at < chunks; off = 0, ++at) prefetch(chunk[at] + off, chunk_bytes - off, l1);
  }
};

// The P.V tiles' accumulators: a[r][x] = acc[r][d + x * kV..] * alpha[r], and back.
template <int MR, int N>
PA_TILE void load_acc(Vec (&a)[MR][N], const float* acc, const float* alpha, int64_t D, int64_t d) {
  PA_UNROLL
  for (int r = 0; r < MR; ++r) {
    const Vec al(alpha[r]);
    PA_UNROLL
    for (int x = 0; x < N; ++x) a[r][x] = Vec::loadu(acc + r * D + d + x * kV) * al;
  }
}

template <int MR, int N>
PA_TILE void store_acc(const Vec (&a)[MR][N], float* acc, int64_t D, int64_t d) {
  PA_UNROLL
  for (int r = 0; r < MR; ++r)
    PA_UNROLL
    for (int x = 0; x < N; ++x) a[r][x].store(acc + r * D + d + x * kV);
}

// acc[r][d..d+NV*kV) = acc * alpha[r] + sum_{j in [j0, j1)} P(r, j) v[j][d..], for MR rows.
// The accumulator row is in load_pair's order for VT (pair order when kPairSplit<VT>).
// P(r, j) = p[r * prs + j * pts] (either layout); v rows are [.][D] of type VT. The accumulator
// stays in registers across all blocks of the run.
template <int MR, int NV, typename VT>
PA_TILE void pv_tile(const float* p, int64_t prs, int64_t pts, VRows<VT> vr, int64_t D, int j0,
                    int j1, const float* alpha, float* acc, int64_t d, LineQueue& ahead) {
  Vec a[MR][NV];
  load_acc(a, acc, alpha, D, d);
  for (int i = j0 / vr.bs, jb = j0; jb < j1; ++i) {
    const int base = i * vr.bs, je = std::min(j1, base + vr.bs);
    const VT* v = vr.vb[i] + d;
    ahead.pop();
    for (int j = jb; j < je; ++j) {
      const VT* row = v + (j - base) * D;
      Vec vv[NV];
      if constexpr (NV % 2 == 0) {  // whole pairs: the accumulator is in load_pair's order
        PA_UNROLL
        for (int x = 0; x < NV; x += 2) load_pair(row + x * kV, vv[x], vv[x + 1]);
      } else {
        PA_UNROLL
        for (int x = 0; x < NV; ++x) vv[x] = load_f32(row + x * kV);
      }
      PA_UNROLL
      for (int r = 0; r < MR; ++r) {
        const Vec pb(p[r * prs + j * pts]);
        PA_UNROLL
        for (int x = 0; x < NV; ++x) a[r][x] = at::vec::fmadd(pb, vv[x], a[r][x]);
      }
    }
    jb = je;
  }
  store_acc(a, acc, D, d);
}

// Vectors per P.V tile for MR rows: MR * NV + NV + 1 registers, as in qk_dot_rows; AVX-512's 32
// fit NV = 4 at every MR.
constexpr int pv_width(int MR) { return MR >= 3 && kV < 16 ? 2 : 4; }

// The pv_tile calls pv_rows makes for MR rows: whole tiles of pv_width(MR), then pairs, then
// single vectors.
inline int64_t pv_tiles(int MR, int64_t D) {
  const int64_t nv = pv_width(MR) * kV, whole = D / nv, pairs = (D - whole * nv) / (2 * kV);
  return whole + pairs + (D - whole * nv - pairs * 2 * kV) / kV;
}

template <int MR, typename VT>
inline void pv_rows(const float* p, int64_t prs, int64_t pts, VRows<VT> v, int64_t D, int j0,
                    int j1, const float* alpha, float* acc, LineQueue& ahead) {
  constexpr int NV = pv_width(MR);
  int64_t d = 0;
  for (; d + NV * kV <= D; d += NV * kV)
    pv_tile<MR, NV>(p, prs, pts, v, D, j0, j1, alpha, acc, d, ahead);
  // chunks of 2 * kV stay pairs (pair order), only a shorter tail is single
  for (; d + 2 * kV <= D; d += 2 * kV)
    pv_tile<MR, 2>(p, prs, pts, v, D, j0, j1, alpha, acc, d, ahead);
  for (; d < D; d += kV) pv_tile<MR, 1>(p, prs, pts, v, D, j0, j1, alpha, acc, d, ahead);
}

// Rows per P.V tile: 6 where a vector holds 8 floats or fewer (AVX2: 12 accumulators, two V
// vectors and one P fill 15 of its 16 registers; twelve FMA chains cover the FMA latency where
// four rows' eight did not), 4 with AVX-512 (six measured slower there).
constexpr int kPvRows = kV < 16 ? 6 : 4;

// ahead: lines to prefetch meanwhile (see LineQueue), all requested by the return.
template <typename VT>
inline void pv(int R, const float* p, int64_t prs, int64_t pts, VRows<VT> v, int64_t D, int j0,
               int j1, const float* alpha, float* acc, LineQueue& ahead) {
  const int rest = R % kPvRows;
  ahead.spread((R / kPvRows * pv_tiles(kPvRows, D) + (rest ? pv_tiles(rest, D) : 0)) *
               ((j1 - 1) / v.bs - j0 / v.bs + 1));
  int r = 0;
  for (; r + kPvRows <= R; r += kPvRows)
    pv_rows<kPvRows>(p + r * prs, prs, pts, v, D, j0, j1, alpha + r, acc + r * D, ahead);
  switch (R - r) {
    case 5: pv_rows<5>(p + r * prs, prs, pts, v, D, j0, j1, alpha + r, acc + r * D, ahead); break;
    case 4: pv_rows<4>(p + r * prs, prs, pts, v, D, j0, j1, alpha + r, acc + r * D, ahead); break;
    case 3: pv_rows<3>(p + r * prs, prs, pts, v, D, j0, j1, alpha + r, acc + r * D, ahead); break;
    case 2: pv_rows<2>(p + r * prs, prs, pts, v, D, j0, j1, alpha + r, acc + r * D, ahead); break;
    case 1: pv_rows<1>(p + r * prs, prs, pts, v, D, j0, j1, alpha + r, acc + r * D, ahead); break;
    default: break;
  }
  ahead.drain();
}

#if defined(CPU_CAPABILITY_AVX512) && defined(__AVX512BF16__)
// ---- the bf16 decode path (kDotBf16): transposed scores, paired bf16 probabilities -----------
// Scores go to S^T [key][Rp] (Rp: rows padded to 16), so that the softmax runs down the keys over
// 16 rows a vector (softmax_rows) instead of one row at a time with a horizontal max and sum per
// row and run. P is then rounded to bf16 (as the Triton kernels round p to the model dtype for
// their P.V dot) as key pairs: word [j / 2][r] holds (P[r][j], P[r][j + 1]), the broadcast
// operand of vdpbf16ps, which does 16 lanes x 2 keys where fp32 would widen V and issue two FMAs.
// The P.V accumulator keeps load_pair's pair order.

// out lane 4 * L + h = the sum of the lanes of v[4 * h + L]: 16 reductions in 45 operations.
PA_TILE __m512 reduce_add_16(const __m512 (&v)[16]) {
  __m512 p[8];  // p[i]: [v[2i] folded to 8 lanes | v[2i + 1] folded]
  PA_UNROLL
  for (int i = 0; i < 8; ++i)
    p[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44),
                         _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xee));
  __m512 u[4];  // 128-bit lane L of u[h]: v[4h + L] folded to 4 lanes
  PA_UNROLL
  for (int h = 0; h < 4; ++h)
    u[h] = _mm512_add_ps(_mm512_shuffle_f32x4(p[2 * h], p[2 * h + 1], 0x88),
                         _mm512_shuffle_f32x4(p[2 * h], p[2 * h + 1], 0xdd));
  // per 128-bit lane: z01 = [u0 a, u1 a, u0 b, u1 b] with u0 = u0 a + u0 b (likewise z23)
  const __m512 z01 = _mm512_add_ps(_mm512_unpacklo_ps(u[0], u[1]), _mm512_unpackhi_ps(u[0], u[1]));
  const __m512 z23 = _mm512_add_ps(_mm512_unpacklo_ps(u[2], u[3]), _mm512_unpackhi_ps(u[2], u[3]));
  return _mm512_add_ps(_mm512_shuffle_ps(z01, z23, 0x44), _mm512_shuffle_ps(z01, z23, 0xee));
}

// 32 cache elements at p as bf16 words (lanes: which to read, the others 0): bf16 as stored, fp8
// widened exactly.
PA_TILE __m512i load_bf16(const c10::BFloat16* p, __mmask32 lanes) {
  return _mm512_maskz_loadu_epi16(lanes, p);
}
PA_TILE __m512i load_bf16(const c10::Float8_e4m3fn* p, __mmask32 lanes) {
  return fp8_to_bf16(_mm256_maskz_loadu_epi8(lanes, p));
}

// S^T[j + t][r] = q_r . k_{j+t} for MR rows (bf16, natural order) and NT keys.
template <int MR, int NT, typename KT>
PA_TILE void qk_bf16_tile(const c10::BFloat16* q, const KT* k, int64_t D, int j, float* st,
                          int64_t ldt) {
  __m512 acc[MR][NT];
  PA_UNROLL
  for (int r = 0; r < MR; ++r)
    PA_UNROLL
    for (int t = 0; t < NT; ++t) acc[r][t] = _mm512_setzero_ps();
  auto step = [&](int64_t d, __mmask32 lanes) PA_TILE_LAMBDA {
    __m512bh kv[NT];
    if constexpr (std::is_same_v<KT, c10::Float8_e4m3fn> && NT % 2 == 0) {
      PA_UNROLL
      for (int t = 0; t < NT; t += 2) {  // two keys per lookup
        auto row = [&](int u) { return _mm256_maskz_loadu_epi8(lanes, k + (j + u) * D + d); };
        __m512i x, y;
        fp8_to_bf16_x2(_mm512_inserti64x4(_mm512_castsi256_si512(row(t)), row(t + 1), 1), x, y);
        kv[t] = reinterpret_cast<__m512bh>(x);
        kv[t + 1] = reinterpret_cast<__m512bh>(y);
      }
    } else {
      PA_UNROLL
      for (int t = 0; t < NT; ++t)
        kv[t] = reinterpret_cast<__m512bh>(load_bf16(k + (j + t) * D + d, lanes));
    }
    PA_UNROLL
    for (int r = 0; r < MR; ++r) {
      const auto qv = reinterpret_cast<__m512bh>(_mm512_maskz_loadu_epi16(lanes, q + r * D + d));
      PA_UNROLL
      for (int t = 0; t < NT; ++t) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], qv, kv[t]);
    }
  };
  int64_t d = 0;
  for (; d + 32 <= D; d += 32) step(d, ~__mmask32{0});
  if (d < D) step(d, (__mmask32{1} << (D - d)) - 1);  // 16 left: zero pairs add nothing
  if constexpr (MR == 4 && NT == 4) {
    __m512 flat[16];  // flat[4r + t]: lane 4t + r of the sums, so 128-bit lane t is key j + t
    PA_UNROLL
    for (int i = 0; i < 16; ++i) flat[i] = acc[i / 4][i % 4];
    const __m512 sums = reduce_add_16(flat);
    _mm_storeu_ps(st + j * ldt, _mm512_castps512_ps128(sums));
    _mm_storeu_ps(st + (j + 1) * ldt, _mm512_extractf32x4_ps(sums, 1));
    _mm_storeu_ps(st + (j + 2) * ldt, _mm512_extractf32x4_ps(sums, 2));
    _mm_storeu_ps(st + (j + 3) * ldt, _mm512_extractf32x4_ps(sums, 3));
  } else {
    PA_UNROLL
    for (int r = 0; r < MR; ++r)
      PA_UNROLL
      for (int t = 0; t < NT; ++t) st[(j + t) * ldt + r] = _mm512_reduce_add_ps(acc[r][t]);
  }
}

// Keys [j0, j1) of one block for R rows: q [R][D] bf16, k the block's rows; st points at row 0's
// column of S^T (ldt apart per key). next_k, l1: as qk_dot's.
template <int MR, typename KT>
inline void qk_bf16_rows(const c10::BFloat16* q, const KT* k, int64_t D, int j0, int j1, float* st,
                         int64_t ldt, const KT* next_k, bool l1) {
  constexpr int NT = 4;  // 4 x 4 accumulators: one 16-way reduction (MR = 4)
  constexpr int64_t elt = sizeof(KT);
  int j = j0;
  for (; j + NT <= j1; j += NT) {
    if (next_k) prefetch(next_k + j * D, NT * D * elt, l1);
    // see qk_dot_rows
    if (!l1 && j + 3 * NT <= j1) prefetch_l1(k + (j + 2 * NT) * D, NT * D * elt);
    qk_bf16_tile<MR, NT>(q, k, D, j, st, ldt);
  }
  for (; j < j1; ++j) {
    if (next_k) prefetch(next_k + j * D, D * elt, l1);
    qk_bf16_tile<MR, 1>(q, k, D, j, st, ldt);
  }
}

template <typename KT>
inline void qk_bf16(int R, const c10::BFloat16* q, const KT* k, int64_t D, int j0, int j1,
                    float* st, int64_t ldt, const KT* next_k, bool l1) {
  int r = 0;
  for (; r + 4 <= R; r += 4) {
    qk_bf16_rows<4>(q + r * D, k, D, j0, j1, st + r, ldt, next_k, l1);
    next_k = nullptr;
  }
  switch (R - r) {
    case 3: qk_bf16_rows<3>(q + r * D, k, D, j0, j1, st + r, ldt, next_k, l1); break;
    case 2: qk_bf16_rows<2>(q + r * D, k, D, j0, j1, st + r, ldt, next_k, l1); break;
    case 1: qk_bf16_rows<1>(q + r * D, k, D, j0, j1, st + r, ldt, next_k, l1); break;
    default: break;
  }
}

// pp[j / 2][r] = (P[r][j], P[r][j + 1]) as bf16 (nearest even) for the key pairs of [0, n) that
// meet [j0, j1), from P^T [n][Rp] fp32; keys outside [j0, j1) count as 0 (their P^T entries are
// not probabilities). ldp: words per pair row (Rp).
inline void pair_probs(const float* pt, int64_t Rp, int j0, int j1, uint32_t* pp, int64_t ldp) {
  // word i of a pair row: bf16 element 2i from key j's row i, element 2i + 1 from key j + 1's
  const __m512 zero = _mm512_setzero_ps();
  for (int j = j0 & ~1; j < j1; j += 2) {
    const bool x = j >= j0, y = j + 1 < j1;
    for (int64_t r = 0; r < Rp; r += 16) {
      const __m512 a = x ? _mm512_loadu_ps(pt + j * Rp + r) : zero;
      const __m512 b = y ? _mm512_loadu_ps(pt + (j + 1) * Rp + r) : zero;
      const __m512i both = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(b, a));  // a low, b high
      _mm512_storeu_si512(pp + (j / 2) * ldp + r, interleave_halves(both));
    }
  }
}

// One chunk of 32 elements of V rows x and y (key j, j + 1) as the vdpbf16ps operands of pair
// order: `even` holds (x[2i], y[2i]) in lane i, `odd` (x[2i+1], y[2i+1]).
PA_TILE void pair_keys(__m512i x, __m512i y, __m512bh& even, __m512bh& odd) {
  constexpr __mmask32 kHigh = 0xAAAAAAAAu;  // the upper bf16 of each 32-bit lane
  even = reinterpret_cast<__m512bh>(_mm512_mask_blend_epi16(kHigh, x, _mm512_slli_epi32(y, 16)));
  odd = reinterpret_cast<__m512bh>(_mm512_mask_blend_epi16(kHigh, _mm512_srli_epi32(x, 16), y));
}

// pv_tile for paired bf16 P (pair_probs' layout) and bf16 or fp8 V over NC chunks of 32 elements
// (2 * NC accumulators per row), or, with NC == 0, one tail chunk of 16 elements in natural
// order. A key outside [j0, j1) (x or y null) enters as zero V (its P is zero too).
template <int MR, int NC, typename VT>
PA_TILE void pv_tile_bf16(const uint32_t* pp, int64_t ldp, VRows<VT> vr, int64_t D, int j0,
                          int j1, const float* alpha, float* acc, int64_t d, LineQueue& ahead) {
  constexpr int NA = NC == 0 ? 1 : 2 * NC;
  Vec a[MR][NA];
  load_acc(a, acc, alpha, D, d);
  auto step = [&](const VT* x, const VT* y, int j) PA_TILE_LAMBDA {
    ahead.pop();
    __m512bh w[NA];
    if constexpr (NC == 0) {
      auto widen = [](const VT* r) {
        return r ? _mm512_cvtepu16_epi32(_mm512_castsi512_si256(load_bf16(r, 0xFFFFu)))
                 : _mm512_setzero_si512();
      };
      w[0] = reinterpret_cast<__m512bh>(_mm512_or_si512(widen(x), _mm512_slli_epi32(widen(y), 16)));
    } else if constexpr (std::is_same_v<VT, c10::Float8_e4m3fn>) {
      PA_UNROLL
      for (int c = 0; c < NC; ++c) {
        auto row = [&](const VT* r) {
          return r ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r + c * 32))
                   : _mm256_setzero_si256();
        };
        fp8_pair_keys(_mm512_inserti64x4(_mm512_castsi256_si512(row(x)), row(y), 1), w[2 * c],
                      w[2 * c + 1]);
      }
    } else {
      PA_UNROLL
      for (int c = 0; c < NC; ++c) {
        const __m512i xv = x ? load_bf16(x + c * 32, ~__mmask32{0}) : _mm512_setzero_si512();
        const __m512i yv = y ? load_bf16(y + c * 32, ~__mmask32{0}) : _mm512_setzero_si512();
        pair_keys(xv, yv, w[2 * c], w[2 * c + 1]);
      }
    }
    const uint32_t* words = pp + (j / 2) * ldp;
    PA_UNROLL
    for (int r = 0; r < MR; ++r) {
      const auto p = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(words[r])));
      PA_UNROLL
      for (int x2 = 0; x2 < NA; ++x2) a[r][x2] = _mm512_dpbf16_ps(a[r][x2], p, w[x2]);
    }
  };
  for (int i = j0 / vr.bs, jb = j0; jb < j1; ++i) {
    const int base = i * vr.bs, je = std::min(j1, base + vr.bs);
    const VT* v = vr.vb[i] + d;
    int j = jb & ~1;  // pairs start at even keys (pair_probs'); blocks are a multiple of 16 keys
    if (j < jb) {
      step(nullptr, v + (j + 1 - base) * D, j);
      j += 2;
    }
    for (; j + 2 <= je; j += 2) step(v + (j - base) * D, v + (j + 1 - base) * D, j);
    if (j < je) step(v + (j - base) * D, nullptr, j);
    jb = je;
  }
  store_acc(a, acc, D, d);
}

template <int MR, typename VT>
inline void pv_rows_bf16(const uint32_t* pp, int64_t ldp, VRows<VT> v, int64_t D, int j0, int j1,
                         const float* alpha, float* acc, LineQueue& ahead) {
  // 2 * NC * MR accumulators + 2 * NC operands + 1 broadcast of AVX-512's 32 registers
  constexpr int NC = MR >= 3 ? 2 : 4;
  int64_t d = 0;
  for (; d + NC * 32 <= D; d += NC * 32)
    pv_tile_bf16<MR, NC>(pp, ldp, v, D, j0, j1, alpha, acc, d, ahead);
  for (; d + 32 <= D; d += 32) pv_tile_bf16<MR, 1>(pp, ldp, v, D, j0, j1, alpha, acc, d, ahead);
  if (d < D) pv_tile_bf16<MR, 0>(pp, ldp, v, D, j0, j1, alpha, acc, d, ahead);  // D % 32 == 16
}

// R rows from pp's column 0 (pair_probs' layout, ldp words per pair row).
template <typename VT>
inline void pv(int R, const uint32_t* pp, int64_t ldp, VRows<VT> v, int64_t D, int j0,
               int j1, const float* alpha, float* acc, LineQueue& ahead) {
  ahead.spread((R + 3) / 4 * std::max<int64_t>(D / 64, 1) * ((j1 - j0 + 2) / 2));
  int r = 0;
  for (; r + 4 <= R; r += 4)
    pv_rows_bf16<4>(pp + r, ldp, v, D, j0, j1, alpha + r, acc + r * D, ahead);
  switch (R - r) {
    case 3: pv_rows_bf16<3>(pp + r, ldp, v, D, j0, j1, alpha + r, acc + r * D, ahead); break;
    case 2: pv_rows_bf16<2>(pp + r, ldp, v, D, j0, j1, alpha + r, acc + r * D, ahead); break;
    case 1: pv_rows_bf16<1>(pp + r, ldp, v, D, j0, j1, alpha + r, acc + r * D, ahead); break;
    default: break;
  }
  ahead.drain();
}
#endif

}  // namespace pa_attn
