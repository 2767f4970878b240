// How fast two threads can stream a weight from memory while doing an M-row GEMV's arithmetic
// on it: the bound the LM-head GEMV (csrc/gemv.cpp) meets at 5-16 rows on a small x86 machine.
//
// Each thread streams its half of a buffer; every 64-byte line feeds `fmas` vdpbf16ps (an M-row
// GEMV does M per line). Two loop shapes:
//   ideal   one load then `fmas` FMAs on accumulators and broadcasts held in registers: nothing
//           but the stream and the arithmetic;
//   gemv    the kernel's shape: per k-pair step T lines, M activation pairs broadcast from an
//           L1-resident x, M x T FMAs (fmas per line = M).
// Rates are weight bytes read per second, beside the copy ceiling as plugin-api bench counts it
// (bytes read + written by a two-thread memcpy), measured in the same round.
//
// x86-64 with AVX-512 BF16 only. Build and run:
//   g++ -O3 -march=native -fopenmp tools/stream_fma_probe.cpp -o /tmp/stream_fma_probe
//   /tmp/stream_fma_probe [--mib 1024] [--rounds 3] [--json]
#include <immintrin.h>
#include <omp.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

float lane_sum(__m512 v) {
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, v);
  float s = 0;
  for (float f : lanes) s += f;
  return s;
}

template <int D>
float ideal(const char* p, int64_t bytes, const uint32_t*) {
  constexpr int kAcc = 24;  // > 2 pipes x 6 cycles of latency, and room for 8 broadcasts
  __m512 acc[kAcc];
  __m512bh xs[8];
  for (int i = 0; i < kAcc; ++i) acc[i] = _mm512_setzero_ps();
  for (int i = 0; i < 8; ++i) xs[i] = reinterpret_cast<__m512bh>(_mm512_set1_epi32(0x3f803f80 + i));
  for (int64_t o = 0; o < bytes; o += 256) {
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      const auto w = reinterpret_cast<__m512bh>(_mm512_load_si512(p + o + 64 * j));
      if constexpr (D == 0) acc[j] = _mm512_add_ps(acc[j], reinterpret_cast<__m512>(w));
#pragma GCC unroll 16
      for (int d = 0; d < D; ++d)
        acc[(j * D + d) % kAcc] = _mm512_dpbf16_ps(acc[(j * D + d) % kAcc], xs[d & 7], w);
    }
  }
  __m512 s = acc[0];
  for (int i = 1; i < kAcc; ++i) s = _mm512_add_ps(s, acc[i]);
  return lane_sum(s);  // returned so the loop is not dead
}

template <int M, int T>
float gemv(const char* p, int64_t bytes, const uint32_t* x) {
  __m512 acc[M][T];
  for (int m = 0; m < M; ++m)
    for (int t = 0; t < T; ++t) acc[m][t] = _mm512_setzero_ps();
  int64_t q = 0;
  for (int64_t o = 0; o + 64 * T <= bytes; o += 64 * T, q = (q + 1) & 2047) {
    __builtin_prefetch(p + o + 2048, 0, 0);  // as gemv.cpp: non-temporal, 2 KB ahead
    __m512bh w[T];
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) w[t] = reinterpret_cast<__m512bh>(_mm512_load_si512(p + o + 64 * t));
#pragma GCC unroll 16
    for (int m = 0; m < M; ++m) {
      const auto xv = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(x[m * 2048 + q])));
#pragma GCC unroll 4
      for (int t = 0; t < T; ++t) acc[m][t] = _mm512_dpbf16_ps(acc[m][t], xv, w[t]);
    }
  }
  __m512 s = _mm512_setzero_ps();
  for (int m = 0; m < M; ++m)
    for (int t = 0; t < T; ++t) s = _mm512_add_ps(s, acc[m][t]);
  return lane_sum(s);
}

struct Loop {
  std::string name;
  int fmas_per_line;
  float (*fn)(const char*, int64_t, const uint32_t*);
};

