// Interface between the torch bindings (bindings.cpp) and the kernels (matmul.cpp,
// group_quant.cpp, panel_gemm.cpp). No torch and no oneDNN types here, so each translation unit
// stays small and they compile in parallel.
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
// prefers (weights format `any`), or a one-row problem's where a one-row call over the former
// would run reference code. w_scale ([n] fp32) is kept for scaled problems.
std::shared_ptr<Packed> pack_weights(const void* w, const float* w_scale, const MatmulConf& conf);
int64_t packed_bytes(const Packed& p);
// Whether p's memory asked for transparent huge pages and the kernel took the request.
bool packed_huge_pages(const Packed& p);
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
// (int8 or fp8 e4m3fn bytes), scales fp32 at scales[r * s_row + g * s_col]. stream: write the
// codes past the caches (for outputs too large to stay cached for their reader).
void group_quant(const void* x, int64_t x_dt, int64_t m, int64_t k, int64_t group, bool fp8,
                 float eps, bool ue8m0, bool stream, void* q, float* scales, int64_t s_row,
                 int64_t s_col, int64_t threads);
// The vector path group_quant was compiled with: "avx512", "avx2", "neon" or "scalar".
const char* group_quant_isa();

// Panel GEMMs (panel_gemm.cpp) for CPUs where oneDNN has no fitting kernel: bf16/fp16 weights
// kept 16-bit and widened to fp32 in registers (fp32 accumulation), fp32 weights, and exact int8
// (int32 accumulation without int16 saturation). Layouts: panel_isa.h.
enum PanelIsa : int64_t { kPanelGeneric = 0, kPanelAvx2 = 1 };
enum PanelWiden : int64_t { kWidenInRegisters = 0, kWidenTile = 1 };
// Panel-major: each panel runs all its k blocks (the x rows stream from cache per panel: few
// rows). Block-major: each k block runs over a chunk of panels, so that the x block stays in L2
// for all of them (many rows: the whole packed x would not).
enum PanelOrder : int64_t { kPanelMajor = 0, kBlockMajor = 1 };
constexpr int64_t kPanelMaxK8 = (int64_t{1} << 17) - 1;  // |sum of K int8 products| < 2^31

struct PanelConf {
  int64_t isa = kPanelGeneric;
  int64_t widen = kWidenInRegisters;  // 16-bit weights: in registers per row group, or per k block
  int64_t kc = 256;                    // k steps per block
  int64_t mc = 256;                    // rows per pass over the weight (bounds the x buffer)
  int64_t threads = 0;                 // 0: torch's thread count
  int64_t order = kPanelMajor;
};

struct PanelCall {
  int64_t m = 0, n = 0, k = 0, lda = 0, ldc = 0;
  int64_t w_dt = kBF16;     // weights (and x): kBF16, kF16, kF32 or kS8
  const void* x = nullptr;  // [m, k] of type w_dt, row stride lda
  const void* panels = nullptr;
  const float* bias = nullptr;     // [n] or nullptr
  const float* x_scale = nullptr;  // int8: [m]
  const float* w_scale = nullptr;  // int8: [n]
  void* out = nullptr;             // [m, n] of type out_dt, row stride ldc
  int64_t out_dt = kF32;           // kF32 or w_dt (int8: kF32, kBF16 or kF16)
};

// Small-M bf16 GEMV (gemv.cpp) straight on oneDNN's packed weights, where oneDNN packed them in
// its AVX-512 BF16 layout: blocks of 32 k x 64 n, each [16 k-pairs][64 n][2 k] (inner blocks
// 16@k x 64@n x 2@k), so a k-pair step is four vectors of 16 columns x (k, k + 1), the operands
// of vdpbf16ps. oneDNN's brgemm reads that layout at 71 GB/s at M = 1-4 on a 2-core Zen 5 (84%
// of the copy rate); a plain loop with a prefetch one kilobyte ahead read it at 84-90 GB/s.
struct PairedBlocks {
  const uint16_t* base = nullptr;  // null: the packed weights have another layout
  int64_t n = 0, k = 0;            // logical sizes (k % 32 == 0)
  int64_t stride_k = 0, stride_n = 0;  // elements between consecutive 32-k / 64-n blocks
};
constexpr int64_t kGemvMaxRows = 8;      // the vdpbf16ps kernel
constexpr int64_t kAmxGroups = 4;        // the AMX kernel: up to four A tiles of 16 rows
constexpr int64_t kAmxGemvMaxRows = 16 * kAmxGroups;
PairedBlocks paired_blocks(const Packed& p);
bool gemv_available();  // compiled with AVX-512 BF16
// The kernel gemv_bf16 runs in this process: "amx" (the CPU has AMX-BF16 and Linux granted the
// tile state), else "avx512bf16"; "none" without AVX-512 BF16 in the build. Its row limit.
const char* gemv_isa();
int64_t gemv_max_rows();
// out[m, n] (fp32 or bf16, row stride ldo) = x[m, k] (bf16, row stride ldx) @ W^T, fp32
// accumulation, bf16 out rounded once (nearest even); 1 <= m <= gemv_max_rows(). `prefetch`: a
// software prefetch ahead of each step (GemvPolicy.prefetch).
void gemv_bf16(const PairedBlocks& w, const uint16_t* x, int64_t m, int64_t ldx, void* out,
               int64_t out_dt, int64_t ldo, int64_t threads, bool prefetch);
// w's weights back into out ([n, k] row-major bf16): the layout the GEMV reads, unpacked for a
// library that takes plain rows (LargeMPolicy).
void unpack_bf16(const PairedBlocks& w, uint16_t* out, int64_t threads);

int64_t panel_count(int64_t n);                // panels of 16 columns
int64_t panel_steps(int64_t w_dt, int64_t k);  // k steps per panel (int8: k-pairs)
bool panel_isa_available(int64_t isa, int64_t w_dt);
// w [n, k] row-major of type w_dt -> panel_count(n) panels of panel_steps(w_dt, k) steps of 16
// columns (int8: 32 bytes per k-pair), zero-padded.
void pack_panels(const void* w, int64_t w_dt, int64_t n, int64_t k, void* out, int64_t threads);
// bf16/fp16/fp32: out = x @ W^T (+ bias), fp32 accumulation, 16-bit out rounded once (nearest
// even).
// int8: out = ((acc as fp32) * x_scale[m]) * w_scale[n] (+ bias), acc the exact int32 sum.
void panel_gemm(const PanelCall& c, const PanelConf& conf);

}  // namespace pa_onednn
