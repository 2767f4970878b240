// Per-token-group quantization, bit-exact with docs/ops.md: for each group,
// a = max(max|x|, eps); s = a / qmax (IEEE fp32 division), optionally rounded up to a power of
// two; int8: q = clamp(round_half_even(x / s), -128, 127); fp8 e4m3fn: q = rne(clamp(x / s,
// -448, 448)). The AVX-512, AVX2, NEON and scalar paths do the same fp32 operations in the same
// order. Needs no torch: tests/group_quant_driver.cpp includes this file to compare the NEON path
// with the scalar one (PA_GROUP_QUANT_SCALAR) under qemu-aarch64.
#ifdef _OPENMP
#include <omp.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels.h"

#if defined(PA_GROUP_QUANT_SCALAR)
// the scalar path only (the reference the NEON path is checked against)
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define PA_AVX2 1
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define PA_AVX512 1  // 16 lanes for the bulk of each group; AVX2 then takes the rest
#if defined(__AVX512VBMI__)
#define PA_AVX512_VBMI 1  // bf16 input: one byte permute restores the order of 64 codes
#endif
#endif
#elif defined(__aarch64__) && defined(__ARM_NEON)
#include <arm_neon.h>
#define PA_NEON 1  // 8 lanes a step (two vectors of 4); the scalar code takes the rest
#endif

namespace pa_onednn {
namespace {

inline float bits_to_f32(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

inline uint32_t f32_to_bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

inline float half_to_f32(uint16_t h) {  // exact, subnormals included
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  if (exp == 0x1f) return bits_to_f32(sign | 0x7f800000 | (man << 13));
  if (exp == 0) {
    const float v = std::ldexp(static_cast<float>(man), -24);
    return sign ? -v : v;
  }
  return bits_to_f32(sign | ((exp + 112) << 23) | (man << 13));
}

inline float load_one(const void* x, int64_t dt, int64_t i) {
  switch (dt) {
    case kBF16: return bits_to_f32(static_cast<uint32_t>(static_cast<const uint16_t*>(x)[i]) << 16);
    case kF16: return half_to_f32(static_cast<const uint16_t*>(x)[i]);
    default: return static_cast<const float*>(x)[i];
  }
}

// |y| <= 448 (clamped) to e4m3fn with round-to-nearest-even. Below 2^-6 the format is
// fixed-point with step 2^-9, so the code is the RNE integer of |y| * 512 (0..8; 8 is 2^-6).
inline uint8_t e4m3_one(float y) {
  const uint32_t b = f32_to_bits(y);
  const uint8_t sign = (b >> 24) & 0x80;
  const uint32_t a = b & 0x7fffffff;
  if (bits_to_f32(a) < 0.015625f)
    return sign | static_cast<uint8_t>(std::nearbyint(bits_to_f32(a) * 512.0f));
  const uint32_t r = a + 0x7ffff + ((a >> 20) & 1);  // round away 20 mantissa bits, RNE
  return sign | static_cast<uint8_t>((r >> 20) - (120 << 3));  // rebias 127 -> 7
}

inline float group_scale(float amax, float eps, float qmax, bool ue8m0) {
  float s = std::max(amax, eps) / qmax;
  if (ue8m0) {
    int e;
    const float mant = std::frexp(s, &e);
    if (mant != 0.5f) s = std::ldexp(1.0f, e);
  }
  return s;
}

// A NaN quotient (a NaN in the group, or inf / inf) gets the code the reference's casts give it:
// int8 0, fp8 NaN (0x7f with the quotient's sign).
inline uint8_t nan_code(float y, bool fp8) {
  return fp8 ? static_cast<uint8_t>(((f32_to_bits(y) >> 24) & 0x80) | 0x7f) : 0;
}

inline uint8_t quant_one(float v, float s, bool fp8) {
  const float y = v / s;
  if (std::isnan(y)) return nan_code(y, fp8);
  if (fp8) return e4m3_one(std::min(std::max(y, -448.0f), 448.0f));
  const float r = std::min(std::max(std::nearbyint(y), -128.0f), 127.0f);
  return static_cast<uint8_t>(static_cast<int8_t>(r));
}

#ifdef PA_AVX2
template <int64_t DT>
inline __m256 load8(const void* x, int64_t i) {
  switch (DT) {
    case kBF16: {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(
          static_cast<const uint16_t*>(x) + i));
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    case kF16:
      return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(
          static_cast<const uint16_t*>(x) + i)));
    default: return _mm256_loadu_ps(static_cast<const float*>(x) + i);
  }
}

inline __m256i e4m3_8(__m256 y) {  // e4m3_one on 8 lanes
  const __m256i b = _mm256_castps_si256(y);
  const __m256i sign = _mm256_and_si256(_mm256_srli_epi32(b, 24), _mm256_set1_epi32(0x80));
  const __m256i a = _mm256_and_si256(b, _mm256_set1_epi32(0x7fffffff));
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(a, 20), _mm256_set1_epi32(1));
  const __m256i r = _mm256_add_epi32(a, _mm256_add_epi32(_mm256_set1_epi32(0x7ffff), odd));
  const __m256i normal = _mm256_sub_epi32(_mm256_srli_epi32(r, 20), _mm256_set1_epi32(120 << 3));
  const __m256 af = _mm256_castsi256_ps(a);
  const __m256 tiny = _mm256_cmp_ps(af, _mm256_set1_ps(0.015625f), _CMP_LT_OQ);
  // lanes below 2^-6 are rare in real data: only vectors that have one pay for the fixed-point
  // path
  if (_mm256_movemask_ps(tiny) == 0) return _mm256_or_si256(normal, sign);
  const __m256i sub = _mm256_cvtps_epi32(_mm256_mul_ps(af, _mm256_set1_ps(512.0f)));  // RNE
  const __m256i code = _mm256_blendv_epi8(normal, sub, _mm256_castps_si256(tiny));
  return _mm256_or_si256(code, sign);
}

