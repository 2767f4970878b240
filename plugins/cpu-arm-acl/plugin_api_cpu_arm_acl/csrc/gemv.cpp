// Small-M bf16 GEMV on oneDNN's packed weights (kernels.h's PairedBlocks), in two kernels:
// - vdpbf16ps (AVX-512 BF16): one 64-column block per task, its 32-k blocks read front to back,
//   the M rows' (k, k + 1) pairs broadcast from x as they stand (no packing), fp32 accumulators in
//   registers for the whole K (at M = 8 GCC keeps five of the 32 on the stack: a load and a store
//   each per step, behind the step's 32 FMAs);
// - AMX tiles, where the CPU has them and the kernel grants them: a 32-k block of the packed
//   weights is four B tiles as it stands (16 k-pairs x 16 columns x 2, rows 256 bytes apart), x's
//   M rows one A tile, four fp32 C tiles for the whole K. One tile multiply per 1 KB of weights
//   keeps the read, not the arithmetic, the bound up to 16 rows; 17-64 rows run as groups of 16
//   over K in chunks that stay in L1 (amx_blocks_grouped).
// Threads split the column blocks, so each weight byte is read from memory once.
// unpack_bf16 turns the same packed weights back into [N, K] rows (LargeMPolicy: torch's matmul
// takes plain rows only).
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "amx.h"
#include "kernels.h"

namespace pa_onednn {

#if defined(__AVX512BF16__)
namespace {

// The lanes of a 16-column group that fall inside N.
inline __mmask16 lanes_from(int64_t c, int64_t n) {
  return n - c >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - c)) - 1);
}

// Row r's 16 columns from c: fp32, or bf16 rounded to nearest even (once).
inline void store_columns(__m512 v, void* out, int64_t out_dt, int64_t ldo, int64_t r, int64_t c,
                          __mmask16 lanes) {
  if (out_dt == kF32) {
    _mm512_mask_storeu_ps(static_cast<float*>(out) + r * ldo + c, lanes, v);
  } else {
    const __m256i b = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v));
    _mm256_mask_storeu_epi16(static_cast<uint16_t*>(out) + r * ldo + c, lanes, b);
  }
}

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
    const __mmask16 lanes = lanes_from(c, w.n);
    for (int r = 0; r < M; ++r) store_columns(acc[r][t], out, out_dt, ldo, r, c, lanes);
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

// ---- AMX tiles ---------------------------------------------------------------------------------

// Bytes ahead of the current 4 KB weight block that a prefetching call asks for: the next block
// of the same column range (its 64 lines, to L1: the next step reads them whole).
constexpr int64_t kAmxPrefetchBytes = 4096;

// Tiles 0-3: C (x's rows x 16 fp32 columns); 4: A (x's rows x 32 bf16); 5-7: B (16 k-pairs).
// One 32-k step of a 64-column block: x's rows times the block's four 16-column B tiles.
PA_AMX inline void block_step(const uint16_t* x, int64_t x_stride, const uint16_t* blk) {
  _tile_loadd(4, x, x_stride);
  _tile_loadd(5, blk, 256);
  _tile_loadd(6, blk + 32, 256);
  _tile_loadd(7, blk + 64, 256);
  _tile_dpbf16ps(0, 4, 5);
  _tile_dpbf16ps(1, 4, 6);
  _tile_dpbf16ps(2, 4, 7);
  _tile_loadd(5, blk + 96, 256);
  _tile_dpbf16ps(3, 4, 5);
}

// C tiles 0-3 to or from 16 rows of 64 fp32 columns.
PA_AMX inline void store_c(float (*acc)[64]) {
  _tile_stored(0, &acc[0][0], 256);
  _tile_stored(1, &acc[0][16], 256);
  _tile_stored(2, &acc[0][32], 256);
  _tile_stored(3, &acc[0][48], 256);
}

PA_AMX inline void load_c(float (*acc)[64]) {
  _tile_loadd(0, &acc[0][0], 256);
  _tile_loadd(1, &acc[0][16], 256);
  _tile_loadd(2, &acc[0][32], 256);
  _tile_loadd(3, &acc[0][48], 256);
}

// Rows 0 .. m - 1 of acc, columns n0 .. n0 + 63 of out (those inside N).
inline void write_block(const float (*acc)[64], int64_t m, int64_t n0, int64_t n, void* out,
                        int64_t out_dt, int64_t ldo) {
  for (int t = 0; t < 4; ++t) {
    const int64_t c = n0 + 16 * t;
    if (c >= n) break;
    const __mmask16 lanes = lanes_from(c, n);
    for (int64_t r = 0; r < m; ++r)
      store_columns(_mm512_load_ps(&acc[r][16 * t]), out, out_dt, ldo, r, c, lanes);
  }
}

