// Small-M bf16 GEMV on oneDNN's packed weights (kernels.h's PairedBlocks): one 64-column block
// per task, its 32-k blocks read front to back with vdpbf16ps, the M rows' (k, k + 1) pairs
// broadcast from x as they stand (no packing), fp32 accumulators in registers for the whole K
// (at M = 8 GCC keeps five of the 32 on the stack: a load and a store each per step, behind the
// step's 32 FMAs). Threads split the column blocks, so each weight byte is read from memory
// once.
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "kernels.h"

#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

namespace pa_onednn {

#if defined(__AVX512BF16__)
namespace {

// With `prefetch`, bytes ahead of the current k-pair step that each step asks for, two of its
// four lines (non-temporal: the weights are read once); tuned on a Zen 5, where it helps. On a
// Zen 4 the same prefetch halved the read rate (GemvPolicy; docs/measurements/cpu-arm-acl).
template <int M>
constexpr int64_t kPrefetchBytes = M <= 2 ? 1024 : 2048;

// Columns [64 nb, 64 nb + 64) of out for M rows: acc[r][t] holds columns 16 t .. 16 t + 15.
template <int M, bool Prefetch>
void column_block(const PairedBlocks& w, int64_t nb, const uint16_t* x, int64_t ldx, void* out,
                  int64_t out_dt, int64_t ldo) {
  __m512 acc[M][4];
#pragma GCC unroll 8
  for (int r = 0; r < M; ++r)
#pragma GCC unroll 4
    for (int t = 0; t < 4; ++t) acc[r][t] = _mm512_setzero_ps();
  const uint16_t* col = w.base + nb * w.stride_n;
  for (int64_t kb = 0; kb < w.k / 32; ++kb) {
    const uint16_t* blk = col + kb * w.stride_k;
    for (int s = 0; s < 16; ++s) {  // k-pair step: 64 columns x 2 k = 256 bytes
      const uint16_t* step = blk + s * 128;
      if constexpr (Prefetch) {
        __builtin_prefetch(reinterpret_cast<const char*>(step) + kPrefetchBytes<M>, 0, 0);
        __builtin_prefetch(reinterpret_cast<const char*>(step) + kPrefetchBytes<M> + 128, 0, 0);
      }
      __m512bh v[4];
#pragma GCC unroll 4
      for (int t = 0; t < 4; ++t)
        v[t] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(step + t * 32));
      const int64_t k = kb * 32 + 2 * s;
#pragma GCC unroll 8  // every row: acc must stay addressable by constants (registers)
      for (int r = 0; r < M; ++r) {
        uint32_t pair;
        std::memcpy(&pair, x + r * ldx + k, sizeof(pair));
        const auto xr = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(pair)));
#pragma GCC unroll 4
        for (int t = 0; t < 4; ++t) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], xr, v[t]);
      }
    }
  }
  const int64_t n0 = nb * 64;
  for (int t = 0; t < 4; ++t) {
    const int64_t c = n0 + 16 * t;
    if (c >= w.n) break;
    const __mmask16 lanes = w.n - c >= 16 ? __mmask16(0xffff) : __mmask16((1u << (w.n - c)) - 1);
    for (int r = 0; r < M; ++r) {
      if (out_dt == kF32) {
        _mm512_mask_storeu_ps(static_cast<float*>(out) + r * ldo + c, lanes, acc[r][t]);
      } else {  // bf16: round to nearest even, once
        const __m256i b = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(acc[r][t]));
        _mm256_mask_storeu_epi16(static_cast<uint16_t*>(out) + r * ldo + c, lanes, b);
      }
    }
  }
}

template <int M>
void all_blocks(const PairedBlocks& w, const uint16_t* x, int64_t ldx, void* out, int64_t out_dt,
                int64_t ldo, int64_t threads, bool prefetch) {
  const int64_t blocks = (w.n + 63) / 64;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t nb = 0; nb < blocks; ++nb) {
    if (prefetch)
      column_block<M, true>(w, nb, x, ldx, out, out_dt, ldo);
    else
      column_block<M, false>(w, nb, x, ldx, out, out_dt, ldo);
  }
}

}  // namespace

bool gemv_available() { return true; }

void gemv_bf16(const PairedBlocks& w, const uint16_t* x, int64_t m, int64_t ldx, void* out,
               int64_t out_dt, int64_t ldo, int64_t threads, bool prefetch) {
  const int64_t t = threads > 0 ? threads : omp_get_max_threads();
  switch (m) {
    case 1: all_blocks<1>(w, x, ldx, out, out_dt, ldo, t, prefetch); break;
    case 2: all_blocks<2>(w, x, ldx, out, out_dt, ldo, t, prefetch); break;
    case 3: all_blocks<3>(w, x, ldx, out, out_dt, ldo, t, prefetch); break;
    case 4: all_blocks<4>(w, x, ldx, out, out_dt, ldo, t, prefetch); break;
    case 5: all_blocks<5>(w, x, ldx, out, out_dt, ldo, t, prefetch); break;
    case 6: all_blocks<6>(w, x, ldx, out, out_dt, ldo, t, prefetch); break;
    case 7: all_blocks<7>(w, x, ldx, out, out_dt, ldo, t, prefetch); break;
    case 8: all_blocks<8>(w, x, ldx, out, out_dt, ldo, t, prefetch); break;
    default: throw std::invalid_argument("gemv_bf16: m must be 1..8");
  }
}

#else  // no AVX-512 BF16 in this build (-march=native): the Python side never calls it

bool gemv_available() { return false; }

void gemv_bf16(const PairedBlocks&, const uint16_t*, int64_t, int64_t, void*, int64_t, int64_t,
               int64_t, bool) {
  throw std::runtime_error("gemv_bf16: this build has no AVX-512 BF16");
}

#endif

}  // namespace pa_onednn