// e4m3_one on 8 lanes that all have 2^-6 <= |y| <= 448 (1 + 2^-23): the sign stays in the
// word, so the rounding add, the rebias (folded into the same constant) and one arithmetic
// shift give code - 2048 for a negative lane; adding 2048 + 128 there sets the sign bit.
inline __m256i e4m3_normal_8(__m256 y) {
  const __m256i b = _mm256_castps_si256(y);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(b, 20), _mm256_set1_epi32(1));
  const __m256i bias = _mm256_set1_epi32(static_cast<int32_t>(0x7ffffu - (960u << 20)));
  const __m256i t = _mm256_srai_epi32(_mm256_add_epi32(b, _mm256_add_epi32(odd, bias)), 20);
  const __m256i neg = _mm256_and_si256(_mm256_srai_epi32(b, 31), _mm256_set1_epi32(2176));
  return _mm256_add_epi32(t, neg);
}

// 32 int32 lanes in [-128, 127] (int8) or [0, 255] (fp8 codes) -> 32 bytes in order. The packs
// work per 128-bit half, so their dwords hold a0-3 b0-3 c0-3 d0-3 a4-7 b4-7 c4-7 d4-7; one
// permutation restores the order.
inline void store32_bytes(__m256i a, __m256i b, __m256i c, __m256i d, bool fp8, uint8_t* out) {
  const __m256i ab = _mm256_packs_epi32(a, b), cd = _mm256_packs_epi32(c, d);
  const __m256i bytes = fp8 ? _mm256_packus_epi16(ab, cd) : _mm256_packs_epi16(ab, cd);
  const __m256i fixed = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), fixed);
}

// The largest / smallest of 8 unsigned lanes, in registers (a group of 64 or 128 elements is
// short enough that a store and 8 scalar steps would show).
inline uint32_t reduce_max_epu32(__m256i v) {
  __m128i m = _mm_max_epu32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0x4e));
  return static_cast<uint32_t>(_mm_cvtsi128_si32(_mm_max_epu32(m, _mm_shuffle_epi32(m, 0xb1))));
}

inline uint32_t reduce_min_epu32(__m256i v) {
  __m128i m = _mm_min_epu32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  m = _mm_min_epu32(m, _mm_shuffle_epi32(m, 0x4e));
  return static_cast<uint32_t>(_mm_cvtsi128_si32(_mm_min_epu32(m, _mm_shuffle_epi32(m, 0xb1))));
}

inline void store8_low_bytes(__m256i v, uint8_t* out) {
  // the low byte of each 32-bit lane, 8 bytes in order
  const __m256i pick = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                        -1, 0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                        -1, -1);
  const __m256i p = _mm256_shuffle_epi8(v, pick);
  const uint32_t lo = static_cast<uint32_t>(_mm_cvtsi128_si32(_mm256_castsi256_si128(p)));
  const uint32_t hi = static_cast<uint32_t>(_mm_cvtsi128_si32(_mm256_extracti128_si256(p, 1)));
  std::memcpy(out, &lo, 4);
  std::memcpy(out + 4, &hi, 4);
}
#endif

#ifdef PA_AVX512
// The 8-lane helpers above on 16 lanes, the same operations in the same order.
template <int64_t DT>
inline __m512 load16(const void* x, int64_t i) {
  switch (DT) {
    case kBF16: {
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(
          static_cast<const uint16_t*>(x) + i));
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    case kF16:
      return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(
          static_cast<const uint16_t*>(x) + i)));
    default: return _mm512_loadu_ps(static_cast<const float*>(x) + i);
  }
}

inline __m512i e4m3_16(__m512 y) {  // e4m3_8 on 16 lanes
  const __m512i b = _mm512_castps_si512(y);
  const __m512i sign = _mm512_and_si512(_mm512_srli_epi32(b, 24), _mm512_set1_epi32(0x80));
  const __m512i a = _mm512_and_si512(b, _mm512_set1_epi32(0x7fffffff));
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(a, 20), _mm512_set1_epi32(1));
  const __m512i r = _mm512_add_epi32(a, _mm512_add_epi32(_mm512_set1_epi32(0x7ffff), odd));
  const __m512i normal = _mm512_sub_epi32(_mm512_srli_epi32(r, 20), _mm512_set1_epi32(120 << 3));
  const __m512 af = _mm512_castsi512_ps(a);
  const __mmask16 tiny = _mm512_cmp_ps_mask(af, _mm512_set1_ps(0.015625f), _CMP_LT_OQ);
  if (tiny == 0) return _mm512_or_si512(normal, sign);
  const __m512i sub = _mm512_cvtps_epi32(_mm512_mul_ps(af, _mm512_set1_ps(512.0f)));  // RNE
  return _mm512_or_si512(_mm512_mask_blend_epi32(tiny, normal, sub), sign);
}

// e4m3_normal_8 on 16 lanes, with mask registers where the 8-lane one shifts: the rounding bit
// by a test, the sign by a compare, each added under its mask (one shift instead of three)
inline __m512i e4m3_normal_16(__m512 y) {
  const __m512i b = _mm512_castps_si512(y);
  const __mmask16 odd = _mm512_test_epi32_mask(b, _mm512_set1_epi32(1 << 20));
  const __mmask16 neg = _mm512_cmplt_epi32_mask(b, _mm512_setzero_si512());
  const __m512i bias = _mm512_set1_epi32(static_cast<int32_t>(0x7ffffu - (960u << 20)));
  const __m512i r = _mm512_add_epi32(b, bias);
  const __m512i t = _mm512_srai_epi32(_mm512_mask_add_epi32(r, odd, r, _mm512_set1_epi32(1)), 20);
  return _mm512_mask_add_epi32(t, neg, t, _mm512_set1_epi32(2176));
}

// |bf16| as a 16-bit integer orders like |x| (as plan_group's 32-bit comparison argues): the
// lane-wise abs-max, and for fp8 the abs-min, of the n bf16 at p (n a multiple of 32), 32 a step.
template <bool FP8>
inline void abs_max_min_bf16(const uint16_t* p, int64_t n, __m512i& hmax, __m512i& hmin) {
  const __m512i abs_w = _mm512_set1_epi16(0x7fff);
  if (n == 0) {
    hmax = _mm512_setzero_si512(), hmin = _mm512_set1_epi32(-1);
    return;
  }
  hmax = hmin = _mm512_and_si512(_mm512_loadu_si512(p), abs_w);
  for (int64_t i = 32; i < n; i += 32) {
    const __m512i a = _mm512_and_si512(_mm512_loadu_si512(p + i), abs_w);
    hmax = _mm512_max_epu16(hmax, a);
    if constexpr (FP8) hmin = _mm512_min_epu16(hmin, a);
  }
}

