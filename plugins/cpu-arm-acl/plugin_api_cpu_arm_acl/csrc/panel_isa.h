// Panel GEMM microkernels, one table per ISA (panel_avx2.cpp, panel_generic.cpp), called by the
// driver in panel_gemm.cpp. No torch types: each ISA file stays a small translation unit.
//
// Weight layouts (built once by the pack_* functions in panel_gemm.cpp), 16 columns (output
// features) per panel, panels back to back, the last one zero-padded:
// - bf16: panel p is [K][16] 16-bit words; at step k, 32-bit word j (j < 8) holds column j in its
//   low half and column 8 + j in its high half. `word << 16` and `word & 0xffff0000` are then
//   the fp32 values of columns 0..7 and 8..15: two integer ops widen 16 weights, no shuffles.
// - fp16: panel p is [K][16] halves in column order (hardware conversions keep the order).
// - fp32: panel p is [K][16] floats in column order (64 bytes, one cache line, per k step).
// - int8: panel p is [ceil(K/2)][2][8][2] bytes: for k-pair q, half h and lane j, the bytes
//   w[16p + 8h + j][2q], w[16p + 8h + j][2q + 1]. Sign-extending 16 bytes to int16 gives 8 lanes
//   of (k, k+1) pairs for vpmaddwd / a widening dot product: int32 per lane, no saturation.
// Activations are packed per call in row groups of MR <= 6 rows: fp32 [K][MR] for bf16/fp16/fp32,
// int32 [ceil(K/2)][MR] words of two int16 (x[2q], x[2q+1]) for int8.
#pragma once

#include <cstdint>

namespace pa_onednn::panel {

constexpr int64_t kCols = 16;  // columns per panel
constexpr int kMaxRows = 6;    // rows per microkernel call: 2 x 6 accumulators + 3 = 15 registers

// acc[r][0..16) (+)= sum over k < kc of x[k][r] * w[k][0..16), r < mr (1..kMaxRows); `add`:
// accumulate onto acc, else overwrite it. acc is [mr][16] fp32, row-major. The weights are
// 16-bit (bf16 or fp16 panels, widened to fp32 in registers) or fp32 [kc][16] in column order:
// `f32` reads a k block widened into L1, `f32_panels` fp32 weights streamed from memory.
using HalfTile = void (*)(int mr, int64_t kc, const float* x, const uint16_t* w, float* acc,
                          bool add);
using F32Tile = void (*)(int mr, int64_t kc, const float* x, const float* w, float* acc, bool add);
// Widen kc steps of a bf16 or fp16 panel into fp32 [kc][16], column order.
using Widen = void (*)(int64_t kc, const uint16_t* w, float* out);
// int8: acc[r][0..16) (+)= sum over k-pairs q < kp of the exact int32 dot products.
using S8Tile = void (*)(int mr, int64_t kp, const int32_t* x, const int8_t* w, int32_t* acc,
                        bool add);

// One ISA's kernels. A null tile means "not in registers here": the driver widens each k block
// once (widen_*) and runs f32; a null s8 means no exact int8 kernel on this ISA.
struct Kernels {
  const char* name;
  HalfTile bf16;
  HalfTile f16;
  F32Tile f32;
  F32Tile f32_panels;
  Widen widen_bf16;
  Widen widen_f16;
  S8Tile s8;
};

// nullptr when not compiled for this machine (e.g. AVX2 on aarch64) or the CPU lacks the ISA.
const Kernels* avx2_kernels();
const Kernels* generic_kernels();

}  // namespace pa_onednn::panel
