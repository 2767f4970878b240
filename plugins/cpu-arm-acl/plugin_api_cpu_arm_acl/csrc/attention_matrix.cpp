// Paged attention on the CPU: the matrix layout. Items of many rows (prefill tiles) can take
// their scores and P.V as bf16 GEMMs through torch's cpublas::brgemm, which runs oneDNN's AMX
// kernels where the CPU has AMX. Python decides per call (the attention-matrix setting).
#include <ATen/native/CPUBlas.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "attention.h"
#include "attention_item.h"

#if defined(__x86_64__)
#include <fbgemm/Utils.h>  // transpose_simd: torch's x86 builds ship fbgemm
#endif

namespace pa_attn {
namespace {

// Columns of one B panel: at most 64, the widths oneDNN's AMX brgemm takes a VNNI B in (its own
// transform packs 16, 32, 48 or 64 columns); block and head sizes are multiples of 16, so every
// panel's width is one of those.
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

// transpose() of 32-bit words: an M x N matrix of bf16 pairs.
inline void transpose_words(int64_t M, int64_t N, const c10::BFloat16* src, int64_t ld_src,
                            c10::BFloat16* dst, int64_t ld_dst) {
  const float* s = reinterpret_cast<const float*>(src);  // words moved as fp32 bit patterns
  float* d = reinterpret_cast<float*>(dst);
#if defined(__x86_64__)
  fbgemm::transpose_simd<float>(M, N, s, ld_src, d, ld_dst);
#else
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) d[j * ld_dst + i] = s[i * ld_src + j];
#endif
}

// dst[2i] = a[i], dst[2i + 1] = b[i] for n bf16 elements (n a multiple of 16); a null a or b
// reads as zeros.
inline void interleave_rows(const c10::BFloat16* a, const c10::BFloat16* b, c10::BFloat16* dst,
                            int64_t n) {
#if defined(CPU_CAPABILITY_AVX512)
  for (int64_t i = 0; i < n; i += 16) {
    const __m256i x = a ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + i))
                        : _mm256_setzero_si256();
    const __m256i y = b ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + i))
                        : _mm256_setzero_si256();
    _mm512_storeu_si512(dst + 2 * i,
                        interleave_halves(_mm512_inserti64x4(_mm512_castsi256_si512(x), y, 1)));
  }
#else
  for (int64_t i = 0; i < n; ++i) {
    dst[2 * i] = a ? a[i] : c10::BFloat16(0.f);
    dst[2 * i + 1] = b ? b[i] : c10::BFloat16(0.f);
  }
#endif
}

// n bf16 elements from src to dst by vector loads and stores (memcpy of a short row that is not a
// compile-time size becomes `rep movs`, whose start-up cost dominated the V panel gathers).
inline void copy_row(const c10::BFloat16* src, c10::BFloat16* dst, int64_t n) {
  using BVec = at::vec::Vectorized<c10::BFloat16>;
  int64_t i = 0;
  for (; i + BVec::size() <= n; i += BVec::size()) BVec::loadu(src + i).store(dst + i);
  if (i < n) BVec::loadu(src + i, n - i).store(dst + i, n - i);
}

// n fp8 e4m3fn elements from src to dst as bf16: every e4m3 value is a bf16, so exactly (NaN
// stays NaN; e4m3fn has no infinities).
inline void widen_fp8_row(const c10::Float8_e4m3fn* src, c10::BFloat16* dst, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512BF16__)
  for (; i + 32 <= n; i += 32)
    _mm512_storeu_si512(dst + i,
                        fp8_to_bf16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i))));
#endif
  const auto* bytes = reinterpret_cast<const uint8_t*>(src);
  for (; i < n; ++i) dst[i] = c10::BFloat16(g_fp8_table[bytes[i]]);
}

// Whether rows [x, y) of the chunk (row(j, which): bf16 rows of D elements) hold finite values.
template <typename Row>
bool finite_rows(const Row& row, int64_t which, int64_t x, int64_t y, int64_t D) {
  for (int64_t j = x; j < y; ++j) {
    const uint16_t* v = reinterpret_cast<const uint16_t*>(row(j, which));
    int special = 0;  // exponent all ones: Inf or NaN
    for (int64_t d = 0; d < D; ++d) special |= (v[d] & 0x7F80) == 0x7F80;
    if (special) return false;
  }
  return true;
}

}  // namespace

