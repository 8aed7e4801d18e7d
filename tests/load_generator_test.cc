// The load generator's request counts: pdq bench gives every request of a
// sweep a text of its own from them (a repeated text would be answered from
// the server's prefix cache), so they must match what RunSweep sends.
#include "harness/load_generator.h"

#include "gtest/gtest.h"

namespace pdq {
namespace {

TEST(LoadGeneratorTest, SweepRequestsCountsEveryLevelAndItsWarmup) {
  SweepOptions o;
  o.levels = {1, 2, 4, 8, 16};
  o.per_client = 4;
  o.warmup = 1;
  // bench/load_bench.sh's sweep: 4 per client at each level, one warm-up each.
  EXPECT_EQ(SweepRequests(o), 4 * (1 + 2 + 4 + 8 + 16) + 5);
  o.per_client = 0;  // the default: 4 x the level, at least 8
  EXPECT_EQ(SweepRequests(o), 8 + 8 + 16 + 32 + 64 + 5);
  o.requests = 10;
  EXPECT_EQ(SweepRequests(o), 5 * 11);
  SweepOptions open;
  open.rate = 2;  // one open-loop level: 32 unless told
  open.warmup = 2;
  EXPECT_EQ(SweepRequests(open), 34);
  open.requests = 20;
  EXPECT_EQ(SweepRequests(open), 22);
}

}  // namespace
}  // namespace pdq
