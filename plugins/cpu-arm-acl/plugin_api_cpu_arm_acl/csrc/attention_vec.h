// Loads and reductions over at::vec::Vectorized<float>, the one vector type the attention kernels
// use. The same source compiles per ISA (CPU_CAPABILITY=AVX2 / AVX512 on x86-64, the NEON
// specialisation on aarch64); only the fp8 load has an x86 path of its own.
#pragma once

#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <limits>
#include <type_traits>

namespace pa_attn {

using Vec = at::vec::Vectorized<float>;
constexpr int kV = Vec::size();
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// fp8 e4m3 byte -> fp32, filled once at module load from c10's conversion (the definition).
extern float g_fp8_table[256];
void init_fp8_table();

// e^x for the softmax's p = e^(z - m) (x <= 0, -inf for masked keys, which gives 0). AVX-512:
// x log2(e) = n + f with n an integer and |f| <= 1/2, 2^f by Cephes' exp2f polynomial (relative
// error below 2e-7), 2^n by vscalefps: 10 operations where exp_u20 takes about 20, and the
// softmax was the bound of the matrix layout. A NaN x gives 0, as exp_u20 gives a finite value:
// the callers carry a NaN score in m instead. Elsewhere exp_u20.
#if defined(CPU_CAPABILITY_AVX512)
// 2^t for t >= -151 (a NaN t stays NaN): Cephes' exp2f polynomial on t's fraction, vscalefps for
// its integer part.
inline __m512 exp2_avx512(__m512 t) {
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(t, n);
  __m512 p = _mm512_set1_ps(1.535336188319500e-4f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.339887440266574e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.618437357674640e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550332471162809e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.402264791363012e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931472028550421e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(p, n);
}

// exp2_avx512 to the precision of a P rounded to bf16 (the matrix layout's): a degree-4 minimax
// polynomial (fitted here by Remez exchange) of relative error below 3e-6, where bf16's rounding
// is up to 2e-3; two FMAs fewer.
inline __m512 exp2_bf16_avx512(__m512 t) {
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(t, n);
  __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(9.570101911e-3f), f, _mm512_set1_ps(5.591786032e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.402474483e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931218147e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.999992614e-1f));
  return _mm512_scalef_ps(p, n);
}
#endif

inline Vec exp_softmax(const Vec& x) {
#if defined(CPU_CAPABILITY_AVX512)
  // vmaxps returns its second operand for a NaN: -151, so NaN gives 0 (e^x < 2^-150 rounds to 0)
  return Vec(exp2_avx512(_mm512_max_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                       _mm512_set1_ps(-151.f))));
#else
  return x.exp_u20();
#endif
}

// kV consecutive elements at p, converted to fp32. fp8 yields the stored value (unscaled).
inline Vec load_f32(const float* p) { return Vec::loadu(p); }

inline Vec load_f32(const c10::BFloat16* p) {
  Vec v;
  at::vec::load_to_float(p, v);
  return v;
}

inline Vec load_f32(const c10::Half* p) {
  Vec v;
  at::vec::load_to_float(p, v);
  return v;
}

