// Panel GEMM driver: weight packing, activation packing, blocking, threads and the epilogue
// (bias, scales, output rounding). The inner loops are the per-ISA microkernels of panel_isa.h.
//
// Threads split the panels (N), so every weight byte is read from memory once per pass of up to
// `mc` rows. Within a panel, k runs in blocks of `kc` steps; every row group of the pass reuses
// the block from L1 while it is hot, so large M re-reads the weight from cache, not from DRAM.
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels.h"
#include "panel_isa.h"

namespace pa_onednn {
namespace {

using panel::kCols;
using panel::kMaxRows;
constexpr int64_t kPanelsPerChunk = 16;  // 16 x 16 columns: 1 MiB of bf16 weights at K=2048
constexpr int64_t kParallelPackElems = int64_t{1} << 20;  // smaller x: packed by one thread

// f(begin, end) over `threads` contiguous slices of [0, total) on torch's thread pool (at most
// torch's thread count run at once; 0 = that count).
template <typename F>
void split(int64_t total, int64_t threads, const F& f) {
  const int64_t t = std::max<int64_t>(
      1, std::min<int64_t>(threads > 0 ? threads : at::get_num_threads(), total));
  at::parallel_for(0, t, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) f(total * c / t, total * (c + 1) / t);
  });
}

// f(begin, end) over chunks of [0, total) that the threads claim one at a time: a thread that
// the OS preempts (the CPU may be shared) delays only its current chunk, not half of the work.
template <typename F>
void claim(int64_t total, int64_t chunk, int64_t threads, const F& f) {
  const int64_t chunks = (total + chunk - 1) / chunk;
  std::atomic<int64_t> next{0};
  split(chunks, threads, [&](int64_t, int64_t) {
    for (int64_t c = next++; c < chunks; c = next++) f(c * chunk, std::min(total, (c + 1) * chunk));
  });
}

// Rows in groups of at most kMaxRows, as even as possible (16 rows: 6, 5, 5).
struct Group {
  int64_t row, rows;
};

std::vector<Group> row_groups(int64_t m) {
  const int64_t g = (m + kMaxRows - 1) / kMaxRows;
  std::vector<Group> out;
  int64_t row = 0;
  for (int64_t i = 0; i < g; ++i) {
    const int64_t rows = m / g + (i < m % g ? 1 : 0);
    out.push_back({row, rows});
    row += rows;
  }
  return out;
}

const panel::Kernels* find(int64_t isa) {
  if (isa == kPanelAvx2) return panel::avx2_kernels();
  if (isa == kPanelGeneric) return panel::generic_kernels();
  return nullptr;
}

// The weight type's in-register tile of an ISA (nullptr: it only widens per k block).
panel::HalfTile half_tile(const panel::Kernels& k, int64_t w_dt) {
  return w_dt == kBF16 ? k.bf16 : k.f16;
}

const panel::Kernels& kernels(const PanelConf& conf, int64_t w_dt) {
  const panel::Kernels* k = find(conf.isa);
  if (k == nullptr || (w_dt == kS8 && k->s8 == nullptr))
    throw std::invalid_argument("panel GEMM: ISA variant " + std::to_string(conf.isa) +
                                " is not available here" + (w_dt == kS8 ? " for int8" : ""));
  if ((w_dt == kBF16 || w_dt == kF16) && conf.widen == kWidenInRegisters &&
      half_tile(*k, w_dt) == nullptr)
    throw std::invalid_argument(std::string("panel GEMM: the ") + k->name +
                                " kernels only widen per k block");
  return *k;
}

// A growing per-thread scratch buffer (reused across calls: no page faults per call).
template <typename T>
T* scratch(std::vector<T>& buf, size_t n) {
  if (buf.size() < n) buf.resize(n);
  return buf.data();
}

