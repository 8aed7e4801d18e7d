// Perplexity (whole and disaggregated), KL against a reference, and drift.
#include "eval/perplexity.h"

#include "eval/drift.h"
#include "gtest/gtest.h"
#include "tests/test_models.h"

namespace pdq {
namespace {

using testing::LoadOrDie;
using testing::RepeatedText;
using testing::Tokens;

TEST(PerplexityTest, DisaggregatedWithOneModelMatchesWholeWindows) {
  auto t = LoadOrDie("synthetic:tiny");
  ASSERT_TRUE(t);
  PerplexityOptions o;
  o.ctx = 64;
  o.max_chunks = 5;
  auto whole = ComputePerplexity(*t.ctx, RepeatedText(20), o);
  o.decode = t.ctx.get();
  o.parallel_windows = 3;  // 5 windows: a batch of 3, then of 2
  o.kl_reference = t.ctx.get();
  auto split = ComputePerplexity(*t.ctx, RepeatedText(20), o);
  ASSERT_TRUE(whole.ok()) << whole.status();
  ASSERT_TRUE(split.ok()) << split.status();
  EXPECT_EQ(whole->tokens_scored, 5 * 31);
  EXPECT_EQ(split->tokens_scored, whole->tokens_scored);
  EXPECT_NEAR(split->nll_mean, whole->nll_mean, 1e-4);
  EXPECT_LT(split->kl_mean, 1e-6);
  EXPECT_DOUBLE_EQ(split->top1_agreement, 1.0);
}

// Windows that are not a whole number of KV blocks still all fit.
TEST(PerplexityTest, DisaggregatedWindowsOfAnyLength) {
  auto t = LoadOrDie("synthetic:tiny");
  ASSERT_TRUE(t);
  PerplexityOptions o;
  o.ctx = 50;
  o.max_chunks = 6;
  o.decode = t.ctx.get();
  o.parallel_windows = 6;
  auto r = ComputePerplexity(*t.ctx, RepeatedText(20), o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->tokens_scored, 6 * 24);
}

TEST(PerplexityTest, QuantizedDecodeShowsDivergenceFromTheReference) {
  auto fp16 = LoadOrDie("synthetic:tiny"), w4 = LoadOrDie("synthetic:tiny@w4a16");
  ASSERT_TRUE(fp16);
  ASSERT_TRUE(w4);
  PerplexityOptions o;
  o.ctx = 64;
  o.max_chunks = 4;
  auto ref = ComputePerplexity(*fp16.ctx, RepeatedText(10), o);
  o.decode = w4.ctx.get();
  o.kl_reference = fp16.ctx.get();
  auto r = ComputePerplexity(*fp16.ctx, RepeatedText(10), o);
  ASSERT_TRUE(ref.ok()) << ref.status();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->has_kl);
  EXPECT_NE(r->nll_mean, ref->nll_mean);
  EXPECT_GT(r->kl_mean, 1e-6);
  EXPECT_LT(r->kl_mean, 0.5);  // W4 g32 perturbs, it does not scramble
  EXPECT_GE(r->kl_p99, r->kl_mean);
  // 4 windows x 31 scored positions: quantization flips some argmaxes,
  // most survive.
  EXPECT_LT(r->top1_agreement, 1.0);
  EXPECT_GT(r->top1_agreement, 0.5);
}

TEST(PerplexityTest, RejectsMismatchedModels) {
  auto tiny = LoadOrDie("synthetic:tiny");
  auto other = LoadOrDie("synthetic:tiny-qwen2");
  ASSERT_TRUE(tiny);
  ASSERT_TRUE(other);
  PerplexityOptions o;
  o.ctx = 64;
  o.decode = other.ctx.get();
  auto r = ComputePerplexity(*tiny.ctx, RepeatedText(10), o);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("KV layout mismatch"), std::string::npos) << r.status();
}

TEST(DriftTest, AModelDoesNotDriftFromItself) {
  auto t = LoadOrDie("synthetic:tiny");
  ASSERT_TRUE(t);
  std::vector<std::vector<int32_t>> prompts = {Tokens(5, 384, 1), Tokens(9, 384, 2)};
  DriftOptions o;
  o.max_tokens = 20;
  auto r = MeasureDrift(*t.ctx, *t.ctx, *t.ctx, prompts, o);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->kl_mean.size(), 20u);
  EXPECT_LT(r->kl_overall, 1e-9);
  EXPECT_DOUBLE_EQ(r->agreement_overall, 1.0);
  EXPECT_EQ(r->first_divergence, (std::vector<int64_t>{-1, -1}));
}

TEST(DriftTest, QuantizedPairDriftsAndBadInputIsRejected) {
  auto fp16 = LoadOrDie("synthetic:tiny"), w8 = LoadOrDie("synthetic:tiny@w8a8"),
       w4 = LoadOrDie("synthetic:tiny@w4a16");
  ASSERT_TRUE(fp16 && w8 && w4);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 6; ++i) prompts.push_back(Tokens(5 + 3 * i, 384, 30 + i));
  DriftOptions o;
  o.max_tokens = 24;
  auto r = MeasureDrift(*fp16.ctx, *w8.ctx, *w4.ctx, prompts, o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_GT(r->kl_overall, 0.0);
  ASSERT_EQ(r->agreement.size(), 24u);
  // Agreement is a count of prompts at each position, and consistent with
  // where each prompt first diverged.
  const double n = (double)prompts.size();
  for (size_t p = 0; p < r->agreement.size(); ++p) {
    const double agreeing = r->agreement[p] * n;
    EXPECT_NEAR(agreeing, std::round(agreeing), 1e-9) << "position " << p;
    int diverging_here = 0, agreed_so_far = 0;
    for (int64_t d : r->first_divergence) {
      diverging_here += d == (int64_t)p;
      agreed_so_far += d < 0 || d > (int64_t)p;
    }
    EXPECT_LE(agreeing, n - diverging_here) << "position " << p;
    EXPECT_GE(agreeing, agreed_so_far) << "position " << p;
  }
  EXPECT_GT(r->agreement_overall, 0.5);
  EXPECT_LT(r->agreement_overall, 1.0);

  EXPECT_EQ(MeasureDrift(*fp16.ctx, *w8.ctx, *w4.ctx, {{}}, o).status().code(),
            absl::StatusCode::kInvalidArgument);
  o.max_tokens = 600;  // tiny's context is 512
  EXPECT_EQ(MeasureDrift(*fp16.ctx, *w8.ctx, *w4.ctx, prompts, o).status().code(),
            absl::StatusCode::kOutOfRange);
}

}  // namespace
}  // namespace pdq
