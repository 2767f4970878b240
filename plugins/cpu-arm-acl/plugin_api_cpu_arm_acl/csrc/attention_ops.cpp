// The attention kernels as torch ops, in a namespace of their own per ISA variant
// (PA_ATTN_NAMESPACE, e.g. pa_cpu_attn_avx512bf16, given by _attention_ext.py): each variant is
// its own library, so several can be loaded in one process. Every tensor is checked here, with
// an error naming the argument, before a kernel sees its pointer.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <cstring>
#include <exception>

#include "attention.h"

#ifndef PA_ATTN_NAMESPACE
#error "compile with -DPA_ATTN_NAMESPACE=<the variant's op namespace>"
#endif
#define PA_STR2(x) #x
#define PA_STR(x) PA_STR2(x)
#define PA_OP PA_STR(PA_ATTN_NAMESPACE)
// TORCH_LIBRARY pastes its namespace token: expand the macro first
#define PA_TORCH_LIBRARY(ns, m) TORCH_LIBRARY(ns, m)

namespace pa_attn {
namespace {

using at::Tensor;

// The element type of a query, key/value or output tensor (model), or of the cache.
DType dtype_of(const Tensor& t, const char* name, bool cache) {
  switch (t.scalar_type()) {
    case at::kFloat: return kF32;
    case at::kBFloat16: return kBF16;
    case at::kHalf: return kF16;
    case at::kFloat8_e4m3fn:
      if (cache) return kFP8;
      break;
    default: break;
  }
  TORCH_CHECK(false, PA_OP, ": ", name, " has dtype ", t.scalar_type(), "; expected ",
              cache ? "float32, bfloat16, float16 or float8_e4m3fn"
                    : "float32, bfloat16 or float16");
}

void check(const Tensor& t, const char* name, at::ScalarType dtype, int64_t dim) {
  TORCH_CHECK(t.device().is_cpu(), PA_OP, ": ", name, " must be a CPU tensor");
  TORCH_CHECK(t.scalar_type() == dtype, PA_OP, ": ", name, " must be ", dtype, ", got ",
              t.scalar_type());
  TORCH_CHECK(t.dim() == dim, PA_OP, ": ", name, " must have ", dim, " dims, got ", t.sizes());
  TORCH_CHECK(t.is_contiguous(), PA_OP, ": ", name, " must be contiguous");
}

// cache [num_blocks, 2, kv_heads, block_size, head_size], contiguous
void check_cache(const Tensor& cache) {
  TORCH_CHECK(cache.device().is_cpu(), PA_OP, ": kv_cache must be a CPU tensor");
  dtype_of(cache, "kv_cache", true);
  TORCH_CHECK(cache.dim() == 5 && cache.size(1) == 2 && cache.is_contiguous(), PA_OP,
              ": kv_cache must be contiguous [num_blocks, 2, kv_heads, block_size, head_size], "
              "got ",
              cache.sizes());
  const int64_t bs = cache.size(3), dim = cache.size(4);
  TORCH_CHECK(bs > 0 && bs % kBlockMultiple == 0 && bs <= kMaxBlockSize, PA_OP,
              ": kv_cache block_size=", bs, " must be a multiple of ", kBlockMultiple,
              " up to ", kMaxBlockSize);
  TORCH_CHECK(dim > 0 && dim % kHeadMultiple == 0 && dim <= kMaxHeadSize, PA_OP,
              ": kv_cache head_size=", dim, " must be a multiple of ", kHeadMultiple, " up to ",
              kMaxHeadSize);
}

template <typename F>
void rethrow(const char* op, F&& f) {
  try {
    f();
  } catch (const std::exception& e) {  // torch's brgemm or pack, or a kernel's own check
    TORCH_CHECK(false, PA_OP, " ", op, ": ", e.what());
  }
}

c10::Dict<std::string, int64_t> limits() {
  c10::Dict<std::string, int64_t> d;
  d.insert("rows_layout_min", kRowsLayoutMin);
  d.insert("item_fields", kFields);
  d.insert("reduce_fields", rFields);
  d.insert("max_head_group", kMaxHeadGroup);
  d.insert("max_splits", kMaxSplits);
  d.insert("vector_width", vector_width());
  d.insert("head_multiple", kHeadMultiple);
  d.insert("max_head_size", kMaxHeadSize);
  d.insert("block_multiple", kBlockMultiple);
  d.insert("max_block_size", kMaxBlockSize);
  return d;
}

// (fp32 load, bf16 load): the second is empty where the build has no vdpbf16ps path
std::tuple<Tensor, Tensor> fp8_values_op() {
  Tensor f32 = at::empty({256}, at::kFloat);
  fp8_values(f32.data_ptr<float>());
  Tensor bf16 = at::empty({256}, at::kBFloat16);
  if (!fp8_bf16_values(reinterpret_cast<uint16_t*>(bf16.data_ptr<c10::BFloat16>()))) bf16 = at::empty({0}, at::kBFloat16);
  return {f32, bf16};
}

std::tuple<Tensor, Tensor, int64_t> plan(const Tensor& query_start_loc, const Tensor& seq_lens,
                                         int64_t num_seqs, int64_t group, int64_t kv_heads,
                                         int64_t block_size, bool causal, int64_t window,
                                         int64_t num_threads, int64_t tile_rows,
                                         int64_t min_split_keys) {
  check(query_start_loc, "query_start_loc", at::kInt, 1);
  check(seq_lens, "seq_lens", at::kInt, 1);
  TORCH_CHECK(num_seqs >= 0 && query_start_loc.numel() >= num_seqs + 1 &&
                  seq_lens.numel() >= num_seqs,
              PA_OP, ": num_seqs=", num_seqs, " needs query_start_loc of ", num_seqs + 1,
              " and seq_lens of ", num_seqs, " entries, got ", query_start_loc.numel(), " and ",
              seq_lens.numel());
  TORCH_CHECK(group >= 1, PA_OP, ": group=", group, " must be at least 1");
  TORCH_CHECK(kv_heads >= 1, PA_OP, ": kv_heads=", kv_heads, " must be at least 1");
  TORCH_CHECK(block_size > 0 && block_size % kBlockMultiple == 0, PA_OP, ": block_size=",
              block_size, " must be a positive multiple of ", kBlockMultiple);
  TORCH_CHECK(window >= 0, PA_OP, ": window=", window, " must be 0 (none) or positive");
  TORCH_CHECK(num_threads >= 1, PA_OP, ": num_threads=", num_threads, " must be at least 1");
  TORCH_CHECK(tile_rows >= 1, PA_OP, ": tile_rows=", tile_rows, " must be at least 1");
  TORCH_CHECK(min_split_keys >= 1, PA_OP, ": min_split_keys=", min_split_keys,
              " must be at least 1");
  const Plan p = make_plan(query_start_loc.data_ptr<int32_t>(), seq_lens.data_ptr<int32_t>(),
                           num_seqs, group, kv_heads, block_size, causal, window, num_threads,
                           tile_rows, min_split_keys);
  const auto n_items = static_cast<int64_t>(p.items.size());
  const auto n_reduce = static_cast<int64_t>(p.reduce.size());
  Tensor items = at::empty({n_items, kFields}, at::kInt);
  Tensor reduce = at::empty({n_reduce, rFields}, at::kInt);
  if (n_items) std::memcpy(items.data_ptr(), p.items.data(), sizeof(int32_t) * kFields * n_items);
  if (n_reduce)
    std::memcpy(reduce.data_ptr(), p.reduce.data(), sizeof(int32_t) * rFields * n_reduce);
  return {items, reduce, p.partial_rows};
}

void write_kv_op(const Tensor& key, const Tensor& value, const Tensor& kv_cache,
                 const Tensor& slot_mapping, int64_t num_tokens, double k_scale,
                 double v_scale) {
  check_cache(kv_cache);
  check(slot_mapping, "slot_mapping", at::kLong, 1);
  const int64_t kv_heads = kv_cache.size(2), dim = kv_cache.size(4);
  TORCH_CHECK(num_tokens >= 0 && num_tokens <= slot_mapping.numel(), PA_OP,
              ": num_tokens=", num_tokens, " must be within slot_mapping's ",
              slot_mapping.numel(), " entries");
  const DType model = dtype_of(key, "key", false);
  for (const auto& [t, name] : {std::pair{&key, "key"}, std::pair{&value, "value"}}) {
    TORCH_CHECK(t->device().is_cpu(), PA_OP, ": ", name, " must be a CPU tensor");
    TORCH_CHECK(t->scalar_type() == key.scalar_type(), PA_OP, ": ", name, " has dtype ",
                t->scalar_type(), ", key has ", key.scalar_type());
    TORCH_CHECK(t->dim() == 3 && t->size(0) >= num_tokens && t->size(1) == kv_heads &&
                    t->size(2) == dim && t->stride(2) == 1,
                PA_OP, ": ", name, " must be [num_tokens, ", kv_heads, ", ", dim,
                "] with a contiguous last dim, got ", t->sizes(), " strides ", t->strides());
  }
  TORCH_CHECK(k_scale > 0 && v_scale > 0, PA_OP, ": k_scale=", k_scale, " and v_scale=",
              v_scale, " must be positive");
  const WriteKvArgs a{key.data_ptr(),
                      value.data_ptr(),
                      model,
                      key.stride(0),
                      key.stride(1),
                      value.stride(0),
                      value.stride(1),
                      kv_cache.data_ptr(),
                      dtype_of(kv_cache, "kv_cache", true),
                      slot_mapping.data_ptr<int64_t>(),
                      num_tokens,
                      kv_heads,
                      dim,
                      kv_cache.size(3),
                      k_scale,
                      v_scale};
  rethrow("write_kv", [&] { write_kv(a); });
}

void forward_op(const Tensor& query, const Tensor& kv_cache, const Tensor& block_table,
                const Tensor& seq_lens, const Tensor& items, const Tensor& reduce,
                const Tensor& partial_acc, const Tensor& partial_ml,
                const std::optional<Tensor>& sinks, const Tensor& out, double scale,
                double k_scale, double v_scale, bool causal, int64_t window, double soft_cap,
                bool matrix, bool ahead_l1) {
  check_cache(kv_cache);
  const DType model = dtype_of(query, "query", false);
  // query rows and heads are read by stride (a view into a fused QKV output); each head's
  // vector is read as one dense run
  TORCH_CHECK(query.device().is_cpu(), PA_OP, ": query must be a CPU tensor");
  TORCH_CHECK(query.dim() == 3 && query.stride(2) == 1 && query.stride(0) >= 0 &&
                  query.stride(1) >= 0,
              PA_OP, ": query must be [num_tokens, heads, head_size] with a contiguous last dim, "
              "got ", query.sizes(), " strides ", query.strides());
  check(out, "out", query.scalar_type(), 3);
  TORCH_CHECK(out.sizes() == query.sizes(), PA_OP, ": out has shape ", out.sizes(),
              ", query ", query.sizes());
  const int64_t heads = query.size(1), dim = query.size(2), kv_heads = kv_cache.size(2);
  TORCH_CHECK(dim == kv_cache.size(4), PA_OP, ": query head_size=", dim, " differs from "
              "kv_cache's ", kv_cache.size(4));
  TORCH_CHECK(heads % kv_heads == 0, PA_OP, ": query heads=", heads,
              " must be a multiple of kv_cache's kv_heads=", kv_heads);
  check(block_table, "block_table", at::kInt, 2);
  check(seq_lens, "seq_lens", at::kInt, 1);
  check(items, "items", at::kInt, 2);
  check(reduce, "reduce", at::kInt, 2);
  TORCH_CHECK(items.size(1) == kFields && reduce.size(1) == rFields, PA_OP,
              ": items and reduce must have ", kFields, " and ", rFields,
              " columns (a plan from this library), got ", items.size(1), " and ",
              reduce.size(1));
  check(partial_acc, "partial_acc", at::kFloat, 2);
  check(partial_ml, "partial_ml", at::kFloat, 2);
  TORCH_CHECK(partial_acc.size(1) == dim && partial_ml.size(1) == 2 &&
                  partial_ml.size(0) == partial_acc.size(0),
              PA_OP, ": partial_acc must be [P, ", dim, "] and partial_ml [P, 2], got ",
              partial_acc.sizes(), " and ", partial_ml.sizes());
  if (sinks) {
    check(*sinks, "sinks", at::kFloat, 1);
    TORCH_CHECK(sinks->numel() == heads, PA_OP, ": sinks must have one logit per query head (",
                heads, "), got ", sinks->numel());
  }
  TORCH_CHECK(window >= 0, PA_OP, ": window=", window, " must be 0 (none) or positive");
  TORCH_CHECK(soft_cap >= 0, PA_OP, ": soft_cap=", soft_cap, " must be 0 (none) or positive");
  const ForwardArgs a{query.data_ptr(),
                      query.stride(0),
                      query.stride(1),
                      kv_cache.data_ptr(),
                      model,
                      dtype_of(kv_cache, "kv_cache", true),
                      block_table.data_ptr<int32_t>(),
                      block_table.size(1),
                      seq_lens.data_ptr<int32_t>(),
                      items.data_ptr<int32_t>(),
                      items.size(0),
                      reduce.data_ptr<int32_t>(),
                      reduce.size(0),
                      partial_acc.data_ptr<float>(),
                      partial_ml.data_ptr<float>(),
                      sinks ? sinks->data_ptr<float>() : nullptr,
                      out.data_ptr(),
                      heads,
                      kv_heads,
                      dim,
                      kv_cache.size(3),
                      scale,
                      k_scale,
                      v_scale,
                      causal,
                      window,
                      soft_cap,
                      matrix,
                      ahead_l1};
  rethrow("forward", [&] { forward(a); });
}

}  // namespace
}  // namespace pa_attn