inline float bf16_to_f32(uint16_t v) {
  const uint32_t b = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

inline float f16_to_f32(uint16_t v) { return c10::detail::fp16_ieee_to_fp32_value(v); }

// One output value in the call's type: fp32 as is, bf16/fp16 rounded to nearest even (c10's
// conversions, so results match torch's own casts bit for bit).
inline void store(void* out, int64_t dt, int64_t i, float v) {
  switch (dt) {
    case kF32: static_cast<float*>(out)[i] = v; return;
    case kBF16: static_cast<c10::BFloat16*>(out)[i] = c10::BFloat16(v); return;
    default: static_cast<c10::Half*>(out)[i] = c10::Half(v); return;
  }
}

void check_call(const PanelCall& c) {
  if (c.m <= 0 || c.n <= 0 || c.k <= 0 || c.lda < c.k || c.ldc < c.n)
    throw std::invalid_argument("panel GEMM: bad sizes or strides");
  // 16-bit weights: fp32 or their own type out; int8 and fp32 weights: any of the three
  const bool any_out = c.w_dt == kS8 || c.w_dt == kF32;
  const bool out_ok = c.out_dt == kF32 || c.out_dt == (any_out ? c.out_dt : c.w_dt);
  if (!out_ok || (c.out_dt != kF32 && c.out_dt != kBF16 && c.out_dt != kF16))
    throw std::invalid_argument("panel GEMM: unsupported output type for these weights");
  if (c.w_dt == kS8 && c.k > kPanelMaxK8)
    throw std::invalid_argument("panel GEMM: int8 K=" + std::to_string(c.k) +
                                " could overflow the int32 accumulator");
}

}  // namespace

int64_t panel_count(int64_t n) { return (n + kCols - 1) / kCols; }

bool panel_isa_available(int64_t isa, int64_t w_dt) {
  const panel::Kernels* k = find(isa);
  return k != nullptr && (w_dt != kS8 || k->s8 != nullptr);
}

int64_t panel_steps(int64_t w_dt, int64_t k) { return w_dt == kS8 ? (k + 1) / 2 : k; }

void pack_panels(const void* w, int64_t w_dt, int64_t n, int64_t k, void* out,
                 int64_t threads) {
  const int64_t steps = panel_steps(w_dt, k);
  split(panel_count(n), threads, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p)
      for (int64_t c = 0; c < kCols; ++c) {
        const int64_t col = p * kCols + c;
        if (w_dt == kS8) {  // k-pair q, half c / 8, lane c % 8: bytes (2q, 2q + 1)
          const auto* src = static_cast<const int8_t*>(w) + col * k;
          auto* dst = static_cast<int8_t*>(out) + p * steps * 32 + (c / 8) * 16 + (c % 8) * 2;
          for (int64_t kk = 0; kk < 2 * steps; ++kk)
            dst[(kk / 2) * 32 + kk % 2] = col < n && kk < k ? src[kk] : 0;
          continue;
        }
        if (w_dt == kF32) {  // column order
          const auto* src = static_cast<const float*>(w) + col * k;
          auto* dst = static_cast<float*>(out) + p * k * kCols + c;
          for (int64_t kk = 0; kk < k; ++kk) dst[kk * kCols] = col < n ? src[kk] : 0.f;
          continue;
        }
        // bf16: column c in 32-bit word c % 8, low half for c < 8; fp16: column order
        const int64_t slot = w_dt == kBF16 ? 2 * (c % 8) + c / 8 : c;
        const auto* src = static_cast<const uint16_t*>(w) + col * k;
        auto* dst = static_cast<uint16_t*>(out) + p * k * kCols + slot;
        for (int64_t kk = 0; kk < k; ++kk) dst[kk * kCols] = col < n ? src[kk] : 0;
      }
  });
}

