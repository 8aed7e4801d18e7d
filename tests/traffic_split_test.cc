// policy/traffic_split.h: the share of requests each pool of an A/B rollout
// gets, at random and sticky per client.
#include "policy/traffic_split.h"

#include <map>
#include <random>

#include "gtest/gtest.h"

namespace pdq::policy {
namespace {

// 1000 Bernoulli(p) draws have a standard deviation of sqrt(1000 p (1-p))
// draws: 9.5 at p = 0.1. Five of them (a chance below 1e-6 of a false
// failure for a fair split) is the tolerance.
double Tolerance(double p, int n) { return 5 * std::sqrt(p * (1 - p) / n); }

TEST(TrafficSplitTest, RandomDrawsFollowTheWeights) {
  absl::StatusOr<TrafficSplit> s = TrafficSplit::Parse("fp16=90, w8a8-w4a16=10");
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->arms().size(), 2u);
  absl::BitGen rng(std::seed_seq{7});
  std::map<std::string, int> n;
  for (int i = 0; i < 1000; ++i) ++n[s->Choose("", /*sticky=*/true, rng)];
  EXPECT_NEAR(n["w8a8-w4a16"] / 1000.0, 0.1, Tolerance(0.1, 1000));
  EXPECT_EQ(n["fp16"] + n["w8a8-w4a16"], 1000);
}

TEST(TrafficSplitTest, StickyClientsKeepTheirPoolAndSpreadByWeight) {
  absl::StatusOr<TrafficSplit> s = TrafficSplit::Parse("a=1,b=3");
  ASSERT_TRUE(s.ok());
  absl::BitGen rng(std::seed_seq{1});
  std::map<std::string, int> n;
  for (int c = 0; c < 1000; ++c) {
    const std::string id = "client-" + std::to_string(c);
    const std::string& first = s->Choose(id, true, rng);
    for (int k = 0; k < 5; ++k) ASSERT_EQ(s->Choose(id, true, rng), first) << id;
    ++n[first];
  }
  EXPECT_NEAR(n["b"] / 1000.0, 0.75, Tolerance(0.75, 1000));
  // Not sticky: the same id is drawn afresh each time, so both pools appear.
  std::map<std::string, int> m;
  for (int k = 0; k < 200; ++k) ++m[s->Choose("client-0", false, rng)];
  EXPECT_GT(m["a"], 0);
  EXPECT_GT(m["b"], 0);
}

TEST(TrafficSplitTest, BoundariesOfTheUnitIntervalMapToTheEndPools) {
  absl::StatusOr<TrafficSplit> s = TrafficSplit::Parse("a=1,b=1,c=2");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->At(0.0), "a");
  EXPECT_EQ(s->At(0.2499), "a");
  EXPECT_EQ(s->At(0.25), "b");
  EXPECT_EQ(s->At(0.5), "c");
  EXPECT_EQ(s->At(0.999999), "c");
}

TEST(TrafficSplitTest, BadSpecsAreClearErrors) {
  EXPECT_TRUE(TrafficSplit::Parse("").ok());
  EXPECT_TRUE(TrafficSplit::Parse("")->empty());
  for (const auto& [spec, message] : std::vector<std::pair<std::string, std::string>>{
           {"fp16", "is not POOL=WEIGHT"},
           {"fp16=90,fp16=10", "named twice"},
           {"a=0", "must be a number above 0"},
           {"a=-1", "must be a number above 0"},
           {"a=x", "must be a number above 0"},
           {"a b=1", "must have 1 to 64 characters"},
           {"=1", "must have 1 to 64 characters"},
           {std::string(65, 'p') + "=1", "must have 1 to 64 characters"},
       }) {
    absl::StatusOr<TrafficSplit> s = TrafficSplit::Parse(spec);
    ASSERT_FALSE(s.ok()) << spec;
    EXPECT_NE(std::string(s.status().message()).find(message), std::string::npos)
        << spec << ": " << s.status();
  }
}

}  // namespace
}  // namespace pdq::policy