// 64 code bytes to q: streamed (past the caches) when asked and q is 64-byte aligned.
inline void store64(uint8_t* q, __m512i bytes, bool stream) {
  if (stream && (reinterpret_cast<uintptr_t>(q) & 63) == 0)
    _mm512_stream_si512(reinterpret_cast<__m512i*>(q), bytes);
  else
    _mm512_storeu_si512(q, bytes);
}
#endif

#ifdef PA_AVX512_VBMI
// 32 bf16 from one 64-byte load as two fp32 vectors, without a widening shuffle: the even
// elements (each 32-bit word shifted up) and the odd ones (each word's low half cleared).
inline void split_bf16(const uint16_t* p, __m512& even, __m512& odd) {
  const __m512i w = _mm512_loadu_si512(p);
  even = _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  odd = _mm512_castsi512_ps(
      _mm512_and_si512(w, _mm512_set1_epi32(static_cast<int32_t>(0xffff0000u))));
}

// Packing the int32 codes of (even0, odd0, even1, odd1) (two packs to 16 bits, one to 8) leaves
// in each 128-bit lane L the bytes [4L, 4L + 4) of the four vectors in turn; element 2j of the
// 64 is even0[j] (j < 16), 2j + 1 is odd0[j], the next 32 likewise from even1 / odd1.
struct ByteOrder {
  uint8_t idx[64];
};

constexpr ByteOrder interleave_order() {
  ByteOrder o{};
  for (int p = 0; p < 64; ++p) {
    const int vec = (p >= 32 ? 2 : 0) + (p & 1), j = (p % 32) / 2;
    o.idx[p] = static_cast<uint8_t>(16 * (j / 4) + 4 * vec + j % 4);
  }
  return o;
}

alignas(64) constexpr ByteOrder kInterleave = interleave_order();
#endif

#ifdef PA_NEON
// |bits| of 16-bit floats (bf16, fp16) order like their magnitudes, NaN above inf: the largest
// of the n 16-bit words at p with the sign cleared (n a multiple of 8).
inline uint16_t abs_max_bits16(const uint16_t* p, int64_t n) {
  const uint16x8_t abs = vdupq_n_u16(0x7fff);
  uint16x8_t m = vdupq_n_u16(0);
  for (int64_t i = 0; i < n; i += 8) m = vmaxq_u16(m, vandq_u16(vld1q_u16(p + i), abs));
  return vmaxvq_u16(m);
}

// The same for fp32 words (n a multiple of 8).
inline uint32_t abs_max_bits32(const float* p, int64_t n) {
  const uint32x4_t abs = vdupq_n_u32(0x7fffffff);
  uint32x4_t m0 = vdupq_n_u32(0), m1 = vdupq_n_u32(0);
  for (int64_t i = 0; i < n; i += 8) {
    m0 = vmaxq_u32(m0, vandq_u32(vreinterpretq_u32_f32(vld1q_f32(p + i)), abs));
    m1 = vmaxq_u32(m1, vandq_u32(vreinterpretq_u32_f32(vld1q_f32(p + i + 4)), abs));
  }
  return vmaxvq_u32(vmaxq_u32(m0, m1));
}

// 8 elements at x[i] as two fp32 vectors (exact conversions, fp16 subnormals included).
template <int64_t DT>
inline void load8_neon(const void* x, int64_t i, float32x4_t& lo, float32x4_t& hi) {
  if constexpr (DT == kF32) {
    lo = vld1q_f32(static_cast<const float*>(x) + i);
    hi = vld1q_f32(static_cast<const float*>(x) + i + 4);
  } else {
    const uint16x8_t h = vld1q_u16(static_cast<const uint16_t*>(x) + i);
    if constexpr (DT == kBF16) {
      lo = vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(h), 16));
      hi = vreinterpretq_f32_u32(vshll_high_n_u16(h, 16));
    } else {
      const float16x8_t f = vreinterpretq_f16_u16(h);
      lo = vcvt_f32_f16(vget_low_f16(f));
      hi = vcvt_high_f32_f16(f);
    }
  }
}

// quant_one on 4 lanes: the code of each quotient y as an int32 (its low byte is the code).
template <bool FP8>
inline int32x4_t code4_neon(float32x4_t y) {
  const uint32x4_t nan = vmvnq_u32(vceqq_f32(y, y));
  const uint32x4_t sign_byte = vandq_u32(vshrq_n_u32(vreinterpretq_u32_f32(y), 24), vdupq_n_u32(0x80));
  if constexpr (FP8) {  // e4m3_one of the clamped quotient; NaN lanes get nan_code's 0x7f | sign
    const float32x4_t c = vminq_f32(vmaxq_f32(y, vdupq_n_f32(-448.0f)), vdupq_n_f32(448.0f));
    const uint32x4_t a = vandq_u32(vreinterpretq_u32_f32(c), vdupq_n_u32(0x7fffffff));
    const uint32x4_t sign = vandq_u32(vshrq_n_u32(vreinterpretq_u32_f32(c), 24), vdupq_n_u32(0x80));
    const uint32x4_t odd = vandq_u32(vshrq_n_u32(a, 20), vdupq_n_u32(1));
    const uint32x4_t r = vaddq_u32(a, vaddq_u32(vdupq_n_u32(0x7ffff), odd));
    const uint32x4_t normal = vsubq_u32(vshrq_n_u32(r, 20), vdupq_n_u32(120 << 3));
    const float32x4_t af = vreinterpretq_f32_u32(a);
    const uint32x4_t tiny = vcltq_f32(af, vdupq_n_f32(0.015625f));
    // below 2^-6: the RNE integer of |y| * 512 (exact product), as e4m3_one's nearbyint
    const uint32x4_t sub = vreinterpretq_u32_s32(vcvtnq_s32_f32(vmulq_f32(af, vdupq_n_f32(512.0f))));
    const uint32x4_t code = vorrq_u32(vbslq_u32(tiny, sub, normal), sign);
    return vreinterpretq_s32_u32(vbslq_u32(nan, vorrq_u32(sign_byte, vdupq_n_u32(0x7f)), code));
  } else {  // clamp then round half to even (equal to round then clamp: both monotone); NaN: 0
    (void)sign_byte;
    const float32x4_t c = vminq_f32(vmaxq_f32(y, vdupq_n_f32(-128.0f)), vdupq_n_f32(127.0f));
    return vreinterpretq_s32_u32(vbicq_u32(vreinterpretq_u32_s32(vcvtnq_s32_f32(c)), nan));
  }
}
#endif

