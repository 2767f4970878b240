// Paged attention on the CPU (plugin-api cpu-arm-acl): plan, cache write, forward, split reduce.
//
// One work item = (request, KV head, tile of query tokens, key range). All query heads of the KV
// head are processed together (GQA), so each K/V block is read once per item. Long key ranges
// are split so that a batch of one request still keeps every thread busy; split items write
// unnormalised partials (m, l, acc) that a second pass combines. Items are taken from a shared
// counter, largest first. Per-thread scratch is allocated once and reused across calls.
#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "attention_kernels.h"

namespace pa_attn {

float g_fp8_table[256];

void init_fp8_table() {
  for (int i = 0; i < 256; ++i)
    g_fp8_table[i] = static_cast<float>(
        c10::Float8_e4m3fn(static_cast<uint8_t>(i), c10::Float8_e4m3fn::from_bits()));
}

namespace {

// A plan row (int32): see make_plan.
enum Field { kSeq, kKvh, kQ0, kQn, kPos0, kK0, kK1, kProw, kFields };
// A reduce row (int32): query token range, KV head, first partial row, number of splits.
enum RField { rQ0, rQn, rKvh, rProw, rSplits, rFields };

// Rows at or above this use the "rows" score layout (see attention_kernels.h).
constexpr int kRowsLayoutMin = 16;
// Partials per query row that one reduction combines (finish_row's stack arrays).
constexpr int64_t kMaxSplits = 64;

struct Geometry {
  int64_t heads, kv_heads, group, dim, block;
};

struct Masking {
  bool causal;
  int64_t window;  // 0: none
  float soft_cap;  // 0: none
};

// Visible global key range [lo, hi) of the query at position `pos` in a sequence of `len`.
inline void visible(const Masking& mk, int64_t pos, int64_t len, int64_t* lo, int64_t* hi) {
  if (!mk.causal) {
    *lo = 0;
    *hi = len;
    return;
  }
  *hi = pos + 1;
  *lo = mk.window > 0 ? std::max<int64_t>(0, pos - mk.window + 1) : 0;
}

// ---- plan --------------------------------------------------------------------------------------

// Items for one step. tile_rows: target query rows (tokens x group) per item; splits: long key
// ranges are cut into block-aligned parts of at least min_split_keys keys so that there are about
// 8 items per thread. Returns (items [U, kFields], reduce [E, rFields], partial_rows).
std::vector<torch::Tensor> make_plan(const torch::Tensor& query_start_loc,
                                     const torch::Tensor& seq_lens, int64_t group,
                                     int64_t kv_heads, int64_t block, bool causal, int64_t window,
                                     int64_t num_threads, int64_t tile_rows,
                                     int64_t min_split_keys) {
  const int32_t* qsl = query_start_loc.data_ptr<int32_t>();
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  const int64_t S = seq_lens.size(0);
  const Masking mk{causal, window, 0.f};
  const int64_t T = std::max<int64_t>(1, tile_rows / group);

  struct Tile {
    int32_t seq, q0, qn, pos0, k0, k1;
    int64_t cost;
  };
  std::vector<Tile> tiles;
  int64_t total = 0;
  for (int64_t s = 0; s < S; ++s) {
    const int32_t n = qsl[s + 1] - qsl[s], len = lens[s];
    for (int32_t t0 = 0; t0 < n; t0 += T) {
      const int32_t qn = static_cast<int32_t>(std::min<int64_t>(T, n - t0));
      const int32_t pos0 = len - n + t0;
      int64_t lo0, hi0, lo1, hi1;
      visible(mk, pos0, len, &lo0, &hi0);
      visible(mk, pos0 + qn - 1, len, &lo1, &hi1);
      const int64_t k0 = std::min(lo0, lo1), k1 = std::max(hi0, hi1);
      const int64_t cost = (k1 - k0 + block) * qn * group;  // + block: per-item overhead
      tiles.push_back({static_cast<int32_t>(s), qsl[s] + t0, qn, pos0, static_cast<int32_t>(k0),
                       static_cast<int32_t>(k1), cost});
      total += cost * kv_heads;
    }
  }
  const int64_t target = num_threads > 1 ? std::max<int64_t>(1, total / (num_threads * 8)) : 0;

  std::vector<std::array<int32_t, kFields>> items;
  std::vector<std::array<int32_t, rFields>> reduce;
  std::vector<int64_t> cost;
  int64_t prow = 0;
  for (const Tile& t : tiles) {
    const int64_t rows = static_cast<int64_t>(t.qn) * group;
    const int64_t first_block = t.k0 / block, last_block = (t.k1 - 1) / block;
    const int64_t nblocks = last_block - first_block + 1;
    int64_t splits = 1;
    if (target > 0 && t.cost > target) {
      const int64_t by_cost = (t.cost + target - 1) / target;
      const int64_t by_len = std::max<int64_t>(1, (t.k1 - t.k0) / min_split_keys);
      splits = std::min({by_cost, by_len, nblocks, kMaxSplits});
    }
    for (int64_t h = 0; h < kv_heads; ++h) {
      if (splits > 1)
        reduce.push_back({t.q0, t.qn, static_cast<int32_t>(h), static_cast<int32_t>(prow),
                          static_cast<int32_t>(splits)});
      for (int64_t p = 0; p < splits; ++p) {
        const int64_t b0 = first_block + nblocks * p / splits;
        const int64_t b1 = first_block + nblocks * (p + 1) / splits;
        const int32_t k0 = static_cast<int32_t>(std::max<int64_t>(t.k0, b0 * block));
        const int32_t k1 = static_cast<int32_t>(std::min<int64_t>(t.k1, b1 * block));
        items.push_back({t.seq, static_cast<int32_t>(h), t.q0, t.qn, t.pos0, k0, k1,
                         splits > 1 ? static_cast<int32_t>(prow) : -1});
        cost.push_back((k1 - k0 + block) * rows);
        if (splits > 1) prow += rows;
      }
    }
  }
  // largest first: the shared counter then balances the tail
  std::vector<int64_t> order(items.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return cost[a] > cost[b]; });
  auto items_t = torch::empty({static_cast<int64_t>(items.size()), kFields}, torch::kInt32);
  int32_t* it = items_t.data_ptr<int32_t>();
  for (size_t i = 0; i < order.size(); ++i)
    std::memcpy(it + i * kFields, items[order[i]].data(), sizeof(int32_t) * kFields);
  auto reduce_t = torch::empty({static_cast<int64_t>(reduce.size()), rFields}, torch::kInt32);
  if (!reduce.empty())
    std::memcpy(reduce_t.data_ptr<int32_t>(), reduce.data(),
                sizeof(int32_t) * rFields * reduce.size());
  return {items_t, reduce_t, torch::tensor(prow, torch::kInt64)};
}

// ---- per-thread scratch ------------------------------------------------------------------------

struct Scratch {
  std::vector<float> buf;
  float* q;      // dot: [R][D] ; rows: Q^T [D][Rp]
  float* acc;    // [Rp][D]
  float* s;      // dot: [R][bs] ; rows: [bs][Rp]
  float* kf;     // rows: K block as fp32 [bs][D]
  float* vf;     // rows: V block as fp32 [bs][D]
  float* m;      // [Rp]
  float* l;      // [Rp]
  float* alpha;  // [Rp]
  float* lo;     // [Rp] rows layout: visible key range as fp32
  float* hi;     // [Rp]
  std::vector<int> a, b;