// Up to 16 rows: one A tile of x as it stands, four C tiles over all of K.
PA_AMX void amx_blocks(const PairedBlocks& w, int64_t first, int64_t last, const uint16_t* x,
                       int64_t m, int64_t ldx, void* out, int64_t out_dt, int64_t ldo,
                       bool prefetch) {
  pa_amx::TileConfig cfg;
  for (int t = 0; t < 8; ++t) cfg.set(t, t < 5 ? static_cast<int>(m) : 16, 64);
  cfg.load();
  alignas(64) float acc[16][64];
  for (int64_t nb = first; nb < last; ++nb) {
    const uint16_t* col = w.base + nb * w.stride_n;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t kb = 0; kb < w.k / 32; ++kb) {
      const uint16_t* blk = col + kb * w.stride_k;
      if (prefetch) {
        const char* ahead = reinterpret_cast<const char*>(blk) + kAmxPrefetchBytes;
        for (int line = 0; line < 64; ++line) _mm_prefetch(ahead + 64 * line, _MM_HINT_T0);
      }
      block_step(x + kb * 32, ldx * 2, blk);
    }
    store_c(acc);
    write_block(acc, m, nb * 64, w.n, out, out_dt, ldo);
  }
  _tile_release();
}

// 17-64 rows: x in groups of 16 rows (the last zero-padded, copied once per call into `xg`),
// K in chunks of kChunkBlocks 32-k blocks. Per 64-column block and chunk, each group runs the
// m <= 16 loop over the chunk with its C tiles reloaded from and stored back to memory: the
// first group streams the chunk's weights from memory, the others find them in L1, so each
// weight byte is still read from memory once. `groups` tile multiplies per 1 KB of weights. No
// software prefetch: one of the next chunk (to L1 or to L2) made it 5-20% slower.
constexpr int64_t kChunkBlocks = 4;  // 16 KB of weights and 4 x 2 KB of x per chunk: L1

PA_AMX void amx_blocks_grouped(const PairedBlocks& w, int64_t first, int64_t last,
                               const uint16_t* xg, int64_t groups, void* out, int64_t out_dt,
                               int64_t ldo, int64_t m) {
  pa_amx::TileConfig cfg;
  for (int t = 0; t < 8; ++t) cfg.set(t, 16, 64);
  cfg.load();
  alignas(64) float acc[kAmxGemvMaxRows][64];  // group g: rows 16 g .. 16 g + 15
  const int64_t blocks_k = w.k / 32;
  for (int64_t nb = first; nb < last; ++nb) {
    const uint16_t* col = w.base + nb * w.stride_n;
    std::memset(acc, 0, sizeof(float) * groups * 16 * 64);
    for (int64_t k0 = 0; k0 < blocks_k; k0 += kChunkBlocks) {
      const int64_t k1 = std::min(blocks_k, k0 + kChunkBlocks);
      for (int64_t g = 0; g < groups; ++g) {
        load_c(&acc[16 * g]);
        const uint16_t* xr = xg + g * 16 * w.k;
        for (int64_t kb = k0; kb < k1; ++kb)
          block_step(xr + kb * 32, w.k * 2, col + kb * w.stride_k);
        store_c(&acc[16 * g]);
      }
    }
    write_block(acc, m, nb * 64, w.n, out, out_dt, ldo);
  }
  _tile_release();
}

void amx_gemv(const PairedBlocks& w, const uint16_t* x, int64_t m, int64_t ldx, void* out,
              int64_t out_dt, int64_t ldo, int64_t threads, bool prefetch) {
  const int64_t blocks = (w.n + 63) / 64;
  const int64_t groups = (m + 15) / 16;
  static thread_local std::vector<uint16_t> padded;  // x in whole groups of 16 rows (m > 16)
  const uint16_t* xg = nullptr;
  if (m > 16) {
    if (padded.size() < static_cast<size_t>(groups * 16 * w.k))
      padded.resize(static_cast<size_t>(groups * 16 * w.k));
    for (int64_t r = 0; r < m; ++r) std::memcpy(padded.data() + r * w.k, x + r * ldx, w.k * 2);
    std::memset(padded.data() + m * w.k, 0, (groups * 16 - m) * w.k * 2);
    xg = padded.data();
  }
#pragma omp parallel num_threads(threads)
  {
    // each thread configures its own tiles: one contiguous range of column blocks per thread
    const int64_t team = omp_get_num_threads(), me = omp_get_thread_num();
    const int64_t first = blocks * me / team, last = blocks * (me + 1) / team;
    if (first < last && m <= 16)
      amx_blocks(w, first, last, x, m, ldx, out, out_dt, ldo, prefetch);
    else if (first < last)
      amx_blocks_grouped(w, first, last, xg, groups, out, out_dt, ldo, m);
  }
}