// fp8 e4m3fn on x86 by integer arithmetic, exact for all 256 bytes: |b| = 0eeeemmm with e > 0
// is 2^(e - 7) * 1.mmm, whose fp32 bits are (|b| << 20) + (120 << 23); e = 0 is m * 2^-9, a
// normal fp32 (so no denormal ever meets DAZ); 0x7F is NaN; the sign bit moves to bit 31. A
// gather from g_fp8_table took 3x a bf16 load's time per decode step (bench, Zen 4).
#if defined(CPU_CAPABILITY_AVX512)
inline Vec load_f32(const c10::Float8_e4m3fn* p) {
  const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const __m512i mag = _mm512_and_si512(b, _mm512_set1_epi32(0x7F));
  const __m512i sign = _mm512_slli_epi32(_mm512_and_si512(b, _mm512_set1_epi32(0x80)), 24);
  const __m512 normal = _mm512_castsi512_ps(
      _mm512_add_epi32(_mm512_slli_epi32(mag, 20), _mm512_set1_epi32(120 << 23)));
  const __m512 small = _mm512_mul_ps(_mm512_cvtepi32_ps(mag), _mm512_set1_ps(0x1p-9f));
  const __mmask16 is_small = _mm512_cmplt_epi32_mask(mag, _mm512_set1_epi32(8));
  const __mmask16 is_nan = _mm512_cmpeq_epi32_mask(mag, _mm512_set1_epi32(0x7F));
  __m512 v = _mm512_mask_mov_ps(normal, is_small, small);
  v = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(v), sign));
  return Vec(_mm512_mask_mov_ps(v, is_nan, _mm512_set1_ps(std::numeric_limits<float>::quiet_NaN())));
}
// The same bytes widened to bf16 instead, 32 at a time, for the vdpbf16ps path (kDotBf16, whose
// build has VBMI too): every e4m3 value is a bf16, so this is exact too. |b| is looked up in two
// byte planes of 128 entries (vpermi2b reads an index's low 7 bits), the sign ORed into the high
// byte, the planes interleaved: 4 operations per 32 elements, 3 when two rows share the lookup
// (_x2, fp8_pair_keys: P.V gets pair order straight from the interleave). Widening by arithmetic
// took 11, and an fp8 cache then decoded 5% slower than a bf16 one; with the lookups it decodes
// 1.35-1.7x faster (docs/measurements/cpu-arm-acl/2026-12-05-zen4.md).
#if defined(__AVX512BF16__)
#if !defined(__AVX512VBMI__)
#error "the avx512bf16 attention variant is compiled with -mavx512vbmi (fp8_to_bf16)"
#endif
constexpr uint16_t fp8_bf16_bits(int mag) {
  if (mag == 0x7F) return 0x7FC0;
  if (mag >= 8) return static_cast<uint16_t>((mag << 4) + (120 << 7));
  if (mag == 0) return 0;
  int e = 0;  // m * 2^-9 = 2^(e - 9) * 1.f with 2^e <= m
  while ((2 << e) <= mag) ++e;
  return static_cast<uint16_t>(((e - 9 + 127) << 7) | ((mag - (1 << e)) << (7 - e)));
}
struct Fp8Tables {
  alignas(64) uint8_t lo[128];  // the planes
  alignas(64) uint8_t hi[128];
  // vpermt2b indices over (lo planes, hi planes) of 64 bytes: first / second give the bf16 of
  // bytes 0-31 / 32-63 in order; even / odd give pair_keys' operands for rows x (bytes 0-31) and
  // y (32-63)
  alignas(64) uint8_t first[64];
  alignas(64) uint8_t second[64];
  alignas(64) uint8_t even[64];
  alignas(64) uint8_t odd[64];
};
constexpr Fp8Tables fp8_tables() {
  Fp8Tables t{};
  for (int m = 0; m < 128; ++m) {
    t.lo[m] = static_cast<uint8_t>(fp8_bf16_bits(m) & 0xFF);
    t.hi[m] = static_cast<uint8_t>(fp8_bf16_bits(m) >> 8);
  }
  for (int i = 0; i < 32; ++i) {
    t.first[2 * i] = static_cast<uint8_t>(i);
    t.first[2 * i + 1] = static_cast<uint8_t>(64 + i);
    t.second[2 * i] = static_cast<uint8_t>(32 + i);
    t.second[2 * i + 1] = static_cast<uint8_t>(96 + i);
  }
  // 32-bit lane i of even: (x[2i], y[2i]) as bf16, low word first; odd: (x[2i + 1], y[2i + 1])
  for (int i = 0; i < 16; ++i)
    for (int k = 0; k < 2; ++k) {
      uint8_t* lane = (k == 0 ? t.even : t.odd) + 4 * i;
      const int e = 2 * i + k;
      lane[0] = static_cast<uint8_t>(e);
      lane[1] = static_cast<uint8_t>(64 + e);
      lane[2] = static_cast<uint8_t>(32 + e);
      lane[3] = static_cast<uint8_t>(96 + e);
    }
  return t;
}
inline constexpr Fp8Tables kFp8 = fp8_tables();

