// Portable panel microkernels over torch's at::vec (NEON on aarch64, compiler-vectorised code
// elsewhere): the same layouts and fp32 products as the AVX2 ones (panel_isa.h). bf16 and
// fp16 (widened per k block), fp32; int8 without an exact kernel here is left to oneDNN (exact on Arm).
#include <ATen/cpu/vec/vec.h>
#include <c10/util/Half.h>

#include <cstring>

#include "panel_isa.h"

namespace pa_onednn::panel {
namespace {

using FVec = at::vec::Vectorized<float>;
constexpr int kV = FVec::size();
static_assert(16 % kV == 0, "a panel row (16 columns) must be whole vectors");
constexpr int kRow = 16 / kV;  // vectors per panel row

template <int MR>
void tile(int64_t kc, const float* x, const float* w, float* acc, bool add) {
  FVec c[MR][kRow];
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < kRow; ++v) c[r][v] = add ? FVec::loadu(acc + r * 16 + v * kV) : FVec(0.0f);
  for (int64_t k = 0; k < kc; ++k) {
    FVec wv[kRow];
    for (int v = 0; v < kRow; ++v) wv[v] = FVec::loadu(w + k * 16 + v * kV);
    for (int r = 0; r < MR; ++r) {
      const FVec xb(x[k * MR + r]);
      for (int v = 0; v < kRow; ++v) c[r][v] = at::vec::fmadd(xb, wv[v], c[r][v]);
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < kRow; ++v) c[r][v].store(acc + r * 16 + v * kV);
}

void tile_rows(int mr, int64_t kc, const float* x, const float* w, float* acc, bool add) {
  switch (mr) {
    case 1: return tile<1>(kc, x, w, acc, add);
    case 2: return tile<2>(kc, x, w, acc, add);
    case 3: return tile<3>(kc, x, w, acc, add);
    case 4: return tile<4>(kc, x, w, acc, add);
    case 5: return tile<5>(kc, x, w, acc, add);
    default: return tile<6>(kc, x, w, acc, add);
  }
}

// Plain integer code that compilers vectorise on every ISA (at::vec's generic integer shifts
// and bit casts go through memory one lane at a time).
void widen_bf16(int64_t kc, const uint16_t* w, float* out) {
  for (int64_t k = 0; k < kc; ++k) {
    uint32_t words[8];
    std::memcpy(words, w + k * 16, sizeof(words));
    for (int j = 0; j < 8; ++j) {
      const uint32_t lo = words[j] << 16, hi = words[j] & 0xffff0000u;
      std::memcpy(out + k * 16 + j, &lo, 4);
      std::memcpy(out + k * 16 + 8 + j, &hi, 4);
    }
  }
}

void widen_f16(int64_t kc, const uint16_t* w, float* out) {
  for (int64_t i = 0; i < kc * 16; ++i) out[i] = c10::detail::fp16_ieee_to_fp32_value(w[i]);
}

// No widening in registers here: the driver widens each k block once and runs `tile`.
const Kernels kGeneric{
    "generic", nullptr, nullptr, tile_rows, tile_rows, widen_bf16, widen_f16, nullptr};

}  // namespace

const Kernels* generic_kernels() { return &kGeneric; }

}  // namespace pa_onednn::panel