// What a group's codes need from its first pass over the group: the scale and which
// conversion is exact for it.
struct GroupPlan {
  float s = 0.0f;
  bool in_range = false;    // finite group, normal scale: no clamp needed (see below)
  bool all_normal = false;  // fp8: every quotient is normal in e4m3
};

template <int64_t DT, bool FP8>
GroupPlan plan_group(const void* x, int64_t begin, int64_t len, float eps, bool ue8m0) {
  const float qmax = FP8 ? 448.0f : 127.0f;
  int64_t i = 0;
  float amax = 0.0f;
#ifdef PA_AVX2
  // |x| as integers: non-negative floats order like their bit patterns and inf and NaN sit above
  // every finite value, so one unsigned max is the abs-max, NaN included as in the reference's
  // amax (a float max drops a NaN that comes before a number), and says whether the group is
  // finite
  const __m256i abs_bits = _mm256_set1_epi32(0x7fffffff);
  __m256i vmax0 = _mm256_setzero_si256(), vmax1 = _mm256_setzero_si256();
  // fp8 also wants the abs-min: a group whose smallest quotient is normal in e4m3 (nearly all)
  // skips the per-vector test for the fixed-point range (and takes the cheaper conversion)
  __m256i vmin = _mm256_set1_epi32(-1);
#ifdef PA_AVX512
  {
    const __m512i abs16 = _mm512_set1_epi32(0x7fffffff);
    __m512i wmax = _mm512_setzero_si512(), wmin = _mm512_set1_epi32(-1);
    if constexpr (DT == kBF16) {
      // in 16-bit lanes; a word pair's max (min) then moves to the high half of its 32-bit
      // lane, where an fp32 keeps its bf16 bits
      __m512i hmax, hmin;
      i = len / 32 * 32;
      abs_max_min_bf16<FP8>(static_cast<const uint16_t*>(x) + begin, i, hmax, hmin);
      const __m512i low = _mm512_set1_epi32(0xffff);
      wmax = _mm512_slli_epi32(
          _mm512_max_epu32(_mm512_and_si512(hmax, low), _mm512_srli_epi32(hmax, 16)), 16);
      if constexpr (FP8)
        wmin = _mm512_slli_epi32(
            _mm512_min_epu32(_mm512_and_si512(hmin, low), _mm512_srli_epi32(hmin, 16)), 16);
    }
    for (; i + 16 <= len; i += 16) {
      const __m512i a0 = _mm512_and_si512(_mm512_castps_si512(load16<DT>(x, begin + i)), abs16);
      wmax = _mm512_max_epu32(wmax, a0);
      if constexpr (FP8) wmin = _mm512_min_epu32(wmin, a0);
    }
    // fold into the 8-lane accumulators, which take any rest
    vmax0 = _mm256_max_epu32(_mm512_castsi512_si256(wmax), _mm512_extracti64x4_epi64(wmax, 1));
    vmin = _mm256_min_epu32(_mm512_castsi512_si256(wmin), _mm512_extracti64x4_epi64(wmin, 1));
  }
#endif
  if constexpr (DT == kBF16) {
    // bf16 pairs in 32-bit words: |even| is the word shifted left by 16 and masked, |odd| the
    // word with its low half and sign cleared; the order of the lanes does not matter for a max
    const __m256i odd_abs = _mm256_set1_epi32(0x7fff0000);
    for (; i + 16 <= len; i += 16) {
      const __m256i w = _mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(x) + begin + i));
      const __m256i even = _mm256_and_si256(_mm256_slli_epi32(w, 16), abs_bits);
      const __m256i odd = _mm256_and_si256(w, odd_abs);
      vmax0 = _mm256_max_epu32(vmax0, even);
      vmax1 = _mm256_max_epu32(vmax1, odd);
      if constexpr (FP8) vmin = _mm256_min_epu32(vmin, _mm256_min_epu32(even, odd));
    }
  }
  auto abs8 = [&](int64_t at) {
    return _mm256_and_si256(_mm256_castps_si256(load8<DT>(x, begin + at)), abs_bits);
  };
  for (; i + 16 <= len; i += 16) {  // two chains
    const __m256i a0 = abs8(i), a1 = abs8(i + 8);
    vmax0 = _mm256_max_epu32(vmax0, a0);
    vmax1 = _mm256_max_epu32(vmax1, a1);
    if constexpr (FP8) vmin = _mm256_min_epu32(vmin, _mm256_min_epu32(a0, a1));
  }
  for (; i + 8 <= len; i += 8) {
    const __m256i a0 = abs8(i);
    vmax0 = _mm256_max_epu32(vmax0, a0);
    if constexpr (FP8) vmin = _mm256_min_epu32(vmin, a0);
  }
  amax = bits_to_f32(reduce_max_epu32(_mm256_max_epu32(vmax0, vmax1)));
  // over the elements the vector loop of emit_group converts; int8 has no use for it
  const uint32_t amin_bits = FP8 ? reduce_min_epu32(vmin) : 0xffffffffu;
#elif defined(PA_NEON)
  // the abs-max as integers, as the AVX2 path (NaN included, as the scalar loop keeps it)
  i = len / 8 * 8;
  if (i > 0) {
    if constexpr (DT == kF32) {
      amax = bits_to_f32(abs_max_bits32(static_cast<const float*>(x) + begin, i));
    } else {
      const uint16_t h = abs_max_bits16(static_cast<const uint16_t*>(x) + begin, i);
      amax = DT == kBF16 ? bits_to_f32(static_cast<uint32_t>(h) << 16) : half_to_f32(h);
    }
  }
#endif
  for (; i < len; ++i) {  // NaN sticks, as above
    const float a = std::fabs(load_one(x, DT, begin + i));
    if (a > amax || std::isnan(a)) amax = a;
  }
  GroupPlan plan;
  plan.s = group_scale(amax, eps, qmax, ue8m0);