// lo / hi: the low and high bytes of the bf16 of each of the 64 bytes of b
inline void fp8_bf16_planes(__m512i b, __m512i& lo, __m512i& hi) {
  const auto* l = kFp8.lo;
  const auto* h = kFp8.hi;
  lo = _mm512_permutex2var_epi8(_mm512_load_si512(l), b, _mm512_load_si512(l + 64));
  hi = _mm512_permutex2var_epi8(_mm512_load_si512(h), b, _mm512_load_si512(h + 64));
  hi = _mm512_ternarylogic_epi32(hi, b, _mm512_set1_epi8(static_cast<char>(0x80)), 0xF8);
}

inline __m512i fp8_to_bf16(__m256i bytes) {
  __m512i lo, hi;
  fp8_bf16_planes(_mm512_castsi256_si512(bytes), lo, hi);
  return _mm512_permutex2var_epi8(lo, _mm512_load_si512(kFp8.first), hi);
}

// Two rows of 32 fp8 elements, x in bytes 0-31 of xy and y in 32-63, as bf16: one lookup for both.
inline void fp8_to_bf16_x2(__m512i xy, __m512i& x, __m512i& y) {
  __m512i lo, hi;
  fp8_bf16_planes(xy, lo, hi);
  x = _mm512_permutex2var_epi8(lo, _mm512_load_si512(kFp8.first), hi);
  y = _mm512_permutex2var_epi8(lo, _mm512_load_si512(kFp8.second), hi);
}

// The same two rows as the vdpbf16ps operands of pair order (what pair_keys makes of two bf16
// rows): no blends.
inline void fp8_pair_keys(__m512i xy, __m512bh& even, __m512bh& odd) {
  __m512i lo, hi;
  fp8_bf16_planes(xy, lo, hi);
  even = reinterpret_cast<__m512bh>(
      _mm512_permutex2var_epi8(lo, _mm512_load_si512(kFp8.even), hi));
  odd = reinterpret_cast<__m512bh>(_mm512_permutex2var_epi8(lo, _mm512_load_si512(kFp8.odd), hi));
}
#endif
#elif defined(CPU_CAPABILITY_AVX2)
inline Vec load_f32(const c10::Float8_e4m3fn* p) {
  const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  const __m256i mag = _mm256_and_si256(b, _mm256_set1_epi32(0x7F));
  const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(b, _mm256_set1_epi32(0x80)), 24);
  const __m256 normal = _mm256_castsi256_ps(
      _mm256_add_epi32(_mm256_slli_epi32(mag, 20), _mm256_set1_epi32(120 << 23)));
  const __m256 small = _mm256_mul_ps(_mm256_cvtepi32_ps(mag), _mm256_set1_ps(0x1p-9f));
  const __m256 is_small = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(8), mag));
  const __m256 is_nan = _mm256_castsi256_ps(_mm256_cmpeq_epi32(mag, _mm256_set1_epi32(0x7F)));
  __m256 v = _mm256_blendv_ps(normal, small, is_small);
  v = _mm256_castsi256_ps(_mm256_or_si256(_mm256_castps_si256(v), sign));
  return Vec(_mm256_blendv_ps(v, _mm256_set1_ps(std::numeric_limits<float>::quiet_NaN()), is_nan));
}

