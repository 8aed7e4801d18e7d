// Memory for the weights, which every forward pass streams, on transparent
// huge pages where the kernel offers them. A decode token reads
// all of a model's weights (96 MB for SmolLM2 at W4A16): on 4 KiB pages that
// is a TLB miss every 4 KiB, each a two-level page walk in a virtual machine;
// on 2 MiB pages batch-1 decode ran 8-12% faster on a 2-vCPU Zen 4 guest
// (geometric means of six alternations; bench/RESULTS.md, "Weights on huge
// pages").
//
// Why our own allocator: glibc's malloc puts large arrays each in its own
// mmap, which the kernel gives huge pages only where a whole aligned 2 MiB
// lies inside one mapping that asked for them before it was touched (glibc's
// glibc.malloc.hugetlb tunable does that, but only from the environment at
// process start). Here small arrays share 32 MiB chunks, 2 MiB aligned and
// marked MADV_HUGEPAGE before first use, and large ones get a mapping of
// their own; a chunk goes back to the system when its last array is freed.
// Untouched parts of a chunk cost address space only.
//
// The KV pool stays on small pages: its blocks are touched as they are first
// used, and on 2 MiB pages a worker's resident memory would grow in steps of
// up to 2 MiB per layer's K and V, which the serving soak's leak check
// (resident growth beyond the KV held) would read as a leak.
//
// PDQ_HUGE_PAGES=0 (read once) uses plain malloc instead, for same-machine
// comparisons; so does a kernel with THP "never" (the memory is the same,
// the pages small).
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

// Whether AllocateHuge asks for huge pages: PDQ_HUGE_PAGES is not 0 and the
// kernel's THP mode is "always" or "madvise".
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
