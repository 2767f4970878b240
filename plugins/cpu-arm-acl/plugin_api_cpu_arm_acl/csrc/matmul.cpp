// oneDNN matmul primitives: creation, weight prepacking (format `any`), execution with a
// user-managed scratchpad and an explicit OpenMP thread count.
#include <omp.h>

#include <oneapi/dnnl/dnnl.hpp>
#include <sstream>
#include <stdexcept>
#include <unordered_map>
#include <vector>

#include "huge_pages.h"
#include "kernels.h"

namespace pa_onednn {

using dnnl::memory;
using Tag = memory::format_tag;
using Type = memory::data_type;

namespace {

dnnl::engine& engine() {
  static dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  return eng;
}

Type type_of(int64_t code) {
  switch (code) {
    case kF32: return Type::f32;
    case kBF16: return Type::bf16;
    case kS8: return Type::s8;
    case kF16: return Type::f16;
    default: throw std::invalid_argument("pa_onednn: unknown element type code");
  }
}

const char* type_name(int64_t code) {
  switch (code) {
    case kF32: return "f32";
    case kBF16: return "bf16";
    case kS8: return "s8";
    case kF16: return "f16";
    default: return "none";
  }
}

std::string describe(const MatmulConf& c) {
  std::ostringstream s;
  s << "M=" << c.m << " N=" << c.n << " K=" << c.k << " " << type_name(c.a) << "x"
    << type_name(c.b) << "->" << type_name(c.c) << " bias=" << type_name(c.bias)
    << " lda=" << c.lda << " ldc=" << c.ldc << (c.scaled ? " scaled" : "")
    << " threads=" << c.threads;
  return s.str();
}

// Primitives are created and run with the same thread count (some oneDNN kernels size their
// work split at creation). The previous count is restored: torch shares this OpenMP runtime.
struct ThreadScope {
  int prev;
  explicit ThreadScope(int64_t threads) : prev(omp_get_max_threads()) {
    if (threads > 0) omp_set_num_threads(static_cast<int>(threads));
  }
  ~ThreadScope() { omp_set_num_threads(prev); }
};

memory::desc bias_desc(const MatmulConf& c) { return {{1, c.n}, type_of(c.bias), Tag::ab}; }

dnnl::matmul::primitive_desc make_pd(const MatmulConf& c, const memory::desc& weights) {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  // int8: per-channel weight scales. The per-token scale and the bias stay outside: oneDNN's
  // per-row binary post-op sends x86 matmuls to its reference kernel.
  if (c.scaled) attr.set_scales_mask(DNNL_ARG_WEIGHTS, 1 << 1);
  memory::desc src({c.m, c.k}, type_of(c.a), memory::dims{c.lda, 1});
  memory::desc dst({c.m, c.n}, type_of(c.c), memory::dims{c.ldc, 1});
  try {
    if (c.bias != kNone)
      return dnnl::matmul::primitive_desc(engine(), src, weights, bias_desc(c), dst, attr);
    return dnnl::matmul::primitive_desc(engine(), src, weights, dst, attr);
  } catch (const dnnl::error& e) {
    throw std::runtime_error("oneDNN has no matmul for " + describe(c) + ": " + e.what());
  }
}

bool reference_code(const dnnl::matmul::primitive_desc& pd) {
  return std::string(pd.impl_info_str()).rfind("ref", 0) == 0;
}

// The layout `conf` (PACK_M rows) picks, unless a one-row call over it would run oneDNN's
// reference kernel: oneDNN 3.2 on AMX packs small int8 weights (K <= 256) for its AMX kernel
// and then has only 'ref:any' for M 1-5 over them. The layout a one-row problem picks served
// every M from 1 to 1000 there, so such weights take that one.
memory::desc packed_layout_for(const MatmulConf& conf) {
  memory::desc any({conf.k, conf.n}, type_of(conf.b), Tag::any);
  auto chosen = make_pd(conf, any).weights_desc();
  MatmulConf one = conf;
  one.m = 1;
  if (!reference_code(make_pd(one, chosen))) return chosen;
  auto for_one = make_pd(one, any).weights_desc();
  return reference_code(make_pd(conf, for_one)) ? chosen : for_one;
}

}  // namespace

struct Packed {
  HugeBuffer buffer;  // mem's data, for weights of kHugePagesFrom or more (freed after mem)
  bool huge_pages = false;  // the buffer asked for huge pages and the kernel took the request
  memory mem;
  std::vector<float> w_scale;
  MatmulConf conf;  // the problem it was packed for
};

struct Matmul {
  dnnl::matmul prim;
  dnnl::matmul::primitive_desc pd;
  MatmulConf conf;
};

std::shared_ptr<Packed> pack_weights(const void* w, const float* w_scale, const MatmulConf& conf) {
  ThreadScope threads(conf.threads);
  // [n, k] row-major is the k x n matrix with strides (1, k)
  memory::desc user({conf.k, conf.n}, type_of(conf.b), memory::dims{1, conf.k});
  memory src(user, engine(), const_cast<void*>(w));
  auto out = std::make_shared<Packed>();
  const auto layout = packed_layout_for(conf);
  if (layout.get_size() >= kHugePagesFrom) {
    out->buffer = huge_page_buffer(layout.get_size(), &out->huge_pages);
    out->mem = memory(layout, engine(), out->buffer.get());
  } else {
    out->mem = memory(layout, engine());
  }
  out->conf = conf;
  dnnl::stream s(engine());
  dnnl::reorder(src, out->mem).execute(s, src, out->mem);
  s.wait();
  if (conf.scaled) out->w_scale.assign(w_scale, w_scale + conf.n);
  return out;
}

int64_t packed_bytes(const Packed& p) { return static_cast<int64_t>(p.mem.get_desc().get_size()); }

bool packed_huge_pages(const Packed& p) { return p.huge_pages; }

std::string packed_layout(const Packed& p) {
  const auto d = p.mem.get_desc();
  std::ostringstream s;
  s << type_name(p.conf.b) << " " << d.get_inner_nblks() << " inner block(s)";
  for (int i = 0; i < d.get_inner_nblks(); ++i)
    s << (i ? "x" : " ") << d.get_inner_blks()[i] << "@" << d.get_inner_idxs()[i];
  return s.str();
}

PairedBlocks paired_blocks(const Packed& p) {
  const auto d = p.mem.get_desc();
  if (p.conf.b != kBF16 || p.conf.scaled || p.conf.k % 32 != 0 || d.get_inner_nblks() != 3)
    return {};
  const auto blks = d.get_inner_blks(), idxs = d.get_inner_idxs();
  const bool paired = blks[0] == 16 && idxs[0] == 0 && blks[1] == 64 && idxs[1] == 1 &&
                      blks[2] == 2 && idxs[2] == 0;
  if (!paired || d.get_submemory_offset() != 0) return {};
  const auto strides = d.get_strides();  // between outer blocks of dims (k, n), in elements
  PairedBlocks w;
  w.base = static_cast<const uint16_t*>(p.mem.get_data_handle());
  w.n = p.conf.n;
  w.k = p.conf.k;
  w.stride_k = strides[0];
  w.stride_n = strides[1];
  return w;
}

std::shared_ptr<Matmul> make_matmul(const MatmulConf& conf, const Packed& p) {
  ThreadScope threads(conf.threads);
  if (conf.n != p.conf.n || conf.k != p.conf.k || conf.b != p.conf.b)
    throw std::invalid_argument("make_matmul: " + describe(conf) +
                                " does not match the packed weights " + describe(p.conf));
  auto out = std::make_shared<Matmul>();
  out->pd = make_pd(conf, p.mem.get_desc());
  out->prim = dnnl::matmul(out->pd);
  out->conf = conf;
  return out;
}

int64_t scratchpad_bytes(const Matmul& mm) {
  return static_cast<int64_t>(mm.pd.scratchpad_desc().get_size());
}

std::string impl_name(const Matmul& mm) { return mm.pd.impl_info_str(); }

void run_matmul(const Matmul& mm, const Packed& p, const void* src, const void* bias, void* dst,
                void* scratchpad) {
  const MatmulConf& c = mm.conf;
  if (mm.pd.weights_desc() != p.mem.get_desc())
    throw std::invalid_argument("run_matmul: the weights are packed in another layout than the "
                                "primitive expects (" + describe(c) + ")");
  if ((c.bias != kNone) != (bias != nullptr))
    throw std::invalid_argument("run_matmul: bias given/absent unlike the primitive's problem");
  ThreadScope threads(c.threads);
  auto& eng = engine();
  std::unordered_map<int, memory> args{
      {DNNL_ARG_SRC, memory(mm.pd.src_desc(), eng, const_cast<void*>(src))},
      {DNNL_ARG_WEIGHTS, p.mem},
      {DNNL_ARG_DST, memory(mm.pd.dst_desc(), eng, dst)},
  };
  if (mm.pd.scratchpad_desc().get_size() > 0)
    args[DNNL_ARG_SCRATCHPAD] = memory(mm.pd.scratchpad_desc(), eng, scratchpad);
  if (c.scaled) {
    memory::desc ws({c.n}, Type::f32, Tag::a);
    args[DNNL_ARG_ATTR_SCALES | DNNL_ARG_WEIGHTS] =
        memory(ws, eng, const_cast<float*>(p.w_scale.data()));
  }
  if (bias) args[DNNL_ARG_BIAS] = memory(bias_desc(c), eng, const_cast<void*>(bias));
  dnnl::stream s(eng);
  mm.prim.execute(s, args);
  s.wait();
}

std::string onednn_version() {
  const dnnl_version_t* v = dnnl_version();
  std::ostringstream s;
  s << v->major << "." << v->minor << "." << v->patch;
  return s.str();
}

}  // namespace pa_onednn
