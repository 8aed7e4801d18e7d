// Sampling: greedy, seeded reproducibility, top-k/top-p restrict the support.
#include "engine/sampler.h"

#include <cmath>
#include <set>
#include <vector>

#include "gtest/gtest.h"

namespace pdq {
namespace {

TEST(SamplerTest, GreedyPicksArgmaxWithLowestIndexOnTies) {
  std::vector<float> logits = {0.1f, 3.0f, -1.0f, 3.0f};
  Sampler s(SamplingParams{});
  EXPECT_EQ(s.Sample(logits.data(), 4), 1);
  EXPECT_EQ(Argmax(logits.data(), 4), 1);
}

TEST(SamplerTest, SameSeedSameSequence) {
  std::vector<float> logits(100);
  for (int i = 0; i < 100; ++i) logits[i] = (float)(i % 7) * 0.3f;
  SamplingParams p{1.0f, 0, 1.0f, 42};
  Sampler a(p), b(p);
  std::vector<int32_t> x, y;
  for (int i = 0; i < 50; ++i) {
    x.push_back(a.Sample(logits.data(), 100));
    y.push_back(b.Sample(logits.data(), 100));
  }
  EXPECT_EQ(x, y);
  EXPECT_GT(std::set<int32_t>(x.begin(), x.end()).size(), 5u);  // it does sample
}

TEST(SamplerTest, TopKLimitsSupport) {
  std::vector<float> logits = {5.0f, 4.0f, 3.0f, 2.0f, 1.0f};
  Sampler s(SamplingParams{10.0f, 2, 1.0f, 7});
  for (int i = 0; i < 200; ++i) EXPECT_LT(s.Sample(logits.data(), 5), 2);
}

TEST(SamplerTest, TopPKeepsTheNucleus) {
  // Probabilities ~ {0.64, 0.24, 0.09, 0.03}: top-p 0.8 keeps the first two.
  std::vector<float> logits = {3.0f, 2.0f, 1.0f, 0.0f};
  Sampler s(SamplingParams{1.0f, 0, 0.8f, 9});
  std::set<int32_t> seen;
  for (int i = 0; i < 500; ++i) seen.insert(s.Sample(logits.data(), 4));
  EXPECT_EQ(seen, (std::set<int32_t>{0, 1}));
}

TEST(SamplerTest, RejectsOutOfRangeParams) {
  EXPECT_FALSE(ValidateSamplingParams({-1.0f, 0, 1.0f, 0}).ok());
  EXPECT_FALSE(ValidateSamplingParams({1.0f, -3, 1.0f, 0}).ok());
  EXPECT_FALSE(ValidateSamplingParams({1.0f, 0, 0.0f, 0}).ok());
  EXPECT_FALSE(ValidateSamplingParams({1.0f, 0, 1.5f, 0}).ok());
  EXPECT_TRUE(ValidateSamplingParams({0.7f, 40, 0.9f, 1}).ok());
}

// A prefill worker samples the first token with a fresh Sampler; the decode
// worker's Sampler skips that draw and continues the stream one Sampler
// would have made, whatever the logits of each step.
TEST(SamplerTest, SkippingTheFirstSampleContinuesTheSameStream) {
  const SamplingParams p{0.8f, 0, 0.9f, 1234};
  std::vector<std::vector<float>> steps(6, std::vector<float>(50));
  for (size_t t = 0; t < steps.size(); ++t) {
    for (size_t i = 0; i < 50; ++i) steps[t][i] = std::sin(0.3f * i + t) * 2.0f;
  }
  Sampler one(p);
  std::vector<int32_t> want;
  for (auto& l : steps) want.push_back(one.Sample(l.data(), 50));
  Sampler first(p), rest(p);
  std::vector<int32_t> got = {first.Sample(steps[0].data(), 50)};
  rest.SkipSamples(1);
  for (size_t t = 1; t < steps.size(); ++t) got.push_back(rest.Sample(steps[t].data(), 50));
  EXPECT_EQ(got, want);
  Sampler unskipped(p);  // without the skip the stream is another one
  std::vector<int32_t> other = {want[0]};
  for (size_t t = 1; t < steps.size(); ++t) other.push_back(unskipped.Sample(steps[t].data(), 50));
  EXPECT_NE(other, want);
}

}  // namespace
}  // namespace pdq