const std::vector<Loop>& loops() {
  static const std::vector<Loop> all = {
      {"ideal fmas=0", 0, ideal<0>},   {"ideal fmas=4", 4, ideal<4>},
      {"ideal fmas=8", 8, ideal<8>},   {"ideal fmas=16", 16, ideal<16>},
      {"gemv M=4 T=4", 4, gemv<4, 4>}, {"gemv M=8 T=3", 8, gemv<8, 3>},
      {"gemv M=8 T=2", 8, gemv<8, 2>}, {"gemv M=16 T=1", 16, gemv<16, 1>},
  };
  return all;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

char* huge_buffer(int64_t bytes, int fill) {
  auto* p = static_cast<char*>(std::aligned_alloc(2 << 20, bytes));
  if (p == nullptr) {
    std::fprintf(stderr, "stream_fma_probe: cannot allocate %lld bytes\n", static_cast<long long>(bytes));
    std::exit(2);
  }
  madvise(p, bytes, MADV_HUGEPAGE);
  std::memset(p, fill, bytes);
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t mib = 1024;
  int rounds = 3;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json") {
      json = true;
    } else if ((a == "--mib" || a == "--rounds") && i + 1 < argc) {
      const long v = std::strtol(argv[++i], nullptr, 10);
      if (v < 1) {
        std::fprintf(stderr, "stream_fma_probe: %s must be a positive integer\n", a.c_str());
        return 2;
      }
      if (a == "--mib") mib = v;
      else rounds = static_cast<int>(v);
    } else {
      std::fprintf(stderr, "usage: stream_fma_probe [--mib N] [--rounds N] [--json]\n");
      return 2;
    }
  }
  const int64_t bytes = ((mib << 20) / 1024) * 1024;  // each half a whole number of steps
  char* w = huge_buffer(bytes, 1);
  char* dst = huge_buffer(bytes / 2, 0);
  std::vector<uint32_t> x(16 * 2048, 0x3f803f80u);
  volatile float sink = 0;
  for (int round = 0; round < rounds; ++round) {
    std::vector<double> tc;
    for (int r = 0; r < 5; ++r) {
      const auto t0 = Clock::now();
#pragma omp parallel num_threads(2)
      {
        const int t = omp_get_thread_num();
        std::memcpy(dst + t * (bytes / 4), w + t * (bytes / 4), bytes / 4);
      }
      tc.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
    const double copy = bytes / median(tc) / 1e9;  // (bytes/2 read + bytes/2 written) / time
    if (!json) std::printf("round %d: copy ceiling %.1f GB/s\n", round + 1, copy);
    for (const Loop& l : loops()) {
      std::vector<double> ts;
      for (int r = 0; r < 5; ++r) {
        const auto t0 = Clock::now();
#pragma omp parallel num_threads(2)
        {
          const int t = omp_get_thread_num();
          const float f = l.fn(w + t * (bytes / 2), bytes / 2, x.data());
#pragma omp critical
          sink = sink + f;
        }
        ts.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
      }
      const double gbs = bytes / median(ts) / 1e9;
      const double tflops = gbs * l.fmas_per_line;  // 64 FLOP per FMA per 64-byte line
      if (json) {
        std::printf(
            "{\"round\": %d, \"copy_gbs\": %.2f, \"loop\": \"%s\", \"fmas_per_line\": %d, "
            "\"gbs\": %.2f, \"of_copy\": %.3f, \"gflops\": %.1f}\n",
            round + 1, copy, l.name.c_str(), l.fmas_per_line, gbs, gbs / copy, tflops);
      } else {
        std::printf("  %-14s %6.1f GB/s  %4.0f%% of copy  %6.1f GFLOP/s\n", l.name.c_str(), gbs,
                    100 * gbs / copy, tflops);
      }
      std::fflush(stdout);
    }
  }
  return 0;
}
