// torch bindings: ops in namespace pa_cpu_onednn, weights and primitives as custom classes.
// Every tensor is checked here too, so that a direct call cannot hand a kernel a bad pointer.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <torch/library.h>

#include <stdexcept>

#include "huge_pages.h"
#include "kernels.h"
#include "panel_isa.h"

namespace pa_onednn {
namespace {

using at::Tensor;

int64_t code_of(const Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return kF32;
    case at::kBFloat16: return kBF16;
    case at::kChar: return kS8;
    case at::kHalf: return kF16;
    default: TORCH_CHECK(false, "pa_cpu_onednn: unsupported dtype ", t.scalar_type());
  }
}

MatmulConf conf_of(const std::vector<int64_t>& v) {
  TORCH_CHECK(v.size() == 11, "pa_cpu_onednn: conf has 11 fields, got ", v.size());
  MatmulConf c;
  c.m = v[0], c.n = v[1], c.k = v[2], c.lda = v[3], c.ldc = v[4];
  c.a = v[5], c.b = v[6], c.c = v[7], c.bias = v[8], c.scaled = v[9] != 0, c.threads = v[10];
  TORCH_CHECK(c.m > 0 && c.n > 0 && c.k > 0 && c.lda >= c.k && c.ldc >= c.n,
              "pa_cpu_onednn: bad problem sizes");
  return c;
}

void check_cpu(const Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), "pa_cpu_onednn: ", name, " must be a CPU tensor");
}

template <typename F>
auto rethrow(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const std::exception& e) {  // oneDNN errors become RuntimeError with the problem
    TORCH_CHECK(false, e.what());
  }
}

struct PackedWeights : torch::CustomClassHolder {
  std::shared_ptr<Packed> p;
  MatmulConf conf;
  int64_t nbytes() const { return packed_bytes(*p); }
  bool huge_pages() const { return packed_huge_pages(*p); }
  std::string layout() const { return packed_layout(*p); }
};

struct Primitive : torch::CustomClassHolder {
  std::shared_ptr<Matmul> mm;
  MatmulConf c;

  int64_t scratchpad() const { return scratchpad_bytes(*mm); }
  std::string impl() const { return impl_name(*mm); }

  void run(const c10::intrusive_ptr<PackedWeights>& w, const Tensor& src,
           const std::optional<Tensor>& bias, const Tensor& dst, const Tensor& scratch) const {
    check_cpu(src, "src");
    check_cpu(dst, "dst");
    TORCH_CHECK(code_of(src) == c.a && src.dim() == 2 && src.size(0) == c.m &&
                    src.size(1) == c.k && src.stride(1) == 1 && src.stride(0) == c.lda,
                "pa_cpu_onednn: src does not match the primitive");
    TORCH_CHECK(code_of(dst) == c.c && dst.dim() == 2 && dst.size(0) == c.m &&
                    dst.size(1) == c.n && dst.stride(1) == 1 && dst.stride(0) == c.ldc,
                "pa_cpu_onednn: dst does not match the primitive");
    TORCH_CHECK(bias.has_value() == (c.bias != kNone), "pa_cpu_onednn: bias presence differs");
    if (bias) {
      TORCH_CHECK(code_of(*bias) == c.bias && bias->numel() == c.n && bias->is_contiguous(),
                  "pa_cpu_onednn: bias does not match the primitive");
    }
    TORCH_CHECK(scratch.is_contiguous() && scratch.nbytes() >= static_cast<size_t>(scratchpad()),
                "pa_cpu_onednn: scratchpad too small");
    rethrow([&] {
      run_matmul(*mm, *w->p, src.data_ptr(), bias ? bias->data_ptr() : nullptr, dst.data_ptr(),
                 scratch.data_ptr());
      return 0;
    });
  }
};

