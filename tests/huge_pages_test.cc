// engine/huge_pages.h: arrays from the huge-page arena are aligned, apart and
// writable; chunks and own mappings go back to the system with their last
// array; where the kernel offers THP the memory is marked for it.
#include "engine/huge_pages.h"

#include <gtest/gtest.h>

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
  for (int i = 0; i < 300; ++i) {
    // 0 bytes to 3 MiB: many share a chunk, several fill it past its end.
    const size_t bytes = i % 50 == 0 ? 0 : rng() % (3u << 20);
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
    if (bytes > 0) ASSERT_EQ(p[bytes - 1], i & 0xff) << i;
  }
  for (auto [p, bytes] : arrays) FreeHuge(p);
  FreeHuge(nullptr);
}

TEST(HugePagesTest, MemoryGoesBackWithTheLastArray) {
  if (!HugePagesEnabled()) GTEST_SKIP() << "huge pages off here (PDQ_HUGE_PAGES=0 or THP never)";
  const size_t before = HugeMappedBytes();
  void* big = AllocateHuge(size_t{20} << 20);  // its own mapping, 2 MiB aligned
  EXPECT_EQ(reinterpret_cast<uintptr_t>(big) % (size_t{2} << 20), 0u);
  EXPECT_GE(HugeMappedBytes(), before + (size_t{20} << 20));
  std::vector<void*> small;
  for (int i = 0; i < 100; ++i) small.push_back(AllocateHuge(1 << 20));  // a few chunks
  EXPECT_GE(HugeMappedBytes(), before + (size_t{120} << 20));
  FreeHuge(big);
  for (void* p : small) FreeHuge(p);
  EXPECT_EQ(HugeMappedBytes(), before);
  // And again: the chunk being filled went back too, and a new one opens.
  void* again = AllocateHuge(100);
  EXPECT_GT(HugeMappedBytes(), before);
  FreeHuge(again);
  EXPECT_EQ(HugeMappedBytes(), before);
}

// The mapping holding `p` in /proc/self/smaps says whether THP may back it.
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
      std::istringstream rest(line.substr(field.size() + 1));
      std::string value;
      rest >> value;
      return value;
    }
  }
  return "";
}

TEST(HugePagesTest, WeightArraysAreMarkedForHugePages) {
  if (!HugePagesEnabled()) GTEST_SKIP() << "huge pages off here (PDQ_HUGE_PAGES=0 or THP never)";
  HugeVector<uint8_t> weights(size_t{4} << 20, 1);
  const std::string eligible = SmapsField(weights.data(), "THPeligible");
  if (eligible.empty()) GTEST_SKIP() << "this kernel's smaps has no THPeligible";
  EXPECT_EQ(eligible, "1");  // under THP "madvise", only with MADV_HUGEPAGE
}

}  // namespace
}  // namespace pdq
