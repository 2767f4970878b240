// Paged attention on the CPU (plugin-api cpu-arm-acl): the plan of a step.
//
// One work item = (request, KV heads, tile of query tokens, key range). All query heads of a KV
// head are processed together (GQA), so each K/V block is read once per item. A decode item takes
// up to kMaxHeadGroup KV heads: a cache block stores its heads next to each other, so the item
// reads one contiguous run of (heads x 2 x block x head size) elements per block instead of
// 4 KB pieces of it at unrelated times. Long key ranges are split so that a batch of one request
// still keeps every thread busy; split items write unnormalised partials (m, l, acc) that a
// second pass combines. Items are taken from a shared counter, largest first.
#include "attention_plan.h"

#include <numeric>

namespace pa_attn {

Plan make_plan(const int32_t* qsl, const int32_t* lens, int64_t S, int64_t group,
               int64_t kv_heads, int64_t block, bool causal, int64_t window, int64_t num_threads,
               int64_t tile_rows, int64_t min_split_keys) {
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

  Plan plan;
  std::vector<std::array<int32_t, kFields>> items;
  std::vector<int64_t> cost;
  for (const Tile& t : tiles) {
    const int64_t rows = static_cast<int64_t>(t.qn) * group;
    const int64_t hg = rows < kRowsLayoutMin ? std::min(kv_heads, kMaxHeadGroup) : 1;
    const int64_t first_block = t.k0 / block, last_block = (t.k1 - 1) / block;
    const int64_t nblocks = last_block - first_block + 1;
    int64_t splits = 1;
    if (target > 0 && t.cost * hg > target) {
      const int64_t by_cost = (t.cost * hg + target - 1) / target;
      const int64_t by_len = std::max<int64_t>(1, (t.k1 - t.k0) / min_split_keys);
      splits = std::min({by_cost, by_len, nblocks, kMaxSplits});
    }
    for (int64_t h = 0; h < kv_heads; h += hg) {
      const int64_t n = std::min(hg, kv_heads - h), item_rows = rows * n;
      const int32_t prow = static_cast<int32_t>(plan.partial_rows);
      if (splits > 1)
        plan.reduce.push_back({t.q0, t.qn, static_cast<int32_t>(h), static_cast<int32_t>(n),
                               prow, static_cast<int32_t>(splits)});
      for (int64_t p = 0; p < splits; ++p) {
        const int64_t b0 = first_block + nblocks * p / splits;
        const int64_t b1 = first_block + nblocks * (p + 1) / splits;
        const int32_t k0 = static_cast<int32_t>(std::max<int64_t>(t.k0, b0 * block));
        const int32_t k1 = static_cast<int32_t>(std::min<int64_t>(t.k1, b1 * block));
        items.push_back({t.seq, static_cast<int32_t>(h), static_cast<int32_t>(n), t.q0, t.qn,
                         t.pos0, k0, k1,
                         splits > 1 ? static_cast<int32_t>(plan.partial_rows) : -1});
        cost.push_back((k1 - k0 + block) * item_rows);
        if (splits > 1) plan.partial_rows += item_rows;
      }
    }
  }
  // largest first: the shared counter then balances the tail
  std::vector<int64_t> order(items.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return cost[a] > cost[b]; });
  plan.items.reserve(items.size());
  for (int64_t i : order) plan.items.push_back(items[i]);
  return plan;
}

}  // namespace pa_attn