#ifdef PA_AVX2
  // A finite group with a normal scale has |x / s| <= qmax (1 + 2^-23): the conversion rounds
  // that to qmax in both formats, so the clamp can only matter elsewhere and is skipped. A
  // subnormal s carries a large relative error, so the quotient
  // could pass qmax there: that and non-finite groups keep the clamp.
  plan.in_range = std::isfinite(amax) && plan.s >= 0x1p-126f;
  // every quotient of the vector loop is RN(x / s) >= RN(amin / s) (monotone): none is in fp8's
  // fixed-point range when amin >= s * 2^-6 (exact for s >= 2^-100), which implies
  // RN(amin / s) >= 2^-6 without a second division on the group's serial path (the rare
  // group that only the rounding lifts to 2^-6 takes the general conversion, also exact).
  // False for an empty loop's all-ones amin, a NaN.
  plan.all_normal = FP8 && plan.in_range && plan.s >= 0x1p-100f &&
                    bits_to_f32(amin_bits) >= plan.s * 0x1p-6f;
#endif
  return plan;
}

template <int64_t DT, bool FP8>
void emit_group(const void* x, int64_t begin, int64_t len, const GroupPlan& plan, bool stream,
                uint8_t* q) {
  const float s = plan.s;
  int64_t i = 0;
#ifdef PA_AVX2
  const bool in_range = plan.in_range, all_normal = plan.all_normal;
  const __m256 vs = _mm256_set1_ps(s);
  // int8: clamping before the conversion equals rounding then clamping (both monotone), and
  // _mm256_cvtps_epi32 rounds half to even.
  auto code8 = [&](int64_t at) -> __m256i {
    const __m256 y = _mm256_div_ps(load8<DT>(x, begin + at), vs);  // IEEE division
    if (all_normal) return e4m3_normal_8(y);
    if (in_range) {
      if constexpr (FP8) return e4m3_8(y);
      return _mm256_cvtps_epi32(y);
    }
    // the clamped conversion (max_ps turns a NaN into the bound), NaN lanes as nan_code has them
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(y, y, _CMP_UNORD_Q));
    if constexpr (FP8) {
      const __m256i code = e4m3_8(_mm256_min_ps(_mm256_max_ps(y, _mm256_set1_ps(-448.0f)),
                                                _mm256_set1_ps(448.0f)));
      const __m256i nan_bits = _mm256_or_si256(
          _mm256_and_si256(_mm256_srli_epi32(_mm256_castps_si256(y), 24), _mm256_set1_epi32(0x80)),
          _mm256_set1_epi32(0x7f));
      return _mm256_blendv_epi8(code, nan_bits, nan);
    }
    return _mm256_andnot_si256(nan, _mm256_cvtps_epi32(_mm256_min_ps(
                                        _mm256_max_ps(y, _mm256_set1_ps(-128.0f)),
                                        _mm256_set1_ps(127.0f))));
  };
#ifdef PA_AVX512
  {
    const __m512 ws = _mm512_set1_ps(s);
    auto code_of = [&](__m512 v) -> __m512i {  // code8 on 16 lanes
      const __m512 y = _mm512_div_ps(v, ws);   // IEEE division
      if (all_normal) return e4m3_normal_16(y);
      if (in_range) {
        if constexpr (FP8) return e4m3_16(y);
        return _mm512_cvtps_epi32(y);
      }
      const __mmask16 nan = _mm512_cmp_ps_mask(y, y, _CMP_UNORD_Q);  // as code8
      if constexpr (FP8) {
        const __m512i code = e4m3_16(_mm512_min_ps(_mm512_max_ps(y, _mm512_set1_ps(-448.0f)),
                                                   _mm512_set1_ps(448.0f)));
        const __m512i nan_bits = _mm512_or_si512(
            _mm512_and_si512(_mm512_srli_epi32(_mm512_castps_si512(y), 24),
                             _mm512_set1_epi32(0x80)),
            _mm512_set1_epi32(0x7f));
        return _mm512_mask_blend_epi32(nan, code, nan_bits);
      }
      return _mm512_maskz_mov_epi32(
          static_cast<__mmask16>(~nan),
          _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(y, _mm512_set1_ps(-128.0f)),
                                           _mm512_set1_ps(127.0f))));
    };
    auto code16 = [&](int64_t at) { return code_of(load16<DT>(x, begin + at)); };
#ifdef PA_AVX512_VBMI
    if constexpr (DT == kBF16) {
      // 64 elements from two loads split into even and odd lanes, their codes packed to bytes
      // and put back in order by one permute, one 64-byte store
      const __m512i order = _mm512_load_si512(kInterleave.idx);
      const uint16_t* xb = static_cast<const uint16_t*>(x) + begin;
      for (; i + 64 <= len; i += 64) {
        __m512 e0, o0, e1, o1;
        split_bf16(xb + i, e0, o0);
        split_bf16(xb + i + 32, e1, o1);
        const __m512i ab = _mm512_packs_epi32(code_of(e0), code_of(o0));
        const __m512i cd = _mm512_packs_epi32(code_of(e1), code_of(o1));
        const __m512i bytes = FP8 ? _mm512_packus_epi16(ab, cd) : _mm512_packs_epi16(ab, cd);
        store64(q + begin + i, _mm512_permutexvar_epi8(order, bytes), stream);
      }
    }
#endif
    // fp8 from fp16 / fp32 (and bf16 without VBMI): 64 codes (all in [0, 255]) to bytes by two
    // packs and one lane fix-up, one 64-byte store. int8 keeps the saturating narrow of 16 lanes
    // (its lanes are in [-128, 127], saturation never acts).
    if constexpr (FP8) {
      const __m512i order =
          _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
      for (; i + 64 <= len; i += 64) {
        const __m512i ab = _mm512_packs_epi32(code16(i), code16(i + 16));
        const __m512i cd = _mm512_packs_epi32(code16(i + 32), code16(i + 48));
        const __m512i bytes = _mm512_packus_epi16(ab, cd);
        store64(q + begin + i, _mm512_permutexvar_epi32(order, bytes), stream);
      }
    }
    for (; i + 16 <= len; i += 16) {
      const __m128i bytes =
          FP8 ? _mm512_cvtepi32_epi8(code16(i)) : _mm512_cvtsepi32_epi8(code16(i));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + begin + i), bytes);
    }
  }
#endif
  for (; i + 32 <= len; i += 32)
    store32_bytes(code8(i), code8(i + 8), code8(i + 16), code8(i + 24), FP8, q + begin + i);
  for (; i + 8 <= len; i += 8) store8_low_bytes(code8(i), q + begin + i);