// The rows of a many-row item (bf16 query as given in w.q [R][D], bf16 cache) over chunks of whole
// blocks of about kMatrixKeys keys: S = Q K^T by brgemm into w.s [R][chunk], kPanel keys at a
// time, the dot layout's online softmax over the chunk (scale applied to the scores), P rounded to
// bf16 (as the Triton kernels round p to the model dtype for their P.V dot), then acc += P V by
// one brgemm over the chunk's keys per kPanel output columns. K and V rows outside the item's key
// range enter the panels as zeros (a cache block past a sequence's end holds whatever was there
// before; 0 * NaN would poison the sum), and so do the V rows of keys that only some of the
// item's rows see (those rows add them one at a time: pv_visible's rule). vnni: B panels built
// straight in the VNNI layout oneDNN's AMX kernels read (cpublas::could_pack), [k / 2][n][2]: for
// K^T the keys' rows as 32-bit words transposed, for V the rows of key pairs interleaved (one pass
// over the cache where a bf16 transpose or copy and then oneDNN's transform took two); otherwise
// torch's gemm runs on plain panels, the same loops, so that any machine tests them.
//
// An fp8 cache's chunk is first widened to bf16 into w.widened (its K rows, then its V rows; the
// item's keys only), exactly; its k_scale is in st.scale and its v_scale applies when the row
// finishes, as in the other layouts. Its P.V takes P as two bf16 terms (pb + pb_lo, two brgemms):
// one bf16 P leaves errors of |V| 2^-9, which the kit's fp8 case (|V| up to 160, v_scale 2) finds
// beyond the bf16 output's tolerance where the output is small.
template <typename KT>
void attend_matrix(const Step& st, const int32_t* item, const ItemBlocks<KT>& kv, Scratch& w,
                   int R, int64_t first, int64_t last, bool vnni) {
  using BF = c10::BFloat16;
  constexpr bool kWiden = std::is_same_v<KT, c10::Float8_e4m3fn>;
  // an fp8 cache's P.V takes P as two bf16 terms, pb + pb_lo (see above)
  BF* const p_lo = kWiden ? w.pb_lo : nullptr;
  namespace blas = at::native::cpublas;
  const int64_t D = st.g.dim, bs = st.g.block;
  const int64_t k0 = item[kK0], k1 = item[kK1];
  const int64_t run = matrix_blocks(bs), lds = run * bs;
  const BF* q = reinterpret_cast<const BF*>(w.q);
  // a K^T panel [D][kPanel] or a V panel [chunk keys][kPanel], plain or VNNI (`packed`)
  const int64_t panel = std::max(D, lds) * kPanel;
  if (static_cast<int64_t>(w.panels.size()) < panel) w.panels.resize(panel);
  BF* const plain = w.panels.data();
  BF* const packed = plain;
  if constexpr (kWiden)
    if (static_cast<int64_t>(w.widened.size()) < lds * 2 * D) w.widened.resize(lds * 2 * D);
  for (int64_t c = first; c <= last; c += run) {
    const int64_t n = (std::min(last + 1, c + run) - c) * bs, kc = c * bs;
    const int64_t cj0 = std::max<int64_t>(k0 - kc, 0), cj1 = std::min<int64_t>(k1 - kc, n);
    if constexpr (kWiden)  // K rows, then V rows: a block's rows D apart, as in the cache
      for (int64_t which = 0; which < 2; ++which)
        for (int64_t j = cj0; j < cj1; ++j)
          widen_fp8_row(kv.k(c + j / bs) + which * kv.kv + (j % bs) * D,
                        w.widened.data() + (which * lds + j) * D, D);
    // row j of the chunk (K: which = 0, V: which = 1); null outside the item's key range
    auto row = [&](int64_t j, int64_t which) -> const BF* {
      if (j < cj0 || j >= cj1) return nullptr;
      if constexpr (kWiden)
        return w.widened.data() + (which * lds + j) * D;
      else
        return kv.k(c + j / bs) + which * kv.kv + (j % bs) * D;
    };
    for (int64_t j = 0; j < n; j += kPanel) {  // scores, kPanel keys at a time
      const int64_t wn = std::min(kPanel, n - j);
      // K^T panel [D][wn], one block's rows at a time; vnni: straight in the VNNI layout
      // [D/2][wn][2], i.e. the keys' rows as 32-bit words, transposed
      float* words = reinterpret_cast<float*>(packed);
      for (int64_t t = 0; t < wn;) {
        const int64_t key = j + t;
        if (const BF* k = row(key, 0)) {
          const int64_t rows = std::min({wn - t, bs - key % bs, cj1 - key});
          if (vnni)
            transpose_words(rows, D / 2, k, D / 2, packed + 2 * t, wn);
          else
            transpose(rows, D, k, D, plain + t, wn);
          t += rows;
        } else {
          if (vnni)
            for (int64_t d = 0; d < D / 2; ++d) words[d * wn + t] = 0.f;
          else
            for (int64_t d = 0; d < D; ++d) plain[d * wn + t] = BF(0.f);
          ++t;
        }
      }
      blas::brgemm(R, wn, D, D, wn, lds, false, q, vnni ? packed : plain, w.s + j, vnni);
    }
    run_ranges(w, R, kc, cj0, cj1);
    softmax_bf16(w.s, lds, R, static_cast<int>(n), w.a.data(), w.b.data(), st.scale,
                 st.mk.soft_cap, w.m, w.l, w.alpha, w.pb, p_lo);
    for (int r = 0; r < R; ++r) {
      if (w.alpha[r] != 1.f) {
        float* a = w.acc + r * D;
        for (int64_t d = 0; d < D; d += kV) (Vec::loadu(a + d) * Vec(w.alpha[r])).store(a + d);
      }
    }
    // The GEMM takes the V rows of the keys every row sees, [ca, cb). A key only some rows see
    // has p = 0 in the others, which is exact only for a finite V (0 * inf = NaN): so when the V
    // rows of all such keys are finite (the rule, checked here), the GEMM takes every key some
    // row sees; otherwise those keys enter as zeros and each row adds them alone (the row loop).
    int ca, cb;
    common_keys(R, w.a.data(), w.b.data(), static_cast<int>(cj0), static_cast<int>(cj1), &ca,
                &cb);
    int ua = static_cast<int>(cj1), ub = static_cast<int>(cj0);  // keys some row sees
    for (int r = 0; r < R; ++r)
      if (w.a[r] < w.b[r]) {
        ua = std::min(ua, w.a[r]);
        ub = std::max(ub, w.b[r]);
      }
    // the keys some rows see but not all: [ua, ca) and [cb, ub), or [ua, ub) when none is common
    const bool widen = ua < ub && (ca == cb ? finite_rows(row, 1, ua, ub, D)
                                            : finite_rows(row, 1, ua, ca, D) &&
                                                  finite_rows(row, 1, cb, ub, D));
    const int ga = widen ? ua : ca, gb = widen ? ub : cb;
    for (int64_t d0 = 0; d0 < D; d0 += kPanel) {  // P.V, kPanel output columns at a time
      const int64_t wc = std::min(kPanel, D - d0);
      if (vnni) {  // V panel [n / 2][wc][2]: rows of key pairs interleaved, a block at a time
        for (int64_t t0 = 0; t0 < n; t0 += bs) {
          const int64_t lo = std::clamp<int64_t>(ga - t0, 0, bs);
          const int64_t hi = std::clamp<int64_t>(gb - t0, 0, bs);
          const BF* v = lo < hi ? row(t0 + lo, 1) - lo * D + d0 : nullptr;  // the block's row 0
          auto at = [&](int64_t i) { return i >= lo && i < hi ? v + i * D : nullptr; };
          for (int64_t i = 0; i < bs; i += 2)
            interleave_rows(at(i), at(i + 1), packed + (t0 + i) * wc, wc);
        }
        blas::brgemm(R, wc, n, lds, wc, D, true, w.pb, packed, w.acc + d0, vnni);
        if (p_lo) blas::brgemm(R, wc, n, lds, wc, D, true, p_lo, packed, w.acc + d0, vnni);
        continue;
      }
      for (int64_t t = 0; t < n;) {  // V panel [n][wc], one block's rows at a time
        if (t >= ga && t < gb) {
          const int64_t rows = std::min<int64_t>(bs - t % bs, gb - t);
          const BF* v = row(t, 1) + d0;
          for (int64_t i = 0; i < rows; ++i)
            copy_row(v + i * D, plain + (t + i) * wc, wc);
          t += rows;
        } else {
          std::fill(plain + t * wc, plain + (t + 1) * wc, BF(0.f));
          ++t;
        }
      }
      blas::brgemm(R, wc, n, lds, wc, D, true, w.pb, plain, w.acc + d0, vnni);
      if (p_lo) blas::brgemm(R, wc, n, lds, wc, D, true, p_lo, plain, w.acc + d0, vnni);
    }
    for (int r = 0; r < R && !widen; ++r) {  // keys [a, b) outside [ca, cb): p (bf16) times V
      // (with no common key, ca = cb = cj0 <= a: the row's whole range)
      const int a = w.a[r], b = w.b[r];
      if (a >= b) continue;
      float* acc = w.acc + r * D;
      auto add = [&](int x, int y) {
        for (int j = x; j < y; ++j) {
          const BF* v = row(j, 1);
          float pj = static_cast<float>(w.pb[r * lds + j]);
          if (p_lo) pj += static_cast<float>(p_lo[r * lds + j]);
          const Vec p(pj);
          for (int64_t d = 0; d < D; d += kV)
            at::vec::fmadd(p, load_f32(v + d), Vec::loadu(acc + d)).store(acc + d);
        }
      };
      if (a < std::min(b, ca)) add(a, std::min(b, ca));
      if (std::max(a, cb) < b) add(std::max(a, cb), b);
    }
  }
}

template void attend_matrix(const Step&, const int32_t*, const ItemBlocks<c10::BFloat16>&,
                            Scratch&, int, int64_t, int64_t, bool);
template void attend_matrix(const Step&, const int32_t*,
                            const ItemBlocks<c10::Float8_e4m3fn>&, Scratch&, int, int64_t,
                            int64_t, bool);

void release_matrix_tiles() { at::native::cpublas::brgemm_release(true); }

bool matrix_engine() { return at::native::cpublas::could_pack(at::kBFloat16); }

}  // namespace pa_attn
