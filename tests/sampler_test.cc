// Sampling: greedy, seeded reproducibility, top-k/top-p restrict the support.
#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
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

// Each path draws from the distribution it should: frequencies of many
// picks against the exact probabilities (softmax at the temperature, cut to
// top-k's candidates or renormalized within top-p's nucleus), within five
// standard deviations, over a vocabulary of several of the sampler's chunks
// with the likely tokens spread over them (and ties, which go to the lower
// index when the nucleus is cut between them).
TEST(SamplerTest, EveryPathDrawsFromItsDistribution) {
  constexpr int kVocab = 5000, kDraws = 20000;
  std::vector<float> logits(kVocab);
  for (int i = 0; i < kVocab; ++i) logits[i] = -4.0f + 0.001f * (float)(i % 97);
  const std::vector<std::pair<int, float>> likely = {{4321, 3.0f}, {17, 2.5f},   {2048, 2.5f},
                                                     {1023, 2.0f}, {1024, 1.0f}, {4999, 0.5f}};
  for (auto [i, l] : likely) logits[i] = l;
  struct Case {
    float temperature;
    int top_k;
    float top_p;
  };
  for (const Case c : {Case{1.0f, 0, 1.0f}, Case{0.7f, 0, 1.0f}, Case{1.0f, 0, 0.6f},
                       Case{1.3f, 0, 0.9f}, Case{1.0f, 3, 1.0f}, Case{0.8f, 5, 0.7f}}) {
    // The exact distribution: candidates in order of likelihood (ties by
    // index), top-k, then the nucleus.
    std::vector<int> order(kVocab);
    for (int i = 0; i < kVocab; ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return logits[a] > logits[b]; });
    size_t n = c.top_k > 0 ? (size_t)c.top_k : order.size();
    std::vector<double> w(n);
    double sum = 0.0;
    for (size_t i = 0; i < n; ++i) sum += w[i] = std::exp((logits[order[i]] - 3.0) / c.temperature);
    if (c.top_p < 1.0f) {
      double mass = 0.0;
      for (size_t i = 0; i < n; ++i) {
        if ((mass += w[i] / sum) >= c.top_p) {
          n = i + 1;
          break;
        }
      }
      sum = 0.0;
      for (size_t i = 0; i < n; ++i) sum += w[i];
    }
    std::vector<int> count(kVocab);
    Sampler s(SamplingParams{c.temperature, c.top_k, c.top_p, 11});
    for (int d = 0; d < kDraws; ++d) ++count[s.Sample(logits.data(), kVocab)];
    int drawn = 0;
    for (size_t i = 0; i < n; ++i) {
      const double p = w[i] / sum, sd = std::sqrt(kDraws * p * (1 - p));
      if (i < likely.size()) {
        EXPECT_NEAR(count[order[i]], kDraws * p, 5 * sd + 1)
            << "token " << order[i] << " at T " << c.temperature << " top-k " << c.top_k
            << " top-p " << c.top_p;
      }
      drawn += count[order[i]];
    }
    EXPECT_EQ(drawn, kDraws) << "a token outside the candidates was drawn at top-k " << c.top_k
                             << " top-p " << c.top_p;
    if (n == (size_t)kVocab) {
      // The long tail, together, as often as its mass says.
      double tail = 0.0;
      int tail_count = 0;
      for (size_t i = likely.size(); i < n; ++i) {
        tail += w[i] / sum;
        tail_count += count[order[i]];
      }
      EXPECT_NEAR(tail_count, kDraws * tail, 5 * std::sqrt(kDraws * tail * (1 - tail)) + 1);
    }
  }
}

// Logits of -inf (masked tokens) are never drawn, and a nucleus that needs
// every finite token still ends.
TEST(SamplerTest, MaskedTokensAreNeverDrawn) {
  std::vector<float> logits(3000, -std::numeric_limits<float>::infinity());
  logits[5] = 1.0f;
  logits[2999] = 1.0f;
  logits[1500] = -30.0f;
  for (float top_p : {1.0f, 0.999999f}) {
    Sampler s(SamplingParams{1.0f, 0, top_p, 3});
    std::set<int32_t> seen;
    for (int i = 0; i < 400; ++i) seen.insert(s.Sample(logits.data(), 3000));
    EXPECT_EQ(seen, (std::set<int32_t>{5, 2999})) << "top-p " << top_p;
  }
}

// Logits with no distribution to draw from give the argmax on every path,
// never a crash: an infinite logit is certain; all -inf or all NaN give 0.
TEST(SamplerTest, InfiniteOrNanLogitsGiveTheArgmax) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::nanf("");
  std::vector<float> certain(100, 1.0f), none(100, -inf), broken(100, nan);
  certain[42] = inf;
  for (const SamplingParams& p :
       {SamplingParams{1.0f, 0, 1.0f, 1}, SamplingParams{1.0f, 0, 0.9f, 1},
        SamplingParams{0.7f, 40, 0.9f, 1}}) {
    Sampler s(p);
    EXPECT_EQ(s.Sample(certain.data(), 100), 42);
    EXPECT_EQ(s.Sample(none.data(), 100), 0);
    EXPECT_EQ(s.Sample(broken.data(), 100), 0);
  }
}

}  // namespace
}  // namespace pdq
