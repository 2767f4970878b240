// AVX2 + FMA (+ F16C) panel microkernels (layouts in panel_isa.h). Each function carries its
// own target attribute, so this file compiles for any x86-64 build flags and the driver picks it
// at run time only when the CPU reports AVX2, FMA and F16C.
#include "panel_isa.h"

#if defined(__x86_64__)
#include <immintrin.h>

#define PA_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace pa_onednn::panel {
namespace {

// A build for AVX-512 (a development build on such a CPU) may use EVEX's ymm16-31 here too.
#if defined(__AVX512VL__)
constexpr int kYmmRegisters = 32;
#else
constexpr int kYmmRegisters = 16;
#endif

// Weights stream from DRAM once per call; the hardware prefetcher alone left single-row calls
// about 15-30% short of the bandwidth on the development machine (measured: 1-4 KiB ahead all
// help alike). One prefetch per 64-byte line: every second 32-byte step.
constexpr int64_t kPrefetchBytes = 2048;

PA_AVX2 inline void prefetch(const void* p) {
  _mm_prefetch(static_cast<const char*>(p) + kPrefetchBytes, _MM_HINT_T0);
}

// How one k step of 16 weights becomes two fp32 vectors (columns 0..7 and 8..15).
struct Bf16Pairs {  // 32-bit word j = (column j, column 8 + j): two integer ops, no shuffle
  using W = uint16_t;
  static constexpr bool kStream = true;  // read from memory once: prefetch
  static constexpr int kConstants = 1;   // ymm registers load() keeps: the 0xffff0000 mask
  PA_AVX2 static void load(const W* w, __m256& w0, __m256& w1) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
    w0 = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    w1 = _mm256_castsi256_ps(
        _mm256_and_si256(v, _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
  }
};

struct Halves {  // fp16 in column order: vcvtph2ps (exact)
  using W = uint16_t;
  static constexpr bool kStream = true;
  static constexpr int kConstants = 0;
  PA_AVX2 static void load(const W* w, __m256& w0, __m256& w1) {
    w0 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w)));
    w1 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 8)));
  }
};

struct Floats {  // a k block already widened into an L1 buffer
  using W = float;
  static constexpr bool kStream = false;
  static constexpr int kConstants = 0;
  PA_AVX2 static void load(const W* w, __m256& w0, __m256& w1) {
    w0 = _mm256_loadu_ps(w);
    w1 = _mm256_loadu_ps(w + 8);
  }
};

struct FloatPanels : Floats {  // fp32 weights read from memory once: prefetch
  static constexpr bool kStream = true;
};

// MR broadcasts x 2 FMAs per k step. The accumulators plus 2 weight registers and 1 broadcast
// fit the 16 ymm registers. With MR <= 3 rows, even and odd k steps go to separate
// accumulators (S = 2 sets), so that enough FMAs are in flight to hide their 4-cycle latency;
// the sets are added at the end.
template <int MR, typename Wd>
struct Tile {
  static constexpr int S = MR <= 3 ? 2 : 1;
  // Every ymm register taken (12 accumulators, 2 weights, 1 broadcast, bf16's mask): one k
  // step per iteration, since GCC interleaving two spilled 4 accumulators per pair on AVX2.
  static constexpr bool kOneStep = 2 * MR + 3 + Wd::kConstants >= kYmmRegisters;
  __m256 c0[S][MR], c1[S][MR];

  PA_AVX2 void step(int s, const float* x, const typename Wd::W* w) {
    __m256 w0, w1;
    Wd::load(w, w0, w1);
#pragma GCC unroll 6
    for (int r = 0; r < MR; ++r) {
      const __m256 xb = _mm256_broadcast_ss(x + r);
      c0[s][r] = _mm256_fmadd_ps(xb, w0, c0[s][r]);
      c1[s][r] = _mm256_fmadd_ps(xb, w1, c1[s][r]);
    }
  }

  PA_AVX2 void run(int64_t kc, const float* x, const typename Wd::W* w, float* acc, bool add) {
#pragma GCC unroll 6
    for (int r = 0; r < MR; ++r) {
      c0[0][r] = add ? _mm256_loadu_ps(acc + r * 16) : _mm256_setzero_ps();
      c1[0][r] = add ? _mm256_loadu_ps(acc + r * 16 + 8) : _mm256_setzero_ps();
      if constexpr (S == 2) c0[1][r] = c1[1][r] = _mm256_setzero_ps();
    }
    int64_t k = 0;
    if constexpr (kOneStep) {
#pragma GCC unroll 1
      for (; k + 1 <= kc; ++k) {
        if constexpr (Wd::kStream)
          if (sizeof(typename Wd::W) == 4 || (k & 1) == 0) prefetch(w + k * 16);
        step(0, x + k * MR, w + k * 16);
      }
    } else {
      for (; k + 2 <= kc; k += 2) {
        if constexpr (Wd::kStream) prefetch(w + k * 16);
        // fp32: each k step is a whole 64-byte line
        if constexpr (Wd::kStream && sizeof(typename Wd::W) == 4) prefetch(w + (k + 1) * 16);
        step(0, x + k * MR, w + k * 16);
        step(S - 1, x + (k + 1) * MR, w + (k + 1) * 16);
      }
    }
    if (k < kc) step(0, x + k * MR, w + k * 16);
#pragma GCC unroll 6
    for (int r = 0; r < MR; ++r) {
      if constexpr (S == 2) {
        c0[0][r] = _mm256_add_ps(c0[0][r], c0[1][r]);
        c1[0][r] = _mm256_add_ps(c1[0][r], c1[1][r]);
      }
      _mm256_storeu_ps(acc + r * 16, c0[0][r]);
      _mm256_storeu_ps(acc + r * 16 + 8, c1[0][r]);
    }
  }
};

