// Interface between the torch bindings (bindings.cpp) and the kernels (matmul.cpp,
// group_quant.cpp). No torch and no oneDNN types here, so each translation unit stays small
// and the three compile in parallel.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace pa_onednn {

// Element types, as the Python side passes them.
enum Dt : int64_t { kNone = 0, kF32 = 1, kBF16 = 2, kS8 = 3, kF16 = 4 };

// One matmul problem: dst[m, n] = src[m, k] @ W[k, n] (W given as [n, k] row-major).
// Scaled (int8): dst = acc * w_scale[n] (+ bias[n]); the caller applies per-token scales.
struct MatmulConf {
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldc = 0;  // row strides of src and dst, in elements
  int64_t a = kNone, b = kNone, c = kNone, bias = kNone;
  bool scaled = false;
  int64_t threads = 0;  // OpenMP threads at creation and execution; 0 = the runtime's default
};

struct Packed;  // weights in the layout oneDNN chose (owns its buffer)
struct Matmul;  // a oneDNN matmul primitive and its descriptor

// Reorder w ([n, k] row-major, type conf.b) into the layout that the primitive for `conf`
// prefers (weights format `any`). w_scale ([n] fp32) is kept for scaled problems.
std::shared_ptr<Packed> pack_weights(const void* w, const float* w_scale, const MatmulConf& conf);
int64_t packed_bytes(const Packed& p);
std::string packed_layout(const Packed& p);

// A primitive for `conf` whose weights are in p's layout. Throws std::runtime_error when
// oneDNN has no implementation for it (the message names the problem).
std::shared_ptr<Matmul> make_matmul(const MatmulConf& conf, const Packed& p);
int64_t scratchpad_bytes(const Matmul& mm);
std::string impl_name(const Matmul& mm);
void run_matmul(const Matmul& mm, const Packed& p, const void* src, const void* bias, void* dst,
                void* scratchpad);

// oneDNN's version "major.minor.patch" and CPU runtime, from the loaded library.
std::string onednn_version();

// Per-token-group quantization (docs/ops.md): x [m, k] (type x_dt, contiguous) to q [m, k]
// (int8 or fp8 e4m3fn bytes), scales fp32 at scales[r * s_row + g * s_col].
void group_quant(const void* x, int64_t x_dt, int64_t m, int64_t k, int64_t group, bool fp8,
                 float eps, bool ue8m0, void* q, float* scales, int64_t s_row, int64_t s_col,
                 int64_t threads);

}  // namespace pa_onednn