namespace {

// What differs between the bf16 and the int8 GEMM; the loops below are shared.
template <int64_t kDt_>  // kBF16 or kF16
struct Half16 {
  using XWord = float;  // packed activations: fp32 (bf16/fp16 -> fp32 is exact)
  using Acc = float;
  using W = uint16_t;
  static constexpr int64_t kDt = kDt_;
  static constexpr int64_t kStep = kCols;  // panel elements per k step
  static int64_t steps(int64_t k) { return k; }
  static void pack_row(const void* x, int64_t k, XWord* dst, int64_t stride) {
    const auto* row = static_cast<const uint16_t*>(x);
    for (int64_t kk = 0; kk < k; ++kk)
      dst[kk * stride] = kDt_ == kBF16 ? bf16_to_f32(row[kk]) : f16_to_f32(row[kk]);
  }
  static float finish(const PanelCall& c, Acc acc, int64_t, int64_t n) {
    return c.bias ? acc + c.bias[n] : acc;
  }
};

struct Float32 {
  using XWord = float;
  using Acc = float;
  using W = float;
  static constexpr int64_t kDt = kF32;
  static constexpr int64_t kStep = kCols;
  static int64_t steps(int64_t k) { return k; }
  static void pack_row(const void* x, int64_t k, XWord* dst, int64_t stride) {
    const auto* row = static_cast<const float*>(x);
    for (int64_t kk = 0; kk < k; ++kk) dst[kk * stride] = row[kk];
  }
  static float finish(const PanelCall& c, Acc acc, int64_t, int64_t n) {
    return c.bias ? acc + c.bias[n] : acc;
  }
};

struct S8 {
  using XWord = int32_t;  // packed activations: (x[2q], x[2q+1]) as two int16
  using Acc = int32_t;
  using W = int8_t;
  static constexpr int64_t kDt = kS8;
  static constexpr int64_t kStep = 2 * kCols;  // one k-pair
  static int64_t steps(int64_t k) { return (k + 1) / 2; }
  static void pack_row(const void* x, int64_t k, XWord* dst, int64_t stride) {
    const auto* row = static_cast<const int8_t*>(x);
    for (int64_t q = 0; q < steps(k); ++q) {
      const auto lo = static_cast<uint16_t>(static_cast<int16_t>(row[2 * q]));
      const auto hi = static_cast<uint16_t>(
          static_cast<int16_t>(2 * q + 1 < k ? row[2 * q + 1] : int8_t{0}));
      dst[q * stride] = static_cast<int32_t>(lo | (static_cast<uint32_t>(hi) << 16));
    }
  }
  // the reference's order: (acc * s_x) * s_w, then + bias, in fp32 (no fused multiply-add)
  static float finish(const PanelCall& c, Acc acc, int64_t m, int64_t n) {
    float v = static_cast<float>(acc) * c.x_scale[m];
    v = v * c.w_scale[n];
    return c.bias ? v + c.bias[n] : v;
  }
};

// Rows [0, c.m) of a call with m <= conf.mc. x is packed once; threads claim chunks of panels.
// Panel-major, each panel runs its k blocks in order; block-major, each k block runs over the
// chunk's panels (their sums all held). Either way every row group reuses a panel's k block
// from L1 (or, widening per k block, the block widened once into an fp32 buffer).
template <typename T>
void gemm_rows(const PanelCall& c, const PanelConf& conf, const panel::Kernels& kern) {
  constexpr int64_t kDt = T::kDt;
  using XWord = typename T::XWord;
  using Acc = typename T::Acc;
  const int64_t steps = T::steps(c.k);
  const int64_t kc = std::max<int64_t>(1, std::min(conf.kc / (T::kStep / kCols), steps));
  const bool tile = conf.widen == kWidenTile;
  const auto groups = row_groups(c.m);
  static thread_local std::vector<XWord> xbuf;  // [steps][rows] per row group
  XWord* xp = scratch(xbuf, static_cast<size_t>(c.m * steps));
  const size_t x_elem = kDt == kS8 ? 1 : kDt == kF32 ? 4 : 2;
  // packing a few rows is cheaper than waking threads for it
  const int64_t pack_threads = c.m * c.k < kParallelPackElems ? 1 : conf.threads;
  split(static_cast<int64_t>(groups.size()), pack_threads, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g)
      for (int64_t r = 0; r < groups[g].rows; ++r) {
        const int64_t row = groups[g].row + r;
        const auto* src = static_cast<const char*>(c.x) + row * c.lda * x_elem;
        T::pack_row(src, c.k, xp + groups[g].row * steps + r, groups[g].rows);
      }
  });
  const auto* panels = static_cast<const typename T::W*>(c.panels);
  const bool block_major = conf.order == kBlockMajor;
  claim(panel_count(c.n), kPanelsPerChunk, conf.threads, [&](int64_t p0, int64_t p1) {
    static thread_local std::vector<Acc> abuf;
    static thread_local std::vector<float> tbuf;
    const int64_t held = block_major ? p1 - p0 : 1;  // panels whose sums are in flight
    Acc* acc = scratch(abuf, static_cast<size_t>(held * c.m * kCols));  // [held][m][16]
    float* wide = tile && kDt != kF32 ? scratch(tbuf, static_cast<size_t>(kc * kCols)) : nullptr;
    // panel p's k block from k0 into its sums `ap` ([m][16])
    auto block = [&](int64_t p, int64_t k0, Acc* ap) {
      const int64_t kn = std::min(kc, steps - k0);
      const auto* wp = panels + (p * steps + k0) * T::kStep;
      if constexpr (kDt == kBF16 || kDt == kF16) {
        if (tile) (kDt == kBF16 ? kern.widen_bf16 : kern.widen_f16)(kn, wp, wide);
      }
      for (const Group& gr : groups) {
        const XWord* xg = xp + gr.row * steps + k0 * gr.rows;
        const int mr = static_cast<int>(gr.rows);
        Acc* ag = ap + gr.row * kCols;
        if constexpr (kDt == kS8)
          kern.s8(mr, kn, xg, wp, ag, k0 > 0);
        else if constexpr (kDt == kF32)
          kern.f32_panels(mr, kn, xg, wp, ag, k0 > 0);
        else if (tile)
          kern.f32(mr, kn, xg, wide, ag, k0 > 0);
        else
          half_tile(kern, kDt)(mr, kn, xg, wp, ag, k0 > 0);
      }
    };
    auto finish = [&](int64_t p, const Acc* ap) {
      const int64_t n0 = p * kCols, cols = std::min(kCols, c.n - n0);
      for (int64_t r = 0; r < c.m; ++r)
        for (int64_t j = 0; j < cols; ++j)
          store(c.out, c.out_dt, r * c.ldc + n0 + j, T::finish(c, ap[r * kCols + j], r, n0 + j));
    };
    if (block_major) {
      for (int64_t k0 = 0; k0 < steps; k0 += kc)
        for (int64_t p = p0; p < p1; ++p) block(p, k0, acc + (p - p0) * c.m * kCols);
      for (int64_t p = p0; p < p1; ++p) finish(p, acc + (p - p0) * c.m * kCols);
      return;
    }
    for (int64_t p = p0; p < p1; ++p) {
      for (int64_t k0 = 0; k0 < steps; k0 += kc) block(p, k0, acc);
      finish(p, acc);
    }
  });
}