template <typename Wd>
PA_AVX2 void widen(int64_t kc, const typename Wd::W* w, float* out) {
  for (int64_t k = 0; k < kc; ++k) {
    if ((k & 1) == 0) prefetch(w + k * 16);
    __m256 w0, w1;
    Wd::load(w + k * 16, w0, w1);
    _mm256_storeu_ps(out + k * 16, w0);
    _mm256_storeu_ps(out + k * 16 + 8, w1);
  }
}

// int8: sign-extend 2 x 16 weight bytes to int16 (vpmovsxbw), then per row one broadcast of the
// (x[2q], x[2q+1]) int16 pair and vpmaddwd: each int32 lane gets w0*x0 + w1*x1, at most 2 * 2^14
// in magnitude, so nothing saturates (unlike vpmaddubsw's int16 sums); vpaddd accumulates.
template <int MR>
struct S8Tile {
  PA_AVX2 static void run(int64_t kp, const int32_t* x, const int8_t* w, int32_t* acc,
                          bool add) {
    __m256i c0[MR], c1[MR];
#pragma GCC unroll 6
    for (int r = 0; r < MR; ++r) {
      c0[r] = add ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(acc + r * 16))
                  : _mm256_setzero_si256();
      c1[r] = add ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(acc + r * 16 + 8))
                  : _mm256_setzero_si256();
    }
    for (int64_t q = 0; q < kp; ++q) {
      if ((q & 1) == 0) prefetch(w + q * 32);
      const __m128i* p = reinterpret_cast<const __m128i*>(w + q * 32);
      const __m256i w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128(p));
      const __m256i w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128(p + 1));
#pragma GCC unroll 6
      for (int r = 0; r < MR; ++r) {
        const __m256i xb = _mm256_set1_epi32(x[q * MR + r]);
        c0[r] = _mm256_add_epi32(c0[r], _mm256_madd_epi16(w0, xb));
        c1[r] = _mm256_add_epi32(c1[r], _mm256_madd_epi16(w1, xb));
      }
    }
#pragma GCC unroll 6
    for (int r = 0; r < MR; ++r) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(acc + r * 16), c0[r]);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(acc + r * 16 + 8), c1[r]);
    }
  }
};

template <typename Wd>
struct FloatTile {
  template <int MR>
  struct Of {
    PA_AVX2 static void run(int64_t kc, const float* x, const typename Wd::W* w, float* acc,
                            bool add) {
      Tile<MR, Wd> t;
      t.run(kc, x, w, acc, add);
    }
  };
};

// mr -> the MR instantiation (the driver never passes mr outside 1..kMaxRows)
template <template <int> class Fn, typename... A>
void by_rows(int mr, A... a) {
  switch (mr) {
    case 1: return Fn<1>::run(a...);
    case 2: return Fn<2>::run(a...);
    case 3: return Fn<3>::run(a...);
    case 4: return Fn<4>::run(a...);
    case 5: return Fn<5>::run(a...);
    default: return Fn<6>::run(a...);
  }
}

const Kernels kAvx2{
    "avx2",
    [](int mr, int64_t kc, const float* x, const uint16_t* w, float* acc, bool add) {
      by_rows<FloatTile<Bf16Pairs>::Of>(mr, kc, x, w, acc, add);
    },
    [](int mr, int64_t kc, const float* x, const uint16_t* w, float* acc, bool add) {
      by_rows<FloatTile<Halves>::Of>(mr, kc, x, w, acc, add);
    },
    [](int mr, int64_t kc, const float* x, const float* w, float* acc, bool add) {
      by_rows<FloatTile<Floats>::Of>(mr, kc, x, w, acc, add);
    },
    [](int mr, int64_t kc, const float* x, const float* w, float* acc, bool add) {
      by_rows<FloatTile<FloatPanels>::Of>(mr, kc, x, w, acc, add);
    },
    widen<Bf16Pairs>,
    widen<Halves>,
    [](int mr, int64_t kp, const int32_t* x, const int8_t* w, int32_t* acc, bool add) {
      by_rows<S8Tile>(mr, kp, x, w, acc, add);
    },
};

}  // namespace

const Kernels* avx2_kernels() {
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                         __builtin_cpu_supports("f16c");
  return ok ? &kAvx2 : nullptr;
}

}  // namespace pa_onednn::panel

#else  // not x86-64: no AVX2 kernels

namespace pa_onednn::panel {
const Kernels* avx2_kernels() { return nullptr; }
}  // namespace pa_onednn::panel

#endif