PA_TORCH_LIBRARY(PA_ATTN_NAMESPACE, m) {
  using namespace pa_attn;
  m.def("limits() -> Dict(str, int)", &limits);
  m.def("fp8_values() -> (Tensor f32, Tensor bf16)", &fp8_values_op);
  m.def("matrix_engine() -> bool", &matrix_engine);
  m.def(
      "plan(Tensor query_start_loc, Tensor seq_lens, int num_seqs, int group, int kv_heads, "
      "int block_size, bool causal, int window, int num_threads, int tile_rows, "
      "int min_split_keys) -> (Tensor items, Tensor reduce, int partial_rows)",
      &plan);
  m.def(
      "write_kv(Tensor key, Tensor value, Tensor(a!) kv_cache, Tensor slot_mapping, "
      "int num_tokens, float k_scale, float v_scale) -> ()",
      &write_kv_op);
  m.def(
      "forward(Tensor query, Tensor kv_cache, Tensor block_table, Tensor seq_lens, "
      "Tensor items, Tensor reduce, Tensor(a!) partial_acc, Tensor(b!) partial_ml, "
      "Tensor? sinks, Tensor(c!) out, float scale, float k_scale, float v_scale, bool causal, "
      "int window, float soft_cap, bool matrix, bool ahead_l1) -> ()",
      &forward_op);
}
