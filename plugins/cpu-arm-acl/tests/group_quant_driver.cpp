// Runs csrc/group_quant.cpp without torch (test_quant_neon.py builds it for aarch64, with and
// without -DPA_GROUP_QUANT_SCALAR, and runs it under qemu-aarch64). Reads cases from stdin until
// its end, each: int64 x_dt (kernels.h's Dt), m, k, group, fp8, ue8m0, column-major scales;
// double eps; then m * k input elements. Writes per case the m * k code bytes and the m * (k /
// group) fp32 scales in row-major order. Prints the vector path compiled in to stderr.
#include <cstdint>
#include <cstdio>
#include <vector>

#include "group_quant.cpp"

namespace {

bool read_all(void* p, size_t n) { return std::fread(p, 1, n, stdin) == n; }

}  // namespace

int main() {
  std::fprintf(stderr, "%s\n", pa_onednn::group_quant_isa());
  for (;;) {
    int64_t h[7];
    double eps;
    if (!read_all(h, sizeof(h))) return 0;  // no more cases
    if (!read_all(&eps, sizeof(eps))) return 2;
    const int64_t dt = h[0], m = h[1], k = h[2], group = h[3];
    const bool fp8 = h[4] != 0, ue8m0 = h[5] != 0, col = h[6] != 0;
    if (m <= 0 || k <= 0 || group <= 0 || k % group != 0) {
      std::fprintf(stderr, "bad case: m=%lld k=%lld group=%lld\n", static_cast<long long>(m),
                   static_cast<long long>(k), static_cast<long long>(group));
      return 2;
    }
    const int64_t elt = dt == pa_onednn::kF32 ? 4 : 2, groups = k / group;
    std::vector<unsigned char> x(static_cast<size_t>(m * k * elt));
    if (!read_all(x.data(), x.size())) return 2;
    std::vector<unsigned char> q(static_cast<size_t>(m * k));
    std::vector<float> scales(static_cast<size_t>(m * groups));
    const int64_t s_row = col ? 1 : groups, s_col = col ? m : 1;
    pa_onednn::group_quant(x.data(), dt, m, k, group, fp8, static_cast<float>(eps), ue8m0,
                           false, q.data(), scales.data(), s_row, s_col, 1);
    std::vector<float> rows(scales.size());
    for (int64_t r = 0; r < m; ++r)
      for (int64_t g = 0; g < groups; ++g) rows[r * groups + g] = scales[r * s_row + g * s_col];
    std::fwrite(q.data(), 1, q.size(), stdout);
    std::fwrite(rows.data(), sizeof(float), rows.size(), stdout);
  }
}