// 16 fp8 e4m3fn bytes as 16 bf16 words in order (every e4m3 value is a bf16, so exactly), in
// 16-bit lanes: |b| >= 8 is (|b| << 4) + (120 << 7); the subnormals |b| < 8 (m * 2^-9) come from a
// vpshufb table of their 8 bf16 words (indices 2m and 2m + 1 for a word's two bytes); 0x7F is
// NaN; the sign moves to bit 15. 14 operations per 16 elements, where widening each 8 to fp32 by
// arithmetic (load_f32) took 12.
inline __m256i fp8_bf16_words_avx2(const c10::Float8_e4m3fn* p) {
  const __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const __m256i mag = _mm256_and_si256(b, _mm256_set1_epi16(0x7F));
  const __m256i normal =
      _mm256_add_epi16(_mm256_slli_epi16(mag, 4), _mm256_set1_epi16(static_cast<short>(120 << 7)));
  // m * 2^-9 for m = 0..7 as bf16: 0, 2^-9, 2^-8, 1.5 * 2^-8, 2^-7, 1.25 * 2^-7, 1.5 * 2^-7, ...
  const __m256i table = _mm256_setr_epi16(0, 0x3B00, 0x3B80, 0x3BC0, 0x3C00, 0x3C20, 0x3C40, 0x3C60,
                                          0, 0x3B00, 0x3B80, 0x3BC0, 0x3C00, 0x3C20, 0x3C40, 0x3C60);
  const __m256i index = _mm256_add_epi16(_mm256_mullo_epi16(mag, _mm256_set1_epi16(0x0202)),
                                         _mm256_set1_epi16(0x0100));
  const __m256i small = _mm256_shuffle_epi8(table, index);
  __m256i w = _mm256_blendv_epi8(normal, small, _mm256_cmpgt_epi16(_mm256_set1_epi16(8), mag));
  w = _mm256_blendv_epi8(w, _mm256_set1_epi16(0x7FC0),
                         _mm256_cmpeq_epi16(mag, _mm256_set1_epi16(0x7F)));
  return _mm256_or_si256(w, _mm256_slli_epi16(_mm256_and_si256(b, _mm256_set1_epi16(0x80)), 8));
}
#else
inline Vec load_f32(const c10::Float8_e4m3fn* p) {
  const auto* bytes = reinterpret_cast<const uint8_t*>(p);
  alignas(64) int32_t tmp[kV];
  for (int i = 0; i < kV; ++i) tmp[i] = bytes[i];
  return at::vec::gather<sizeof(float)>(g_fp8_table, at::vec::Vectorized<int32_t>::loadu(tmp));
}
#endif

// 2 * kV consecutive elements at p as two fp32 vectors, in the order dot products use.
// bf16 on x86 comes out split into even and odd elements ("pair split"): each 32-bit word holds
// two bf16, so a shift and a mask convert 2 * kV elements in two cheap operations instead of
// four shuffles and shifts. Whoever multiplies these must hold its operand in the same order,
// "pair order": each whole chunk of 2 * kV elements holds its even elements, then its odd ones
// (at::vec::deinterleave2 of the chunk's two vectors), and a shorter tail keeps its place. Every
// other case keeps the natural order.
// On AVX2 an fp8 cache's pairs come out the same way: 16 bytes are widened to bf16 words first
// (fp8_bf16_words_avx2), then split as bf16 is.
#if defined(CPU_CAPABILITY_AVX512)
template <typename T>
constexpr bool kPairSplit = std::is_same_v<T, c10::BFloat16>;
#elif defined(CPU_CAPABILITY_AVX2)
template <typename T>
constexpr bool kPairSplit =
    std::is_same_v<T, c10::BFloat16> || std::is_same_v<T, c10::Float8_e4m3fn>;
#else
template <typename T>
constexpr bool kPairSplit = false;
#endif