// Runs `rows` over blocks of at most conf.mc rows (each block reads the weight once).
template <typename Rows>
void by_row_blocks(const PanelCall& c, const PanelConf& conf, size_t x_elem, size_t out_elem,
                   const Rows& rows) {
  const int64_t mc = std::max<int64_t>(1, conf.mc);
  for (int64_t m0 = 0; m0 < c.m; m0 += mc) {
    PanelCall b = c;
    b.m = std::min(mc, c.m - m0);
    b.x = static_cast<const char*>(c.x) + m0 * c.lda * x_elem;
    b.out = static_cast<char*>(c.out) + m0 * c.ldc * out_elem;
    if (c.x_scale) b.x_scale = c.x_scale + m0;
    rows(b);
  }
}

size_t elem_size(int64_t dt) { return dt == kF32 ? 4 : 2; }

}  // namespace

void panel_gemm(const PanelCall& c, const PanelConf& conf) {
  check_call(c);
  const panel::Kernels& kern = kernels(conf, c.w_dt);
  const size_t x_elem = c.w_dt == kS8 ? 1 : elem_size(c.w_dt);
  by_row_blocks(c, conf, x_elem, elem_size(c.out_dt), [&](const PanelCall& b) {
    switch (c.w_dt) {
      case kBF16: return gemm_rows<Half16<kBF16>>(b, conf, kern);
      case kF16: return gemm_rows<Half16<kF16>>(b, conf, kern);
      case kF32: return gemm_rows<Float32>(b, conf, kern);
      case kS8: return gemm_rows<S8>(b, conf, kern);
      default: throw std::invalid_argument("panel GEMM: weights must be bf16, fp16, fp32 or int8");
    }
  });
}

}  // namespace pa_onednn
