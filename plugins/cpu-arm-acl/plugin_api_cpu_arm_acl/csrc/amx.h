// AMX tiles on x86 (gemv.cpp, attention_tiles.h): whether this process may use them, and the
// tile configuration. Functions that run tile instructions carry PA_AMX (their own target
// attribute), so a translation unit compiled for AVX-512 BF16 holds them without -mamx-*.
#pragma once

#if defined(__AVX512BF16__)
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>

#define PA_AMX __attribute__((target("amx-tile,amx-bf16")))

namespace pa_amx {

// The CPU has AMX-BF16 and AMX-TILE (CPUID.(7,0):EDX bits 22, 24) and Linux granted this
// process the tile data state, which it hands out only on request (arch_prctl, once).
inline bool granted() {
  static const bool ok = [] {
    constexpr int kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    const bool bf16 = (d >> 22) & 1, tile = (d >> 24) & 1;
    return bf16 && tile && syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return ok;
}

struct alignas(64) TileConfig {  // ldtilecfg's 64-byte operand, palette 1
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};

  void set(int tile, int rows_, int bytes_per_row) {
    rows[tile] = static_cast<uint8_t>(rows_);
    colsb[tile] = static_cast<uint16_t>(bytes_per_row);
  }

  // GCC 12's _tile_loadconfig tells the compiler it reads 8 bytes, which let it drop the stores
  // of colsb and rows (tiles then unconfigured: SIGILL at the first tile op); the barrier keeps
  // all 64.
  PA_AMX void load() const {
    __asm__ __volatile__("" : : "m"(*this) : "memory");
    _tile_loadconfig(this);
  }
};

}  // namespace pa_amx
#endif