c10::intrusive_ptr<PackedWeights> pack(const Tensor& w, const std::optional<Tensor>& w_scale,
                                       std::vector<int64_t> conf) {
  const MatmulConf c = conf_of(conf);
  check_cpu(w, "weight");
  TORCH_CHECK(code_of(w) == c.b && w.dim() == 2 && w.size(0) == c.n && w.size(1) == c.k &&
                  w.is_contiguous(),
              "pa_cpu_onednn: weight must be [N, K] contiguous of the problem's type");
  TORCH_CHECK(w_scale.has_value() == c.scaled, "pa_cpu_onednn: w_scale presence differs");
  if (w_scale) {
    TORCH_CHECK(w_scale->scalar_type() == at::kFloat && w_scale->numel() == c.n &&
                    w_scale->is_contiguous(),
                "pa_cpu_onednn: w_scale must be fp32 [N] contiguous");
  }
  auto out = c10::make_intrusive<PackedWeights>();
  out->conf = c;
  out->p = rethrow([&] {
    return pack_weights(w.data_ptr(), w_scale ? w_scale->data_ptr<float>() : nullptr, c);
  });
  return out;
}

c10::intrusive_ptr<Primitive> matmul(std::vector<int64_t> conf,
                                     const c10::intrusive_ptr<PackedWeights>& w) {
  auto out = c10::make_intrusive<Primitive>();
  out->c = conf_of(conf);
  out->mm = rethrow([&] { return make_matmul(out->c, *w->p); });
  return out;
}

// Whether gemv can run on w (its layout is oneDNN's paired one, and this build has the kernel).
void unpack(const c10::intrusive_ptr<PackedWeights>& w, const Tensor& out, int64_t threads) {
  check_cpu(out, "out");
  const PairedBlocks pb = paired_blocks(*w->p);
  TORCH_CHECK(gemv_available() && pb.base != nullptr,
              "pa_cpu_onednn: unpack needs AVX-512 BF16 and oneDNN's paired bf16 layout");
  TORCH_CHECK(out.scalar_type() == at::kBFloat16 && out.dim() == 2 && out.size(0) == pb.n &&
                  out.size(1) == pb.k && out.is_contiguous(),
              "pa_cpu_onednn: unpack out must be bf16 [N, K] contiguous");
  rethrow([&] {
    unpack_bf16(pb, static_cast<uint16_t*>(out.data_ptr()), threads);
    return 0;
  });
}

bool gemv_layout(const c10::intrusive_ptr<PackedWeights>& w) {
  return gemv_available() && paired_blocks(*w->p).base != nullptr;
}

void gemv(const c10::intrusive_ptr<PackedWeights>& w, const Tensor& x, const Tensor& out,
          int64_t threads, bool prefetch) {
  check_cpu(x, "x");
  check_cpu(out, "out");
  const PairedBlocks pb = paired_blocks(*w->p);
  TORCH_CHECK(gemv_available() && pb.base != nullptr,
              "pa_cpu_onednn: gemv needs AVX-512 BF16 and oneDNN's paired bf16 layout");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && x.dim() == 2 && x.size(1) == pb.k &&
                  x.stride(1) == 1 && x.size(0) >= 1 && x.size(0) <= gemv_max_rows(),
              "pa_cpu_onednn: gemv x must be bf16 [1..", gemv_max_rows(), ", K] with unit stride");
  TORCH_CHECK((out.scalar_type() == at::kFloat || out.scalar_type() == at::kBFloat16) &&
                  out.dim() == 2 && out.size(0) == x.size(0) && out.size(1) == pb.n &&
                  out.stride(1) == 1,
              "pa_cpu_onednn: gemv out must be fp32 or bf16 [M, N] with unit stride");
  rethrow([&] {
    gemv_bf16(pb, static_cast<const uint16_t*>(x.data_ptr()), x.size(0), x.stride(0),
              out.data_ptr(), code_of(out), out.stride(0), threads, prefetch);
    return 0;
  });
}