template <typename T>
inline void load_pair(const T* p, Vec& first, Vec& second) {
  if constexpr (kPairSplit<T>) {
    using IVec = at::vec::Vectorized<int32_t>;
    const IVec words = [&] {
#if defined(CPU_CAPABILITY_AVX2)
      if constexpr (std::is_same_v<T, c10::Float8_e4m3fn>) return IVec(fp8_bf16_words_avx2(p));
#endif
      return IVec::loadu(p);
    }();
    // an immediate shift: at::vec's operator<< is a variable shift (vpsllvd), which also holds
    // its count in one of AVX2's 16 vector registers
#if defined(CPU_CAPABILITY_AVX512)
    first = at::vec::cast<float>(IVec(_mm512_slli_epi32(words, 16)));
#elif defined(CPU_CAPABILITY_AVX2)
    first = at::vec::cast<float>(IVec(_mm256_slli_epi32(words, 16)));
#else  // no pair split here (kPairSplit is false): only parsed
    first = at::vec::cast<float>(words << IVec(16));
#endif
    second = at::vec::cast<float>(words & IVec(static_cast<int32_t>(0xFFFF0000u)));
  } else {
    first = load_f32(p);
    second = load_f32(p + kV);
  }
}

// Decode scores straight from bf16 query and bf16 K with AVX-512 BF16's vdpbf16ps (32 exact
// bf16 products a step, summed in fp32), where the build CPU has it: half the instructions of
// widening K and two FMAs, no pair order for q. The query is then kept unscaled (bf16 is exact
// only for the query as given) and the scale applied to each score. P.V on this path rounds the
// probabilities to bf16 and takes vdpbf16ps too (pv_tile_bf16), as the Triton kernels round p
// to the model dtype for their P.V dot.
// An fp8 cache takes the same path, its bytes widened to bf16 (fp8_to_bf16) instead of fp32: half
// the conversion work per element and no second FMA.
#if defined(CPU_CAPABILITY_AVX512) && defined(__AVX512BF16__)
template <typename KT, typename QT>
constexpr bool kDotBf16 =
    (std::is_same_v<KT, c10::BFloat16> || std::is_same_v<KT, c10::Float8_e4m3fn>) &&
    std::is_same_v<QT, c10::BFloat16>;
#else
template <typename KT, typename QT>
constexpr bool kDotBf16 = false;
#endif

// Whether a dot-layout item's P.V accumulators come out in pair order: V loaded pair split on the
// fp32 path, or multiplied in key pairs by vdpbf16ps (pair_keys).
template <typename KT, typename QT>
constexpr bool kPairAcc = kPairSplit<KT> || kDotBf16<KT, QT>;

inline float reduce_add(const Vec& v) {
  return at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return a + b; }, v);
}

// out[i] = sum of the lanes of v[i], for 8 vectors. One transposing add tree does all 8: with
// AVX2 9 operations instead of 8 separate reductions of 6 or 7; with AVX-512 25 instead of 8
// reductions of 8 or more (the score tile's reduction took more time than its dot products).
inline void reduce_add_8(const Vec* v, float* out) {
#if defined(CPU_CAPABILITY_AVX512)
  // halves: p[i] = [v[2i] folded to 8 lanes | v[2i + 1] folded]
  __m512 p[4];
  for (int i = 0; i < 4; ++i) {
    const __m512 a = v[2 * i], b = v[2 * i + 1];
    p[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xee));
  }
  // quarters: 128-bit lane L of u[h] holds v[4h + L] folded to 4 lanes
  __m512 u[2];
  for (int h = 0; h < 2; ++h) {
    const __m512 a = p[2 * h], b = p[2 * h + 1];
    u[h] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x88), _mm512_shuffle_f32x4(a, b, 0xdd));
  }
  // within each 128-bit lane L: lanes 0 and 1 become the sums of v[L] and v[4 + L]
  const __m512 z = _mm512_add_ps(_mm512_unpacklo_ps(u[0], u[1]), _mm512_unpackhi_ps(u[0], u[1]));
  const __m512 w = _mm512_add_ps(z, _mm512_permute_ps(z, 0x4e));
  const __m512 sums = _mm512_permutexvar_ps(
      _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0), w);
  _mm256_storeu_ps(out, _mm512_castps512_ps256(sums));