#elif defined(PA_NEON)
  (void)stream;
  const float32x4_t vs = vdupq_n_f32(s);
  for (; i + 8 <= len; i += 8) {
    float32x4_t lo, hi;
    load8_neon<DT>(x, begin + i, lo, hi);
    const int32x4_t c0 = code4_neon<FP8>(vdivq_f32(lo, vs));  // IEEE division
    const int32x4_t c1 = code4_neon<FP8>(vdivq_f32(hi, vs));
    const uint16x8_t h = vcombine_u16(vmovn_u32(vreinterpretq_u32_s32(c0)),
                                      vmovn_u32(vreinterpretq_u32_s32(c1)));
    vst1_u8(q + begin + i, vmovn_u16(h));  // the low byte of each code
  }
#else
  (void)stream;
#endif
  for (; i < len; ++i) q[begin + i] = quant_one(load_one(x, DT, begin + i), s, FP8);
}

#ifdef PA_AVX512_VBMI
// The 16-bit lanes of 16 vectors (one per group) reduced to one 32-bit lane per group, in group
// order, by a transposing tree (about 55 operations for the 16, instead of about 16 each).
template <bool kMax>
inline __m512i reduce_16_epu16(const __m512i (&v)[16]) {
  auto op16 = [](__m512i a, __m512i b) {
    return kMax ? _mm512_max_epu16(a, b) : _mm512_min_epu16(a, b);
  };
  __m512i w[8], u[4], r[2];
  for (int i = 0; i < 8; ++i)  // 256-bit halves: groups 2i | 2i + 1
    w[i] = op16(_mm512_shuffle_i64x2(v[2 * i], v[2 * i + 1], 0x44),
                _mm512_shuffle_i64x2(v[2 * i], v[2 * i + 1], 0xee));
  for (int i = 0; i < 4; ++i)  // 128-bit lane L: group 4i + L
    u[i] = op16(_mm512_shuffle_i64x2(w[2 * i], w[2 * i + 1], 0x88),
                _mm512_shuffle_i64x2(w[2 * i], w[2 * i + 1], 0xdd));
  for (int i = 0; i < 2; ++i)  // lane L, qword 0: group 8i + L, qword 1: group 8i + 4 + L
    r[i] = op16(_mm512_unpacklo_epi64(u[2 * i], u[2 * i + 1]),
                _mm512_unpackhi_epi64(u[2 * i], u[2 * i + 1]));
  // each qword's two dwords combined (both then hold it), then lane L, dwords 0-3: groups L,
  // 4 + L, 8 + L, 12 + L, each as two 16-bit partials
  for (int i = 0; i < 2; ++i) r[i] = op16(r[i], _mm512_shuffle_epi32(r[i], _MM_PERM_CDAB));
  const __m512i s = _mm512_castps_si512(
      _mm512_shuffle_ps(_mm512_castsi512_ps(r[0]), _mm512_castsi512_ps(r[1]), 0x88));
  const __m512i lo = _mm512_and_si512(s, _mm512_set1_epi32(0xffff));
  const __m512i hi = _mm512_srli_epi32(s, 16);
  const __m512i d = kMax ? _mm512_max_epu32(lo, hi) : _mm512_min_epu32(lo, hi);
  return _mm512_permutexvar_epi32(
      _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), d);
}

// plan_group for 16 consecutive bf16 groups of a multiple of 32 elements: the abs-max (and for
// fp8 the abs-min, over all of a group: emit_group converts every element in vector loops) of
// each group in 16-bit lanes, reduced together, then the scales and range tests in one vector
// each, so that planning does not dominate the serial path of a group at a time.
template <bool FP8>
void plan_16_bf16(const uint16_t* x, int64_t group, float eps, bool ue8m0, GroupPlan* plans) {
  __m512i hmax[16], hmin[16];
  for (int g = 0; g < 16; ++g) abs_max_min_bf16<FP8>(x + g * group, group, hmax[g], hmin[g]);
  const __m512i amax_bits = _mm512_slli_epi32(reduce_16_epu16<true>(hmax), 16);
  const __m512 amax = _mm512_castsi512_ps(amax_bits);
  alignas(64) float s[16];
  if (ue8m0) {
    alignas(64) float a[16];
    _mm512_store_ps(a, amax);
    for (int g = 0; g < 16; ++g) s[g] = group_scale(a[g], eps, FP8 ? 448.0f : 127.0f, true);
  } else {  // max(amax, eps) keeps a NaN amax, as std::max(amax, eps) does
    _mm512_store_ps(s, _mm512_div_ps(_mm512_max_ps(_mm512_set1_ps(eps), amax),
                                     _mm512_set1_ps(FP8 ? 448.0f : 127.0f)));
  }
  const __m512 vs = _mm512_load_ps(s);
  // in_range and all_normal as plan_group states them
  const __mmask16 in_range =
      _mm512_cmplt_epu32_mask(amax_bits, _mm512_set1_epi32(0x7f800000)) &
      _mm512_cmp_ps_mask(vs, _mm512_set1_ps(0x1p-126f), _CMP_GE_OQ);
  __mmask16 all_normal = 0;
  if constexpr (FP8) {
    const __m512 amin = _mm512_castsi512_ps(_mm512_slli_epi32(reduce_16_epu16<false>(hmin), 16));
    all_normal = in_range & _mm512_cmp_ps_mask(vs, _mm512_set1_ps(0x1p-100f), _CMP_GE_OQ) &
                 _mm512_cmp_ps_mask(amin, _mm512_mul_ps(vs, _mm512_set1_ps(0x1p-6f)), _CMP_GE_OQ);
  }
  for (int g = 0; g < 16; ++g)
    plans[g] = GroupPlan{s[g], ((in_range >> g) & 1) != 0, ((all_normal >> g) & 1) != 0};
}
#endif