void quant(const Tensor& x, int64_t group, bool fp8, double eps, bool ue8m0, bool stream,
           const Tensor& q, const Tensor& scales, int64_t threads) {
  check_cpu(x, "x");
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && group > 0 && x.size(1) % group == 0,
              "pa_cpu_onednn: x must be [M, K] contiguous with K % group == 0");
  TORCH_CHECK(q.sizes() == x.sizes() && q.is_contiguous() && q.element_size() == 1,
              "pa_cpu_onednn: q must be [M, K] contiguous, 1-byte elements");
  TORCH_CHECK(scales.scalar_type() == at::kFloat && scales.dim() == 2 &&
                  scales.size(0) == x.size(0) && scales.size(1) == x.size(1) / group,
              "pa_cpu_onednn: scales must be fp32 [M, K / group]");
  const int64_t dt = code_of(x);
  TORCH_CHECK(dt != kS8, "pa_cpu_onednn: x must be floating point");
  group_quant(x.data_ptr(), dt, x.size(0), x.size(1), group, fp8, static_cast<float>(eps), ue8m0,
              stream, q.data_ptr(), scales.data_ptr<float>(), scales.stride(0), scales.stride(1),
              threads);
}

// ---- panel GEMMs --------------------------------------------------------------------------

PanelConf panel_conf_of(const std::vector<int64_t>& v) {
  TORCH_CHECK(v.size() == 6, "pa_cpu_onednn: panel conf has 6 fields, got ", v.size());
  PanelConf c;
  c.isa = v[0], c.widen = v[1], c.kc = v[2], c.mc = v[3], c.threads = v[4], c.order = v[5];
  TORCH_CHECK(c.kc > 0 && c.mc > 0 && c.threads >= 0 &&
                  (c.order == kPanelMajor || c.order == kBlockMajor),
              "pa_cpu_onednn: bad panel conf");
  return c;
}

void check_vector(const Tensor& t, const char* name, int64_t len) {
  check_cpu(t, name);
  TORCH_CHECK(t.scalar_type() == at::kFloat && t.dim() == 1 && t.numel() == len &&
                  t.is_contiguous(),
              "pa_cpu_onednn: ", name, " must be fp32 [", len, "] contiguous");
}

// The common checks of a panel call; returns it with everything but the scales filled in.
PanelCall panel_call(const Tensor& x, const Tensor& panels, int64_t n,
                     const std::optional<Tensor>& bias, const Tensor& out) {
  check_cpu(x, "x");
  check_cpu(panels, "panels");
  check_cpu(out, "out");
  const int64_t dt = code_of(x);
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1 && x.size(0) > 0,
              "pa_cpu_onednn: x must be [M, K] with a contiguous last dim");
  const int64_t k = x.size(1);
  TORCH_CHECK(panels.dim() == 3 && panels.is_contiguous() && panels.size(0) == panel_count(n) &&
                  panels.size(1) == panel_steps(dt, k) && code_of(panels) == dt &&
                  panels.size(2) == (dt == kS8 ? 2 : 1) * panel::kCols,
              "pa_cpu_onednn: panels do not match N=", n, " K=", k, " ", x.scalar_type());
  TORCH_CHECK(out.dim() == 2 && out.size(0) == x.size(0) && out.size(1) == n &&
                  out.stride(1) == 1,
              "pa_cpu_onednn: out must be [M, N] with a contiguous last dim");
  PanelCall c;
  c.m = x.size(0), c.n = n, c.k = k, c.lda = x.stride(0), c.ldc = out.stride(0);
  c.w_dt = dt, c.x = x.data_ptr(), c.panels = panels.data_ptr(), c.out = out.data_ptr();
  c.out_dt = code_of(out);
  if (bias) {
    check_vector(*bias, "bias", n);
    c.bias = bias->data_ptr<float>();
  }
  return c;
}