  void reserve(int64_t Rp, int64_t D, int64_t bs) {
    const int64_t align = 16;  // floats: 64 bytes
    auto up = [&](int64_t n) { return (n + align - 1) / align * align; };
    const int64_t sizes[] = {Rp * D, Rp * D, Rp * bs, bs * D, bs * D, Rp, Rp, Rp, Rp, Rp};
    int64_t total = align;
    for (int64_t n : sizes) total += up(n);
    if (static_cast<int64_t>(buf.size()) < total) buf.resize(total);  // grows once, then reused
    float* p = buf.data();
    p += (align - (reinterpret_cast<uintptr_t>(p) / sizeof(float)) % align) % align;
    float** slots[] = {&q, &acc, &s, &kf, &vf, &m, &l, &alpha, &lo, &hi};
    for (int i = 0; i < 10; ++i) {
      *slots[i] = p;
      p += up(sizes[i]);
    }
    if (static_cast<int64_t>(a.size()) < Rp) {
      a.resize(Rp);
      b.resize(Rp);
    }
  }
};

Scratch& scratch() {
  thread_local Scratch w;
  return w;
}

// ---- one work item -----------------------------------------------------------------------------

struct Step {
  Geometry g;
  Masking mk;
  float scale;  // softmax scale, times k_scale for an fp8 cache
  const int32_t* block_table;
  int64_t bt_stride;
  const int32_t* seq_lens;
};

// Attend one item's rows (prepared in w.q) over its key range; leaves m, l, acc in w.
template <typename KT>
void attend(const Step& st, const int32_t* item, const KT* cache, Scratch& w, bool rows_layout,
            int64_t Rp) {
  const Geometry& g = st.g;
  const int64_t D = g.dim, bs = g.block, G = g.group;
  const int R = item[kQn] * static_cast<int>(G);
  const int64_t len = st.seq_lens[item[kSeq]], k0 = item[kK0], k1 = item[kK1];
  // per-row visible key range, clipped to the item's range
  for (int64_t r = 0; r < Rp; ++r) {
    int64_t lo = 0, hi = 0;
    if (r < R) {
      visible(st.mk, item[kPos0] + r / G, len, &lo, &hi);
      lo = std::max(lo, k0);
      hi = std::min(hi, k1);
    }
    w.lo[r] = static_cast<float>(lo);
    w.hi[r] = static_cast<float>(std::max(lo, hi));
    w.m[r] = kNegInf;
    w.l[r] = 0.f;
  }
  std::fill(w.acc, w.acc + static_cast<int64_t>(R) * D, 0.f);
  float min_hi = k1, max_lo = k0;
  for (int r = 0; r < R; ++r) {
    min_hi = std::min(min_hi, w.hi[r]);
    max_lo = std::max(max_lo, w.lo[r]);
  }
  const int32_t* table = st.block_table + item[kSeq] * st.bt_stride;
  const int64_t head_stride = bs * D, kv_stride = g.kv_heads * head_stride;
  const int64_t first = k0 / bs, last = (k1 - 1) / bs;
  for (int64_t b = first; b <= last; ++b) {
    const int64_t kb = b * bs;
    const int j0 = static_cast<int>(std::max<int64_t>(k0 - kb, 0));
    const int j1 = static_cast<int>(std::min<int64_t>(k1 - kb, bs));
    const KT* kp = cache + (static_cast<int64_t>(table[b]) * 2 * g.kv_heads + item[kKvh]) *
                               head_stride;
    const KT* vp = kp + kv_stride;
    if (b < last) {
      const KT* next = cache + (static_cast<int64_t>(table[b + 1]) * 2 * g.kv_heads +
                                item[kKvh]) * head_stride;
      prefetch(next, head_stride * sizeof(KT));
      prefetch(next + kv_stride, head_stride * sizeof(KT));
    }
    if (rows_layout) {
      for (int j = 0; j < bs; ++j) {
        float* kr = w.kf + j * D;
        if (j < j0 || j >= j1) {
          std::fill(kr, kr + D, 0.f);
          continue;
        }
        float* vr = w.vf + j * D;
        for (int64_t d = 0; d < D; d += kV) {
          load_f32(kp + j * D + d).store(kr + d);
          load_f32(vp + j * D + d).store(vr + d);
        }
      }
      qk_rows(w.kf, w.q, D, Rp, static_cast<int>(bs), w.s);
      const bool full = max_lo <= kb + j0 && min_hi >= kb + j1;
      softmax_rows(w.s, Rp, j0, j1, static_cast<float>(kb), w.lo, w.hi, full, st.mk.soft_cap,
                   w.m, w.l, w.alpha);
      pv(R, w.s, 1, Rp, static_cast<const float*>(w.vf), D, j0, j1, w.alpha, w.acc);
    } else {
      qk_dot(R, w.q, kp, D, j0, j1, w.s, bs);
      for (int r = 0; r < R; ++r) {
        w.a[r] = static_cast<int>(std::clamp<int64_t>(static_cast<int64_t>(w.lo[r]) - kb, j0, j1));
        w.b[r] = static_cast<int>(std::clamp<int64_t>(static_cast<int64_t>(w.hi[r]) - kb, j0, j1));
      }
      softmax_dot(w.s, bs, R, j0, j1, w.a.data(), w.b.data(), st.mk.soft_cap, w.m, w.l,
                  w.alpha);
      pv(R, w.s, bs, 1, vp, D, j0, j1, w.alpha, w.acc);
    }
  }
}

// Query rows of an item, scaled, as fp32: dot layout [R][D], rows layout Q^T [D][Rp].
template <typename QT>
void load_queries(const Step& st, const int32_t* item, const QT* query, Scratch& w,
                  bool rows_layout, int64_t Rp) {
  const int64_t D = st.g.dim, G = st.g.group, H = st.g.heads;
  const int R = item[kQn] * static_cast<int>(G);
  for (int r = 0; r < R; ++r) {
    const QT* src = query + ((item[kQ0] + r / G) * H + item[kKvh] * G + r % G) * D;
    if (rows_layout) {
      for (int64_t d = 0; d < D; ++d) w.q[d * Rp + r] = static_cast<float>(src[d]) * st.scale;
    } else {
      for (int64_t d = 0; d < D; ++d) w.q[r * D + d] = static_cast<float>(src[d]) * st.scale;
    }
  }
  if (rows_layout)
    for (int64_t d = 0; d < D; ++d) std::fill(w.q + d * Rp + R, w.q + (d + 1) * Rp, 0.f);
}

// out_row = sum_s w_s acc_s / (sum_s w_s l_s + sink term), w_s = e^(m_s - M), times v_scale.
template <typename QT>
void finish_row(const float* const* acc, const float* m, const float* l, int splits,
                const float* sink, float v_scale, int64_t D, QT* out) {
  float M = sink ? *sink : kNegInf;
  for (int s = 0; s < splits; ++s) M = std::max(M, m[s]);
  if (M == kNegInf) {  // no visible key and no sink
    std::fill(out, out + D, static_cast<QT>(0.f));
    return;
  }
  float wts[kMaxSplits];
  float denom = sink ? std::exp(*sink - M) : 0.f;
  for (int s = 0; s < splits; ++s) {
    wts[s] = m[s] == kNegInf ? 0.f : std::exp(m[s] - M);
    denom += wts[s] * l[s];
  }
  const float norm = denom > 0.f ? v_scale / denom : 0.f;
  for (int64_t d = 0; d < D; d += kV) {
    Vec o(0.f);
    for (int s = 0; s < splits; ++s) o = at::vec::fmadd(Vec(wts[s]), Vec::loadu(acc[s] + d), o);
    alignas(64) float tmp[kV];
    (o * Vec(norm)).store(tmp);
    for (int i = 0; i < kV; ++i) out[d + i] = static_cast<QT>(tmp[i]);
  }
}

struct Buffers {
  float* pacc;  // [partial_rows, D]
  float* pml;   // [partial_rows, 2]
  const float* sinks;
  float v_scale;
};

template <typename KT, typename QT>
void run_items(const Step& st, const torch::Tensor& items, const KT* cache, const QT* query,
               QT* out, const Buffers& bufs) {
  const int64_t U = items.size(0);
  const int32_t* it = items.data_ptr<int32_t>();
  const int64_t D = st.g.dim, G = st.g.group, H = st.g.heads;
  std::atomic<int64_t> next{0};
  const int64_t workers = std::min<int64_t>(at::get_num_threads(), std::max<int64_t>(U, 1));
  at::parallel_for(0, workers, 1, [&](int64_t, int64_t) {
    Scratch& w = scratch();
    for (int64_t u = next.fetch_add(1); u < U; u = next.fetch_add(1)) {
      const int32_t* item = it + u * kFields;
      const int R = item[kQn] * static_cast<int>(G);
      const bool rows_layout = R >= kRowsLayoutMin;
      const int64_t Rp = rows_layout ? (R + kV - 1) / kV * kV : R;
      w.reserve(Rp, D, st.g.block);
      load_queries(st, item, query, w, rows_layout, Rp);
      attend(st, item, cache, w, rows_layout, Rp);
      if (item[kProw] >= 0) {
        float* pacc = bufs.pacc + static_cast<int64_t>(item[kProw]) * D;
        float* pml = bufs.pml + static_cast<int64_t>(item[kProw]) * 2;
        std::memcpy(pacc, w.acc, sizeof(float) * R * D);
        for (int r = 0; r < R; ++r) {
          pml[2 * r] = w.m[r];
          pml[2 * r + 1] = w.l[r];
        }
        continue;
      }
      for (int r = 0; r < R; ++r) {
        const int64_t h = item[kKvh] * G + r % G;
        const float* acc = w.acc + r * D;
        finish_row(&acc, w.m + r, w.l + r, 1, bufs.sinks ? bufs.sinks + h : nullptr,
                   bufs.v_scale, D, out + ((item[kQ0] + r / G) * H + h) * D);
      }
    }
  });
}

template <typename QT>
void run_reduce(const Step& st, const torch::Tensor& reduce, QT* out, const Buffers& bufs) {
  const int64_t E = reduce.size(0), D = st.g.dim, G = st.g.group, H = st.g.heads;
  const int32_t* rd = reduce.data_ptr<int32_t>();
  at::parallel_for(0, E, 1, [&](int64_t e0, int64_t e1) {
    const float* acc[kMaxSplits];
    float m[kMaxSplits], l[kMaxSplits];
    for (int64_t e = e0; e < e1; ++e) {
      const int32_t* x = rd + e * rFields;
      const int64_t R = static_cast<int64_t>(x[rQn]) * G;
      for (int64_t r = 0; r < R; ++r) {
        for (int s = 0; s < x[rSplits]; ++s) {
          const int64_t row = x[rProw] + s * R + r;
          acc[s] = bufs.pacc + row * D;
          m[s] = bufs.pml[2 * row];
          l[s] = bufs.pml[2 * row + 1];
        }
        const int64_t h = x[rKvh] * G + r % G;
        finish_row(acc, m, l, x[rSplits], bufs.sinks ? bufs.sinks + h : nullptr, bufs.v_scale,
                   D, out + ((x[rQ0] + r / G) * H + h) * D);
      }
    }
  });
}

template <typename T>
using CType = std::conditional_t<
    std::is_same_v<T, at::BFloat16>, c10::BFloat16,
    std::conditional_t<std::is_same_v<T, at::Half>, c10::Half, T>>;

void forward(const torch::Tensor& query, const torch::Tensor& cache,
             const torch::Tensor& block_table, const torch::Tensor& seq_lens,
             const torch::Tensor& items, const torch::Tensor& reduce,
             const torch::Tensor& partial_acc, const torch::Tensor& partial_ml,
             const std::optional<torch::Tensor>& sinks, torch::Tensor& out, int64_t kv_heads,
             int64_t block, double scale, double k_scale, double v_scale, bool causal,
             int64_t window, double soft_cap) {
  const int64_t H = query.size(1), D = query.size(2);
  Step st{{H, kv_heads, H / kv_heads, D, block},
          {causal, window, static_cast<float>(soft_cap)},
          static_cast<float>(scale * k_scale),
          block_table.data_ptr<int32_t>(),
          block_table.stride(0),
          seq_lens.data_ptr<int32_t>()};
  Buffers bufs{partial_acc.data_ptr<float>(), partial_ml.data_ptr<float>(),
               sinks ? sinks->data_ptr<float>() : nullptr, static_cast<float>(v_scale)};
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, query.scalar_type(), "pa_q", [&] {
    using QT = CType<scalar_t>;
    const QT* q = reinterpret_cast<const QT*>(query.data_ptr<scalar_t>());
    QT* o = reinterpret_cast<QT*>(out.data_ptr<scalar_t>());
    switch (cache.scalar_type()) {
      case at::kFloat: run_items(st, items, cache.data_ptr<float>(), q, o, bufs); break;
      case at::kBFloat16:
        run_items(st, items, reinterpret_cast<const c10::BFloat16*>(cache.data_ptr()), q, o,
                  bufs);
        break;
      case at::kHalf:
        run_items(st, items, reinterpret_cast<const c10::Half*>(cache.data_ptr()), q, o, bufs);
        break;
      case at::kFloat8_e4m3fn:
        run_items(st, items, reinterpret_cast<const c10::Float8_e4m3fn*>(cache.data_ptr()), q, o,
                  bufs);
        break;
      default: TORCH_CHECK(false, "cpu attention: unsupported cache dtype ", cache.scalar_type());
    }
    if (reduce.size(0) > 0) run_reduce(st, reduce, o, bufs);
  });
}

