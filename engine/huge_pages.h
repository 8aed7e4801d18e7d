// Memory for the weights, which every forward pass streams, on transparent
// huge pages where the kernel offers them: on 4 KiB pages a decode token's
// weights are a TLB miss every 4 KiB (bench/RESULTS.md, "Weights on huge
// pages", has what it measured).
//
// Why our own allocator: glibc's malloc puts large arrays each in its own
// mapping, and a mapping gets huge pages only where a whole aligned 2 MiB of
// it asked for them before it was touched (glibc's glibc.malloc.hugetlb
// tunable does that, but only from the environment at process start). Here
// small arrays share 32 MiB chunks, 2 MiB aligned and marked MADV_HUGEPAGE
// before first use, and large ones get a mapping of their own. A chunk goes
// back to the system with its last array; space freed inside a live chunk is
// neither reused nor returned until then (weights live as long as their
// model). Untouched parts of a chunk cost address space only.
//
// The KV pool stays on malloc's pages: its blocks are touched as they are
// first used, and where THP is "madvise" (as on the hosts measured) that keeps a
// worker's resident memory growing by the blocks it holds, which the serving
// soak's leak check counts on.
//
// PDQ_HUGE_PAGES=0 (read once) uses malloc for the weights too, for
// same-machine comparisons; so does a kernel with THP "never". Under THP
// "always" the kernel may give malloc's large arrays huge pages anyway.
#pragma once

#include <cstddef>
#include <new>
#include <vector>

namespace pdq {

// At least 64-byte aligned; bytes 0 is allowed. Throws std::bad_alloc when
// the system has no memory left, like operator new.
void* AllocateHuge(size_t bytes);
// p from AllocateHuge (or null).
void FreeHuge(void* p);

// Whether AllocateHuge asks for huge pages: PDQ_HUGE_PAGES is not 0, off,
// false or no, and the kernel's THP mode is "always" or "madvise".
bool HugePagesEnabled();
// Bytes mapped for AllocateHuge now (chunks and own mappings; 0 when off).
size_t HugeMappedBytes();

template <typename T>
struct HugePageAllocator {
  using value_type = T;
  HugePageAllocator() = default;
  template <typename U>
  HugePageAllocator(const HugePageAllocator<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(AllocateHuge(n * sizeof(T))); }
  void deallocate(T* p, size_t) { FreeHuge(p); }
  template <typename U>
  bool operator==(const HugePageAllocator<U>&) const {
    return true;
  }
};

// A weight array: std::vector on AllocateHuge.
template <typename T>
using HugeVector = std::vector<T, HugePageAllocator<T>>;

}  // namespace pdq
