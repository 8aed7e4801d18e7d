// engine/huge_pages.h: arrays from the huge-page arena are aligned, apart and
// writable; chunks and own mappings go back to the system with their last
// array; a second free stops the process; where the kernel offers THP the
// memory is marked for it.
#include "engine/huge_pages.h"

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace pdq {
namespace {

TEST(HugePagesTest, ArraysAreAlignedApartAndWritable) {
  std::mt19937 rng(7);
  std::vector<std::pair<uint8_t*, size_t>> arrays;
  for (int i = 0; i < 200; ++i) {
    // 0 bytes to 1 MiB, and every 20th 3 MiB: many share a chunk, several
    // find too little room left in it.
    const size_t bytes = i % 50 == 0 ? 0 : i % 20 == 1 ? 3u << 20 : rng() % (1u << 20);
    auto* p = static_cast<uint8_t*>(AllocateHuge(bytes));
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u) << bytes;
    std::memset(p, i & 0xff, bytes);
    arrays.push_back({p, bytes});
  }
  // Each still holds its own pattern: no two overlap.
  for (size_t i = 0; i < arrays.size(); ++i) {
    const auto [p, bytes] = arrays[i];
    for (size_t j = 0; j < bytes; j += 4093) ASSERT_EQ(p[j], i & 0xff) << i << " at " << j;
    if (bytes > 0) {
      ASSERT_EQ(p[bytes - 1], i & 0xff) << i;
    }
  }
  for (auto [p, bytes] : arrays) FreeHuge(p);
  FreeHuge(nullptr);
}

// Whether [p, p + 4 KiB) is mapped: msync answers ENOMEM where it is not.
bool Mapped(void* p) { return msync(p, 4096, MS_ASYNC) == 0 || errno != ENOMEM; }

TEST(HugePagesTest, MemoryGoesBackWithTheLastArray) {
  if (!HugePagesEnabled()) GTEST_SKIP() << "huge pages off here (PDQ_HUGE_PAGES=0 or THP never)";
  // Every other test frees what it took, so no chunk is open.
  ASSERT_EQ(HugeMappedBytes(), 0u);
  constexpr size_t kMiB = size_t{1} << 20;
  auto* big = static_cast<uint8_t*>(AllocateHuge(20 * kMiB));  // its own mapping
  EXPECT_EQ(reinterpret_cast<uintptr_t>(big) % (2 * kMiB), 0u);
  std::memset(big, 7, 20 * kMiB);
  // 96 arrays of 1 MiB fill three 32 MiB chunks exactly: the 32nd of a chunk
  // takes its last byte, not a new chunk.
  std::vector<void*> small;
  for (int i = 0; i < 96; ++i) small.push_back(AllocateHuge(kMiB));
  EXPECT_EQ(HugeMappedBytes(), 20 * kMiB + 96 * kMiB);
  FreeHuge(big);
  EXPECT_FALSE(Mapped(big));
  for (void* p : small) FreeHuge(p);
  EXPECT_EQ(HugeMappedBytes(), 0u);
  EXPECT_FALSE(Mapped(small[0]));
  EXPECT_FALSE(Mapped(small[95]));
  // And again: the chunk being filled went back too, and a new one opens.
  void* again = AllocateHuge(100);
  EXPECT_EQ(HugeMappedBytes(), 32 * kMiB);
  FreeHuge(again);
  EXPECT_EQ(HugeMappedBytes(), 0u);
}

TEST(HugePagesDeathTest, FreeingTwiceStopsWithAMessage) {
  if (!HugePagesEnabled()) GTEST_SKIP() << "huge pages off here (PDQ_HUGE_PAGES=0 or THP never)";
  void* keep = AllocateHuge(100);  // keeps the chunk mapped, as a live model would
  void* p = AllocateHuge(100);
  FreeHuge(p);
  EXPECT_DEATH(FreeHuge(p), "PDQ_CHECK failed");
  FreeHuge(keep);
}

// A field of the mapping holding `p` in /proc/self/smaps.
std::string SmapsField(const void* p, const std::string& field) {
  std::ifstream f("/proc/self/smaps");
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  bool inside = false;
  for (std::string line; std::getline(f, line);) {
    uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> lo >> dash >> hi && dash == '-') {
      inside = lo <= a && a < hi;
      continue;
    }
    if (inside && line.rfind(field + ":", 0) == 0) {
      return line.substr(field.size() + 1);
    }
  }
  return "";
}

TEST(HugePagesTest, WeightArraysAreMarkedForHugePages) {
  if (!HugePagesEnabled()) GTEST_SKIP() << "huge pages off here (PDQ_HUGE_PAGES=0 or THP never)";
  HugeVector<uint8_t> weights(size_t{4} << 20, 1);
  // "hg": the mapping asked for huge pages (MADV_HUGEPAGE), whatever the
  // kernel's THP mode.
  const std::string flags = SmapsField(weights.data(), "VmFlags");
  ASSERT_FALSE(flags.empty()) << "no VmFlags for the arena's memory in /proc/self/smaps";
  EXPECT_NE((" " + flags + " ").find(" hg "), std::string::npos) << flags;
}

}  // namespace
}  // namespace pdq