// ---- unpack ------------------------------------------------------------------------------------

// 16 x 16 32-bit words, r[i] row i, transposed in place: 32-bit then 64-bit interleaves within
// 128-bit lanes, then two rounds of lane shuffles.
inline void transpose16(__m512i (&r)[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  __m512i u[16];  // u[4g + j], 128-bit lane L: rows 4g..4g+3 at column 4L + j
  for (int g = 0; g < 16; g += 4) {
    u[g] = _mm512_unpacklo_epi64(t[g], t[g + 2]);
    u[g + 1] = _mm512_unpackhi_epi64(t[g], t[g + 2]);
    u[g + 2] = _mm512_unpacklo_epi64(t[g + 1], t[g + 3]);
    u[g + 3] = _mm512_unpackhi_epi64(t[g + 1], t[g + 3]);
  }
  for (int j = 0; j < 4; ++j) {
    const __m512i v0 = _mm512_shuffle_i32x4(u[j], u[4 + j], 0x88);
    const __m512i v1 = _mm512_shuffle_i32x4(u[j], u[4 + j], 0xDD);
    const __m512i v2 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0x88);
    const __m512i v3 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0xDD);
    r[j] = _mm512_shuffle_i32x4(v0, v2, 0x88);       // column j
    r[4 + j] = _mm512_shuffle_i32x4(v1, v3, 0x88);   // column 4 + j
    r[8 + j] = _mm512_shuffle_i32x4(v0, v2, 0xDD);   // column 8 + j
    r[12 + j] = _mm512_shuffle_i32x4(v1, v3, 0xDD);  // column 12 + j
  }
}

// Column block nb back into rows: each 4 KB block is 16 k-pairs x 64 columns of 32-bit words,
// so row n's 32 k values of the block are column n of it; four 16 x 16 transposes per block.
void unpack_block(const PairedBlocks& w, int64_t nb, uint16_t* out) {
  const uint16_t* col = w.base + nb * w.stride_n;
  for (int64_t kb = 0; kb < w.k / 32; ++kb) {
    const uint16_t* blk = col + kb * w.stride_k;
    for (int q = 0; q < 4; ++q) {
      const int64_t n0 = nb * 64 + 16 * q;
      if (n0 >= w.n) break;
      __m512i r[16];
      for (int p = 0; p < 16; ++p) r[p] = _mm512_loadu_si512(blk + p * 128 + q * 32);
      transpose16(r);
      const int64_t rows = std::min<int64_t>(16, w.n - n0);
      for (int c = 0; c < rows; ++c) _mm512_stream_si512(reinterpret_cast<__m512i*>(out + (n0 + c) * w.k + kb * 32), r[c]);
    }
  }
}

}  // namespace

bool gemv_available() { return true; }

const char* gemv_isa() { return pa_amx::granted() ? "amx" : "avx512bf16"; }

int64_t gemv_max_rows() { return pa_amx::granted() ? kAmxGemvMaxRows : kGemvMaxRows; }

void unpack_bf16(const PairedBlocks& w, uint16_t* out, int64_t threads) {
  const int64_t blocks = (w.n + 63) / 64;
  const int64_t t = threads > 0 ? threads : omp_get_max_threads();
#pragma omp parallel for num_threads(t) schedule(static)
  for (int64_t nb = 0; nb < blocks; ++nb) unpack_block(w, nb, out);
  _mm_sfence();
}

void gemv_bf16(const PairedBlocks& w, const uint16_t* x, int64_t m, int64_t ldx, void* out,
               int64_t out_dt, int64_t ldo, int64_t threads, bool prefetch) {
  const int64_t t = threads > 0 ? threads : omp_get_max_threads();
  if (pa_amx::granted()) {
    if (m < 1 || m > kAmxGemvMaxRows) throw std::invalid_argument("gemv_bf16: m must be 1..64");
    amx_gemv(w, x, m, ldx, out, out_dt, ldo, t, prefetch);
    return;
  }
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

const char* gemv_isa() { return "none"; }

int64_t gemv_max_rows() { return 0; }

void gemv_bf16(const PairedBlocks&, const uint16_t*, int64_t, int64_t, void*, int64_t, int64_t,
               int64_t, bool) {
  throw std::runtime_error("gemv_bf16: this build has no AVX-512 BF16");
}

void unpack_bf16(const PairedBlocks&, uint16_t*, int64_t) {
  throw std::runtime_error("unpack_bf16: this build has no AVX-512 BF16");
}

#endif

}  // namespace pa_onednn