#if defined(PA_AVX2) && !defined(PA_AVX512_VBMI)
// plan_16_bf16 for 8 groups of a multiple of 16 elements in 256-bit vectors, for AVX2 builds
// (and AVX-512 without VBMI): the abs-max and abs-min in 16-bit lanes (one AND per 16 bf16
// instead of plan_group's shift and two ANDs on even and odd halves), 8 groups reduced together
// by one transposing tree, their scales in one division.
template <bool FP8>
void plan_8_bf16(const uint16_t* x, int64_t group, float eps, bool ue8m0, GroupPlan* plans) {
  const __m256i abs_w = _mm256_set1_epi16(0x7fff);
  __m256i hmax[8], hmin[8];
  for (int g = 0; g < 8; ++g) {
    const uint16_t* p = x + g * group;
    hmax[g] = hmin[g] = _mm256_and_si256(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)), abs_w);
    for (int64_t i = 16; i < group; i += 16) {
      const __m256i a =
          _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i)), abs_w);
      hmax[g] = _mm256_max_epu16(hmax[g], a);
      if constexpr (FP8) hmin[g] = _mm256_min_epu16(hmin[g], a);
    }
  }
  // 16 lanes of 16 bits per group -> one 32-bit lane per group, in group order
  auto reduce = [](const __m256i (&v)[8], auto op16, auto op32) {
    __m256i w[4], u[2], t[2];
    for (int i = 0; i < 4; ++i)  // 128-bit lane L: group 2i + L folded to 8 lanes
      w[i] = op16(_mm256_permute2x128_si256(v[2 * i], v[2 * i + 1], 0x20),
                  _mm256_permute2x128_si256(v[2 * i], v[2 * i + 1], 0x31));
    for (int i = 0; i < 2; ++i)  // lane L, qword 0: group 4i + L, qword 1: group 4i + 2 + L
      u[i] = op16(_mm256_unpacklo_epi64(w[2 * i], w[2 * i + 1]),
                  _mm256_unpackhi_epi64(w[2 * i], w[2 * i + 1]));
    for (int i = 0; i < 2; ++i)  // both dwords of a qword: its group as two 16-bit partials
      t[i] = op16(u[i], _mm256_shuffle_epi32(u[i], 0xb1));
    // dwords: lane 0 groups 0 4 2 6, lane 1 groups 1 5 3 7
    const __m256i d = _mm256_blend_epi32(t[0], t[1], 0xaa);
    const __m256i r =
        op32(_mm256_and_si256(d, _mm256_set1_epi32(0xffff)), _mm256_srli_epi32(d, 16));
    return _mm256_permutevar8x32_epi32(r, _mm256_setr_epi32(0, 4, 2, 6, 1, 5, 3, 7));
  };
  const __m256i amax_bits = _mm256_slli_epi32(
      reduce(hmax, [](__m256i a, __m256i b) { return _mm256_max_epu16(a, b); },
             [](__m256i a, __m256i b) { return _mm256_max_epu32(a, b); }),
      16);
  const __m256 amax = _mm256_castsi256_ps(amax_bits);
  const float qmax = FP8 ? 448.0f : 127.0f;
  alignas(32) float s[8];
  if (ue8m0) {
    alignas(32) float a[8];
    _mm256_store_ps(a, amax);
    for (int g = 0; g < 8; ++g) s[g] = group_scale(a[g], eps, qmax, true);
  } else {  // max(amax, eps) keeps a NaN amax (the second operand), as std::max(amax, eps) does
    _mm256_store_ps(s, _mm256_div_ps(_mm256_max_ps(_mm256_set1_ps(eps), amax),
                                     _mm256_set1_ps(qmax)));
  }
  const __m256 vs = _mm256_load_ps(s);
  // in_range and all_normal as plan_group states them; amax_bits < 0x7f800000 as signed
  // integers is the same test (both below 2^31)
  const int in_range =
      _mm256_movemask_ps(_mm256_castsi256_ps(
          _mm256_cmpgt_epi32(_mm256_set1_epi32(0x7f800000), amax_bits))) &
      _mm256_movemask_ps(_mm256_cmp_ps(vs, _mm256_set1_ps(0x1p-126f), _CMP_GE_OQ));
  int all_normal = 0;
  if constexpr (FP8) {
    const __m256 amin = _mm256_castsi256_ps(_mm256_slli_epi32(
        reduce(hmin, [](__m256i a, __m256i b) { return _mm256_min_epu16(a, b); },
               [](__m256i a, __m256i b) { return _mm256_min_epu32(a, b); }),
        16));
    all_normal =
        in_range & _mm256_movemask_ps(_mm256_cmp_ps(vs, _mm256_set1_ps(0x1p-100f), _CMP_GE_OQ)) &
        _mm256_movemask_ps(
            _mm256_cmp_ps(amin, _mm256_mul_ps(vs, _mm256_set1_ps(0x1p-6f)), _CMP_GE_OQ));
  }
  for (int g = 0; g < 8; ++g)
    plans[g] = GroupPlan{s[g], ((in_range >> g) & 1) != 0, ((all_normal >> g) & 1) != 0};
}
#endif

// Groups a thread takes at a time, at most (fewer when there are too few groups to keep every
// thread busy, as per-token scales of a decode step have): plan_16_bf16 (AVX-512 VBMI) or
// plan_8_bf16 (other x86 builds) plans a batch together where it serves it (the codes follow,
// with the next batch's input prefetched meanwhile), else plan_group plans each group in turn.
// Measured: docs/measurements/cpu-arm-acl/2026-12-03-zen4.md, 2026-12-03-zen3.md.
constexpr int64_t kPlanBatch = 16;

// Where a thread's scales go. Row-major: straight to scales[row, g]. Column-major (s_row == 1):
// a row's scales fall in `groups` different lines, so each scale was a store to a line the
// stream of codes had pushed out of L1. The scales of a band of 16 rows (a 64-byte line per
// group) are gathered here and written as runs, whole lines streamed when the codes are
// (measured: docs/measurements/cpu-arm-acl/2026-12-04-zen5.md).
class ScaleSink {
 public:
  ScaleSink(float* scales, int64_t s_row, int64_t s_col, int64_t groups, bool stream)
      : scales_(scales), s_row_(s_row), s_col_(s_col), groups_(groups),
        banded_(s_row == 1 && s_col != 1), stream_(stream) {
    if (banded_) band_.resize(static_cast<size_t>(groups * kBand));
  }
  ScaleSink(const ScaleSink&) = delete;
  ScaleSink& operator=(const ScaleSink&) = delete;
  ~ScaleSink() { flush(); }

  void put(int64_t row, int64_t g, float s) {
    if (!banded_) {
      scales_[row * s_row_ + g * s_col_] = s;
      return;
    }
    const int64_t t = row * groups_ + g;  // a thread's t ascend without gaps
    if (t_lo_ < 0 || row - row % kBand != band_row_) {
      flush();
      band_row_ = row - row % kBand;
      t_lo_ = t;
    }
    t_hi_ = t;
    band_[static_cast<size_t>(g * kBand + row % kBand)] = s;
  }