Tensor panel_pack(const Tensor& w, int64_t threads) {
  check_cpu(w, "weight");
  const int64_t dt = code_of(w);
  TORCH_CHECK(w.dim() == 2 && w.is_contiguous() && w.numel() > 0,
              "pa_cpu_onednn: weight must be [N, K] bf16, fp16, fp32 or int8, contiguous");
  const int64_t n = w.size(0), k = w.size(1);
  const int64_t step = (dt == kS8 ? 2 : 1) * panel::kCols;  // elements per panel step
  const std::vector<int64_t> sizes{panel_count(n), panel_steps(dt, k), step};
  const size_t bytes = static_cast<size_t>(sizes[0] * sizes[1] * step) * w.element_size();
  Tensor out;
  if (bytes >= kHugePagesFrom) {
    bool asked = false;  // a hint: the panels are the same either way
    HugeBuffer buffer = huge_page_buffer(bytes, &asked);
    out = at::from_blob(buffer.get(), sizes, FreeDeleter(), w.options());
    buffer.release();  // the tensor owns it now
  } else {
    out = at::empty(sizes, w.options());
  }
  rethrow([&] {
    pack_panels(w.data_ptr(), dt, n, k, out.data_ptr(), threads);
    return 0;
  });
  return out;
}

void panel_mm(const Tensor& x, const Tensor& panels, int64_t n, const std::optional<Tensor>& bias,
              const Tensor& out, std::vector<int64_t> conf) {
  const PanelConf pc = panel_conf_of(conf);
  const PanelCall c = panel_call(x, panels, n, bias, out);
  TORCH_CHECK(c.w_dt != kS8, "pa_cpu_onednn: int8 weights go through panel_scaled_mm");
  rethrow([&] {
    panel_gemm(c, pc);
    return 0;
  });
}

void panel_scaled_mm(const Tensor& x, const Tensor& x_scale, const Tensor& panels,
                     const Tensor& w_scale, const std::optional<Tensor>& bias, const Tensor& out,
                     std::vector<int64_t> conf) {
  const PanelConf pc = panel_conf_of(conf);
  const int64_t n = w_scale.numel();
  PanelCall c = panel_call(x, panels, n, bias, out);
  TORCH_CHECK(c.w_dt == kS8, "pa_cpu_onednn: panel_scaled_mm takes int8 x and weights");
  check_vector(x_scale, "x_scale", c.m);
  check_vector(w_scale, "w_scale", n);
  c.x_scale = x_scale.data_ptr<float>();
  c.w_scale = w_scale.data_ptr<float>();
  rethrow([&] {
    panel_gemm(c, pc);
    return 0;
  });
}

}  // namespace
}  // namespace pa_onednn

TORCH_LIBRARY(pa_cpu_onednn, m) {
  using namespace pa_onednn;
  m.class_<PackedWeights>("PackedWeights")
      .def("nbytes", &PackedWeights::nbytes)
      .def("huge_pages", &PackedWeights::huge_pages)
      .def("layout", &PackedWeights::layout);
  m.class_<Primitive>("Primitive")
      .def("run", &Primitive::run)
      .def("scratchpad_bytes", &Primitive::scratchpad)
      .def("impl", &Primitive::impl);
  m.def("pack", &pack);
  m.def("matmul", &matmul);
  m.def("group_quant", &quant);
  m.def("unpack", &unpack);
  m.def("gemv_layout", &gemv_layout);
  m.def("gemv", &gemv);
  m.def("gemv_isa", [] { return std::string(gemv_isa()); });
  m.def("gemv_max_rows", &gemv_max_rows);
  m.def("onednn_version", [] { return onednn_version(); });
  m.def("panel_pack", &panel_pack);
  m.def("panel_mm", &panel_mm);
  m.def("panel_scaled_mm", &panel_scaled_mm);
  m.def("panel_available", [](int64_t isa, bool int8) {
    return panel_isa_available(isa, int8 ? kS8 : kBF16);
  });
}