#elif defined(CPU_CAPABILITY_AVX2)
  const __m256 a = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
  const __m256 c = _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));
  // a = [v0..v3 lanes 0-3 | v0..v3 lanes 4-7], c likewise for v4..v7
  const __m256 lo = _mm256_permute2f128_ps(a, c, 0x20), hi = _mm256_permute2f128_ps(a, c, 0x31);
  _mm256_storeu_ps(out, _mm256_add_ps(lo, hi));
#else
  for (int i = 0; i < 8; ++i) out[i] = reduce_add(v[i]);
#endif
}

#if defined(CPU_CAPABILITY_AVX512)
// Lane i of the result: op over the lanes of v[i], for 16 vectors. One transposing tree (46
// operations) instead of 16 separate reductions (128).
template <typename Op>
inline __m512 reduce_16(const __m512* v, Op op) {
  __m512 h[8], q[4], s[2];
  for (int i = 0; i < 8; ++i)  // [v(2i) folded to 8 lanes | v(2i + 1) folded]
    h[i] = op(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44),
              _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xee));
  for (int i = 0; i < 4; ++i)  // 128-bit lane L: v(4i + L) folded to 4 lanes
    q[i] = op(_mm512_shuffle_f32x4(h[2 * i], h[2 * i + 1], 0x88),
              _mm512_shuffle_f32x4(h[2 * i], h[2 * i + 1], 0xdd));
  for (int i = 0; i < 2; ++i)  // lane L: x = v(8i + L), y = v(8i + 4 + L) to 2 lanes: [x y x y]
    s[i] = op(_mm512_unpacklo_ps(q[2 * i], q[2 * i + 1]),
              _mm512_unpackhi_ps(q[2 * i], q[2 * i + 1]));
  const __m512 lo = _mm512_castpd_ps(
      _mm512_unpacklo_pd(_mm512_castps_pd(s[0]), _mm512_castps_pd(s[1])));
  const __m512 hi = _mm512_castpd_ps(
      _mm512_unpackhi_pd(_mm512_castps_pd(s[0]), _mm512_castps_pd(s[1])));
  // element 4L + k now holds v(4k + L)
  return _mm512_permutexvar_ps(
      _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), op(lo, hi));
}

// The 16-bit elements of v's two 256-bit halves interleaved: element 2i is the low half's i,
// 2i + 1 the high half's i (two rows as bf16 pairs, the order vdpbf16ps and AMX's VNNI B take).
inline __m512i interleave_halves(__m512i v) {
  const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24,
                                       8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return _mm512_permutexvar_epi16(idx, v);
}
#endif

inline float reduce_max(const Vec& v) {
  return at::vec::vec_reduce_all<float>(
      [](Vec& a, Vec& b) { return at::vec::maximum(a, b); }, v);
}

// Asks for `bytes` starting at p to be brought into L2, or into L1 with `l1` (the next K or V
// block of a request lives at an unrelated address, out of the hardware prefetcher's sight).
// Which one is faster depends on the CPU (docs/measurements/cpu-arm-acl/2026-12-04-zen5.md); attention.py's
// `prefetch_target` chooses per call (the forward op's ahead_l1).
inline void prefetch(const void* p, int64_t bytes, bool l1 = false) {
  const char* c = static_cast<const char*>(p);
  if (l1)
    for (int64_t off = 0; off < bytes; off += 64) __builtin_prefetch(c + off, 0, 3);
  else
    for (int64_t off = 0; off < bytes; off += 64) __builtin_prefetch(c + off, 0, 2);
}

// The same into L1, for rows about to be read that `prefetch` already brought to L2.
inline void prefetch_l1(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t off = 0; off < bytes; off += 64) __builtin_prefetch(c + off, 0, 3);
}

}  // namespace pa_attn
