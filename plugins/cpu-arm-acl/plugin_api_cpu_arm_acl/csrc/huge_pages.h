// Memory for packed weights. The decode GEMV streams every weight once per step; with 4 KB
// pages each page costs a TLB miss (a nested page walk in a VM), and Linux's common THP mode,
// `madvise`, gives huge pages only to ranges that ask before their first write.
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <cstdlib>
#include <memory>
#include <new>

namespace pa_onednn {

// Weights smaller than this stay with their usual allocator.
constexpr size_t kHugePagesFrom = size_t{4} << 20;
constexpr size_t kHugePage = size_t{2} << 20;

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using HugeBuffer = std::unique_ptr<void, FreeDeleter>;

// At least `bytes` of 2 MiB-aligned memory that asked the kernel for transparent huge pages;
// *asked is whether the kernel accepted the request (it may still have none to give).
inline HugeBuffer huge_page_buffer(size_t bytes, bool* asked) {
  const size_t size = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  void* p = nullptr;
  if (posix_memalign(&p, kHugePage, size) != 0) throw std::bad_alloc();
  *asked = false;
#ifdef MADV_HUGEPAGE
  *asked = madvise(p, size, MADV_HUGEPAGE) == 0;
#endif
  return HugeBuffer(p);
}

}  // namespace pa_onednn