// ---- cache write -------------------------------------------------------------------------------

// key/value [T, KH, D] (last dim contiguous) -> cache [nb, 2, KH, bs, D] at slot_mapping[t];
// slot -1 is skipped. An fp8 cache stores cast_rne(clamp(x / scale, -448, 448)).
template <typename IT, typename CT>
void write_kv_typed(const torch::Tensor& key, const torch::Tensor& value, torch::Tensor& cache,
                    const int64_t* slots, int64_t tokens, float k_scale, float v_scale) {
  const int64_t KH = key.size(1), D = key.size(2), bs = cache.size(3);
  CT* c = reinterpret_cast<CT*>(cache.data_ptr());
  const IT* ks = reinterpret_cast<const IT*>(key.data_ptr());
  const IT* vs = reinterpret_cast<const IT*>(value.data_ptr());
  constexpr bool fp8 = std::is_same_v<CT, c10::Float8_e4m3fn>;
  at::parallel_for(0, tokens, 16, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t slot = slots[t];
      if (slot < 0) continue;
      const int64_t blk = slot / bs, off = slot % bs;
      for (int kv = 0; kv < 2; ++kv) {
        const IT* src = kv == 0 ? ks + t * key.stride(0) : vs + t * value.stride(0);
        const int64_t hs = kv == 0 ? key.stride(1) : value.stride(1);
        const float scale = kv == 0 ? k_scale : v_scale;
        for (int64_t h = 0; h < KH; ++h) {
          CT* dst = c + (((blk * 2 + kv) * KH + h) * bs + off) * D;
          const IT* x = src + h * hs;
          for (int64_t d = 0; d < D; ++d) {
            float f = static_cast<float>(x[d]);
            if constexpr (fp8) f = std::min(std::max(f / scale, -448.f), 448.f);
            dst[d] = static_cast<CT>(f);
          }
        }
      }
    }
  });
}