  // The band's groups t_lo..t_hi: full rows between the first and the last, which may be
  // partial (another thread holds the rest of a row split between two threads' ranges).
  void flush() {
    if (!banded_ || t_lo_ < 0) return;
    const int64_t lo = t_lo_ / groups_, hi = t_hi_ / groups_;
    const int64_t g_first = t_lo_ % groups_, g_last = t_hi_ % groups_;
    for (int64_t g = 0; g < groups_; ++g) {
      const int64_t r0 = lo + (g < g_first ? 1 : 0), r1 = hi - (g > g_last ? 1 : 0);
      if (r1 < r0) continue;
      float* dst = scales_ + r0 + g * s_col_;
      const float* src = band_.data() + g * kBand + (r0 - band_row_);
#ifdef PA_AVX512
      // a whole aligned line: streamed with the codes (the caller fences both)
      if (stream_ && r1 - r0 + 1 == kBand && (reinterpret_cast<uintptr_t>(dst) & 63) == 0) {
        _mm512_stream_ps(dst, _mm512_loadu_ps(src));
        continue;
      }
#endif
      std::memcpy(dst, src, static_cast<size_t>(r1 - r0 + 1) * sizeof(float));
    }
    t_lo_ = t_hi_ = -1;
  }

 private:
  static constexpr int64_t kBand = 16;  // fp32 scales per 64-byte line
  float* scales_;
  int64_t s_row_, s_col_, groups_;
  bool banded_, stream_;
  std::vector<float> band_;
  int64_t band_row_ = 0, t_lo_ = -1, t_hi_ = -1;
};

template <int64_t DT, bool FP8>
void quant_rows(const void* x, int64_t m, int64_t k, int64_t group, float eps, bool ue8m0,
                bool stream, uint8_t* out, float* scales, int64_t s_row, int64_t s_col,
                int64_t batch, int nthr) {
  const int64_t groups = k / group, total = m * groups;
  const int64_t batches = (total + batch - 1) / batch;
  const int64_t group_bytes = group * (DT == kF32 ? 4 : 2);
  const char* x_end = static_cast<const char*>(x) + total * group_bytes;
#pragma omp parallel num_threads(nthr)
  {
    ScaleSink sink(scales, s_row, s_col, groups, stream);  // a static schedule: rows ascend per thread
#pragma omp for schedule(static) nowait
    for (int64_t c = 0; c < batches; ++c) {
      // the groups are consecutive in x and q: group t starts at element t * group
      const int64_t t0 = c * batch, n = std::min(batch, total - t0);
      GroupPlan plans[kPlanBatch];
      int64_t planned = 0;
#ifdef PA_AVX512_VBMI
      if (DT == kBF16 && group % 32 == 0 && n == kPlanBatch) {
        plan_16_bf16<FP8>(static_cast<const uint16_t*>(x) + t0 * group, group, eps, ue8m0, plans);
        planned = n;
      }
#endif
#if defined(PA_AVX2) && !defined(PA_AVX512_VBMI)
      if (DT == kBF16 && group % 16 == 0)
        for (; planned + 8 <= n; planned += 8)
          plan_8_bf16<FP8>(static_cast<const uint16_t*>(x) + (t0 + planned) * group, group, eps,
                           ue8m0, plans + planned);
#endif
      for (; planned < n; ++planned)
        plans[planned] = plan_group<DT, FP8>(x, (t0 + planned) * group, group, eps, ue8m0);
      // the next batch's input, a group's worth per group converted, so that the next batch is
      // not planned from memory
      const char* next = static_cast<const char*>(x) + (t0 + n) * group_bytes;
      for (int64_t b = 0; b < n; ++b) {
        const int64_t t = t0 + b;
        for (int64_t o = b * group_bytes; o < (b + 1) * group_bytes; o += 64)
          if (next + o < x_end) __builtin_prefetch(next + o, 0, 3);
        sink.put(t / groups, t % groups, plans[b].s);
        emit_group<DT, FP8>(x, t * group, group, plans[b], stream, out);
      }
    }
    sink.flush();
#ifdef PA_AVX512
    // streamed stores are weakly ordered: fence them before the region's closing barrier
    if (stream) _mm_sfence();
#endif
  }
}

}  // namespace

const char* group_quant_isa() {
#if defined(PA_AVX512)
  return "avx512";
#elif defined(PA_AVX2)
  return "avx2";
#elif defined(PA_NEON)
  return "neon";
#else
  return "scalar";
#endif
}

void group_quant(const void* x, int64_t x_dt, int64_t m, int64_t k, int64_t group, bool fp8,
                 float eps, bool ue8m0, bool stream, void* q, float* scales, int64_t s_row,
                 int64_t s_col, int64_t threads) {
  const int64_t groups = k / group, total = m * groups;
  auto* out = static_cast<uint8_t*>(q);
  // no more threads than groups: a decode step's single row must not wake (and wait for) idle
  // threads, which costs more than the row itself
#ifdef _OPENMP
  const int64_t want = threads > 0 ? threads : omp_get_max_threads();
#else
  const int64_t want = 1;  // built without OpenMP (the emulated-Arm test's driver): one thread
#endif
  const int64_t batch = std::clamp<int64_t>(total / std::max<int64_t>(want, 1), 1, kPlanBatch);
  const int nthr =
      static_cast<int>(std::max<int64_t>(1, std::min(want, (total + batch - 1) / batch)));
  auto run = [&](auto dt, auto fp8_tag) {
    quant_rows<decltype(dt)::value, decltype(fp8_tag)::value>(
        x, m, k, group, eps, ue8m0, stream, out, scales, s_row, s_col, batch, nthr);
  };
  auto with_dtype = [&](auto fp8_tag) {
    switch (x_dt) {
      case kBF16: return run(std::integral_constant<int64_t, kBF16>{}, fp8_tag);
      case kF16: return run(std::integral_constant<int64_t, kF16>{}, fp8_tag);
      default: return run(std::integral_constant<int64_t, kF32>{}, fp8_tag);
    }
  };
  if (fp8)
    with_dtype(std::true_type{});
  else
    with_dtype(std::false_type{});
}

}  // namespace pa_onednn
