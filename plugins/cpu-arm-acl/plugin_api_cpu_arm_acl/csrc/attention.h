// Interface between the torch ops (attention_ops.cpp) and the attention kernels
// (attention_vector.cpp, attention_matrix.cpp): raw pointers and no torch types, so that only the
// ops' translation unit parses torch's library headers. The ops have checked every argument.
#pragma once

#include <cstdint>

#include "attention_plan.h"

namespace pa_attn {

// Element types of the query, output, key/value rows and the cache.
enum DType : int64_t { kF32 = 0, kBF16 = 1, kF16 = 2, kFP8 = 3 };

// query [T, H, D] with a contiguous last dim, rows and heads at q_tok_stride and q_head_stride
// elements (a view into a fused QKV output), out [T, H, D] contiguous (model dtype), cache
// [nb, 2, KH, bs, D] (cache dtype), block_table int32 [S, bt_stride], sinks fp32 [H] or null;
// items and reduce rows from make_plan, partial_acc [P, D] and partial_ml [P, 2] fp32 for its P
// partial rows.
struct ForwardArgs {
  const void* query;
  int64_t q_tok_stride, q_head_stride;
  const void* cache;
  DType model_dtype, cache_dtype;
  const int32_t* block_table;
  int64_t bt_stride;
  const int32_t* seq_lens;
  const int32_t* items;
  int64_t num_items;
  const int32_t* reduce;
  int64_t num_reduce;
  float* partial_acc;
  float* partial_ml;
  const float* sinks;
  void* out;
  int64_t heads, kv_heads, dim, block;
  double scale, k_scale, v_scale;  // scale: the softmax scale
  bool causal;
  int64_t window;   // 0: none
  double soft_cap;  // 0: none
  bool matrix;      // items of kRowsLayoutMin rows or more per KV head take the matrix layout
  bool ahead_l1;    // the dot layout prefetches the next block into L1, not L2
};

// Attends every item and combines the split ones into out. Throws what torch's brgemm or pack
// throws (out is then incomplete).
void forward(const ForwardArgs& a);

// key/value rows [T, KH, D] (model dtype, last dim contiguous, strides in elements) into the
// cache at slots[t] (int64; -1: skipped). An fp8 cache stores cast_rne(clamp(x / scale, -448,
// 448)).
struct WriteKvArgs {
  const void* key;
  const void* value;
  DType model_dtype;
  int64_t tok_stride_k, head_stride_k, tok_stride_v, head_stride_v;
  void* cache;
  DType cache_dtype;
  const int64_t* slots;
  int64_t tokens, kv_heads, dim, block;
  double k_scale, v_scale;
};
void write_kv(const WriteKvArgs& a);

int64_t vector_width();  // fp32 lanes of at::vec in this build
// Every fp8 e4m3 byte (0..255, in order) decoded to fp32 by the load the kernels read fp8
// caches with (load_f32), into out[256]; and, where the build has the vdpbf16ps path (kDotBf16),
// widened to bf16 by that path's loads into bf16_out[256] (the bits) (returns whether it did).
void fp8_values(float* out);
bool fp8_bf16_values(uint16_t* bf16_out);
// Whether torch's oneDNN ukernel packs bf16 B panels for a matrix engine (AMX) on this CPU: the
// matrix layout then runs oneDNN's AMX brgemm, else torch's gemm.
bool matrix_engine();

}  // namespace pa_attn