void write_kv(const torch::Tensor& key, const torch::Tensor& value, torch::Tensor& cache,
              const torch::Tensor& slot_mapping, int64_t tokens, double k_scale, double v_scale) {
  const int64_t* slots = slot_mapping.data_ptr<int64_t>();
  const float ks = static_cast<float>(k_scale), vs = static_cast<float>(v_scale);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, key.scalar_type(), "pa_kv", [&] {
    using IT = CType<scalar_t>;
    switch (cache.scalar_type()) {
      case at::kFloat: write_kv_typed<IT, float>(key, value, cache, slots, tokens, ks, vs); break;
      case at::kBFloat16:
        write_kv_typed<IT, c10::BFloat16>(key, value, cache, slots, tokens, ks, vs);
        break;
      case at::kHalf: write_kv_typed<IT, c10::Half>(key, value, cache, slots, tokens, ks, vs); break;
      case at::kFloat8_e4m3fn:
        write_kv_typed<IT, c10::Float8_e4m3fn>(key, value, cache, slots, tokens, ks, vs);
        break;
      default: TORCH_CHECK(false, "cpu attention: unsupported cache dtype ", cache.scalar_type());
    }
  });
}

torch::Tensor fp8_table() { return torch::from_blob(g_fp8_table, {256}, torch::kFloat32).clone(); }

}  // namespace
}  // namespace pa_attn

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  pa_attn::init_fp8_table();
  namespace py = pybind11;
  const auto nogil = py::call_guard<py::gil_scoped_release>();
  m.def("plan", &pa_attn::make_plan, nogil);
  m.def("forward", &pa_attn::forward, nogil);
  m.def("write_kv", &pa_attn::write_kv, nogil);
  m.def("fp8_table", &pa_attn::fp8_table);
  m.attr("vector_width") = pa_attn::kV;
}
