// Paged attention on the CPU: the matrix layout. Items of many rows (prefill tiles) can take
// their scores and P.V as bf16 GEMMs through torch's cpublas::brgemm, which runs oneDNN's AMX
// kernels where the CPU has AMX. Python decides per call (the attention-matrix setting).
#include <ATen/native/CPUBlas.h>

#include <algorithm>
#include <cstring>

#include "attention.h"
#include "attention_item.h"

#if defined(__x86_64__)
#include <fbgemm/Utils.h>  // transpose_simd: torch's x86 builds ship fbgemm
#endif

namespace pa_attn {
namespace {

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

// n bf16 elements from src to dst by vector loads and stores (memcpy of a short row that is not a
// compile-time size becomes `rep movs`, whose start-up cost dominated the V panel gathers).
inline void copy_row(const c10::BFloat16* src, c10::BFloat16* dst, int64_t n) {
  using BVec = at::vec::Vectorized<c10::BFloat16>;
  int64_t i = 0;
  for (; i + BVec::size() <= n; i += BVec::size()) BVec::loadu(src + i).store(dst + i);
  if (i < n) BVec::loadu(src + i, n - i).store(dst + i, n - i);
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

// One B operand: `plain` [k][n] row-major (leading dimension n) as torch's gemm takes it, packed
// into `packed` when vnni (the layout oneDNN's AMX brgemm reads). Returns what brgemm gets.
inline const c10::BFloat16* finish_panel(const c10::BFloat16* plain, c10::BFloat16* packed,
                                         int64_t k, int64_t n, bool vnni) {
  if (!vnni) return plain;
  at::native::cpublas::pack(k, n, n, n, at::kBFloat16, at::kBFloat16, plain, packed);
  return packed;
}

}  // namespace

// The rows of a many-row item (bf16 query as given in w.q [R][D], bf16 cache) over chunks of whole
// blocks of about kMatrixKeys keys: S = Q K^T by brgemm into w.s [R][chunk], kPanel keys at a
// time, the dot layout's online softmax over the chunk (scale applied to the scores), P rounded to
// bf16 (as the Triton kernels round p to the model dtype for their P.V dot), then acc += P V by
// one brgemm over the chunk's keys per kPanel output columns. K and V rows outside the item's key
// range enter the panels as zeros (a cache block past a sequence's end holds whatever was there
// before; 0 * NaN would poison the sum), and so do the V rows of keys that only some of the
// item's rows see (those rows add them one at a time: pv_visible's rule). vnni: B panels packed
// for oneDNN's AMX kernels (cpublas::could_pack); otherwise torch's gemm runs on the plain panels,
// the same loops, so that any machine tests them.
void attend_matrix(const Step& st, const int32_t* item, const ItemBlocks<c10::BFloat16>& kv,
                   Scratch& w, int R, int64_t first, int64_t last, bool vnni) {
  using BF = c10::BFloat16;
  namespace blas = at::native::cpublas;
  const int64_t D = st.g.dim, bs = st.g.block;
  const int64_t k0 = item[kK0], k1 = item[kK1];
  const int64_t run = matrix_blocks(bs), lds = run * bs;
  const BF* q = reinterpret_cast<const BF*>(w.q);
  // a K^T panel [D][kPanel] or a V panel [chunk keys][kPanel]
  const int64_t panel = std::max(D, lds) * kPanel;
  if (static_cast<int64_t>(w.panels.size()) < 2 * panel) w.panels.resize(2 * panel);
  BF* plain = w.panels.data();
  BF* packed = plain + panel;
  for (int64_t c = first; c <= last; c += run) {
    const int64_t n = (std::min(last + 1, c + run) - c) * bs, kc = c * bs;
    const int64_t cj0 = std::max<int64_t>(k0 - kc, 0), cj1 = std::min<int64_t>(k1 - kc, n);
    // row j of the chunk (K: which = 0, V: which = 1); null outside the item's key range
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
                st.mk.soft_cap, w.m, w.l, w.alpha, w.pb);
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
      blas::brgemm(R, wc, n, lds, wc, D, true, w.pb, finish_panel(plain, packed, n, wc, vnni),
                   w.acc + d0, vnni);
    }
    for (int r = 0; r < R && !widen; ++r) {  // keys [a, b) outside [ca, cb): p (bf16) times V
      // (with no common key, ca = cb = cj0 <= a: the row's whole range)
      const int a = w.a[r], b = w.b[r];
      if (a >= b) continue;
      float* acc = w.acc + r * D;
      auto add = [&](int x, int y) {
        for (int j = x; j < y; ++j) {
          const BF* v = row(j, 1);
          const Vec p(static_cast<float>(w.pb[r * lds + j]));
          for (int64_t d = 0; d < D; d += kV)
            at::vec::fmadd(p, load_f32(v + d), Vec::loadu(acc + d)).store(acc + d);
        }
      };
      if (a < std::min(b, ca)) add(a, std::min(b, ca));
      if (std::max(a, cb) < b) add(std::max(a, cb), b);
    }
  }
}

void release_matrix_tiles() { at::native::cpublas::brgemm_release(true); }

bool matrix_engine() { return at::native::cpublas::could_pack(at::kBFloat16); }

}  // namespace pa_attn
