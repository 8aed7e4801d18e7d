#include "engine/huge_pages.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <string>
#include <unordered_set>

#include "common/check.h"

namespace pdq {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;
constexpr size_t kChunk = size_t{32} << 20;
// Arrays this large get a mapping of their own (a chunk holds at least 4).
constexpr size_t kOwnMapping = kChunk / 4;
constexpr size_t kAlign = 64;

// n rounded up to a multiple of `to`.
constexpr size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

// What an array of `bytes` takes, on either path: at least one byte, in
// whole kAlign units (aligned_alloc wants a multiple of the alignment).
constexpr size_t Padded(size_t bytes) { return RoundUp(std::max<size_t>(bytes, 1), kAlign); }

bool ReadEnabled() {
  if (const char* v = std::getenv("PDQ_HUGE_PAGES"); v != nullptr) {
    for (const char* off : {"0", "off", "false", "no"}) {
      if (std::strcmp(v, off) == 0) return false;
    }
  }
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  const std::string mode((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return mode.find("[always]") != std::string::npos || mode.find("[madvise]") != std::string::npos;
}

// A 2 MiB-aligned anonymous mapping of `bytes` (a multiple of kHugePage),
// marked for huge pages before anything touches it; null if the system has
// no address space or memory left.
void* MapAligned(size_t bytes) {
  const size_t span = bytes + kHugePage;
  void* raw = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  const uintptr_t base = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = RoundUp(base, kHugePage);
  if (aligned > base) munmap(raw, aligned - base);
  if (aligned + bytes < base + span) {
    munmap(reinterpret_cast<void*>(aligned + bytes), base + span - aligned - bytes);
  }
  void* p = reinterpret_cast<void*>(aligned);
  madvise(p, bytes, MADV_HUGEPAGE);  // no THP in this kernel: small pages, same memory
  return p;
}

struct Chunk {
  size_t used = 0;  // bytes handed out from the start, bump-allocated
  size_t live = 0;  // arrays not yet freed
};

class Arena {
 public:
  void* Allocate(size_t bytes) {
    const size_t size = Padded(bytes);
    std::lock_guard<std::mutex> lock(mu_);
    if (size >= kOwnMapping) {
      const size_t mapped = RoundUp(size, kHugePage);
      void* p = MapAligned(mapped);
      if (p == nullptr) throw std::bad_alloc();
      own_[reinterpret_cast<uintptr_t>(p)] = mapped;
      mapped_ += mapped;
      return p;
    }
    if (current_ == 0 || chunks_[current_].used + size > kChunk) {
      void* p = MapAligned(kChunk);
      if (p == nullptr) throw std::bad_alloc();
      current_ = reinterpret_cast<uintptr_t>(p);
      chunks_[current_] = Chunk{};
      mapped_ += kChunk;
    }
    Chunk& c = chunks_[current_];
    void* p = reinterpret_cast<void*>(current_ + c.used);
    c.used += size;
    ++c.live;
    live_.insert(reinterpret_cast<uintptr_t>(p));
    return p;
  }

  void Free(void* p) {
    if (p == nullptr) return;
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = own_.find(a); it != own_.end()) {
      munmap(p, it->second);
      mapped_ -= it->second;
      own_.erase(it);
      return;
    }
    // A pointer AllocateHuge did not hand out, or one freed already, would
    // unmap a chunk under arrays still in use: stop here instead.
    PDQ_CHECK(live_.erase(a) == 1);
    auto it = std::prev(chunks_.upper_bound(a));  // the chunk holding a starts at or before it
    if (--it->second.live > 0) return;
    // Its last array: the whole chunk goes back (the current one too: the
    // next allocation maps a fresh one).
    munmap(reinterpret_cast<void*>(it->first), kChunk);
    mapped_ -= kChunk;
    if (it->first == current_) current_ = 0;
    chunks_.erase(it);
  }

  size_t mapped() {
    std::lock_guard<std::mutex> lock(mu_);
    return mapped_;
  }

 private:
  std::mutex mu_;
  std::map<uintptr_t, Chunk> chunks_;  // by start address
  std::map<uintptr_t, size_t> own_;    // own mappings: start -> bytes
  std::unordered_set<uintptr_t> live_;  // arrays handed out from chunks
  uintptr_t current_ = 0;              // the chunk being filled (0: none)
  size_t mapped_ = 0;
};

Arena& TheArena() {
  static Arena* arena = new Arena();  // never destroyed: frees may run at exit
  return *arena;
}

}  // namespace

bool HugePagesEnabled() {
  static const bool enabled = ReadEnabled();
  return enabled;
}

void* AllocateHuge(size_t bytes) {
  if (!HugePagesEnabled()) {
    void* p = std::aligned_alloc(kAlign, Padded(bytes));
    if (p == nullptr) throw std::bad_alloc();
    return p;
  }
  return TheArena().Allocate(bytes);
}

void FreeHuge(void* p) {
  if (!HugePagesEnabled()) {
    std::free(p);
    return;
  }
  TheArena().Free(p);
}

size_t HugeMappedBytes() { return HugePagesEnabled() ? TheArena().mapped() : 0; }

}  // namespace pdq
