// Calibrated W4 quantizers on small random layers: RTN matches the kernels'
// quantizer, GPTQ and AWQ beat RTN on the output error they minimize, and the
// Gram statistics they share are computed right.
#include "quant/w4_quantize.h"

#include <cmath>
#include <random>

#include "gtest/gtest.h"
#include "kernels/kernels.h"

namespace pdq {
namespace {

std::vector<float> Normal(int64_t n, float sd, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, sd);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// n inputs of width k driven by a few shared factors, so channels correlate
// strongly (as real activations do), plus a little independent noise.
std::vector<float> CorrelatedInputs(int64_t n, int64_t k, uint32_t seed) {
  const int64_t factors = 8;
  const std::vector<float> z = Normal(n * factors, 1.0f, seed), mix = Normal(factors * k, 1.0f, seed + 1),
                           noise = Normal(n * k, 0.1f, seed + 2);
  std::vector<float> x(n * k);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      float v = noise[t * k + j];
      for (int64_t f = 0; f < factors; ++f) v += z[t * factors + f] * mix[f * k + j];
      x[t * k + j] = v;
    }
  }
  return x;
}

std::vector<float> MeanGram(const std::vector<float>& x, int64_t k, ThreadPool* pool = nullptr) {
  GramAccumulator acc(k);
  acc.Add(x.data(), (int64_t)x.size() / k, k, pool);
  return acc.MeanGram();
}

// Output error tr(E G E^T) of quantized codes against the original weights.
double OutputError(const std::vector<float>& w, const W4Codes& q, const W4Shape& s,
                   const std::vector<float>& gram) {
  const std::vector<float> deq = DequantizeW4(q, s);
  std::vector<float> e(w.size());
  for (size_t i = 0; i < w.size(); ++i) e[i] = w[i] - deq[i];
  return GramQuadraticError(e.data(), s.rows, s.k, gram.data());
}

TEST(W4QuantizeTest, RtnMatchesTheKernelsQuantizer) {
  for (bool symmetric : {false, true}) {
    const W4Shape s{37, 200, 64, symmetric};  // a short last group, a partial panel
    const std::vector<float> w = Normal(s.rows * s.k, 0.05f, 7);
    std::vector<uint8_t> q1(PackedW4QBytes(s.rows, s.k)), q2(q1.size());
    std::vector<fp16_t> sc1(PackedW4ScaleElements(s.rows, s.k, s.group)), sc2(sc1.size()),
        mn1(sc1.size()), mn2(sc1.size());
    QuantizeW4Rows(w.data(), 0, s.rows, s.k, s.group, symmetric, q1.data(), sc1.data(),
                   mn1.data());
    const W4Codes c = QuantizeW4Rtn(w.data(), s);
    PackW4Rows(c.codes.data(), c.scales.data(), c.mins.data(), 0, s.rows, s.k, s.group,
               q2.data(), sc2.data(), mn2.data());
    EXPECT_EQ(q1, q2) << "symmetric " << symmetric;
    EXPECT_EQ(sc1, sc2);
    EXPECT_EQ(mn1, mn2);
  }
}

TEST(W4QuantizeTest, GramAccumulatorMatchesADirectSum) {
  const int64_t k = 37, m = 300;  // not a multiple of the tile width; more than one chunk
  const std::vector<float> x = Normal(m * k, 1.0f, 3);
  ThreadPool pool(2);
  GramAccumulator acc(k);
  acc.Add(x.data(), 100, k, &pool);
  acc.Add(x.data() + 100 * k, m - 100, k, nullptr);
  EXPECT_EQ(acc.rows(), m);
  const std::vector<float> g = acc.MeanGram();
  for (int64_t i = 0; i < k; ++i) {
    for (int64_t j = 0; j < k; ++j) {
      double want = 0;
      for (int64_t t = 0; t < m; ++t) want += (double)x[t * k + i] * x[t * k + j];
      want /= m;
      ASSERT_NEAR(g[i * k + j], want, 1e-4 * (1 + std::abs(want))) << i << "," << j;
    }
  }
}

TEST(W4QuantizeTest, QuadraticErrorIsTheMeanSquaredOutputError) {
  const int64_t k = 37, rows = 5, n = 120;
  const std::vector<float> x = Normal(n * k, 1.0f, 4), e = Normal(rows * k, 0.1f, 5);
  double want = 0;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t t = 0; t < n; ++t) {
      double y = 0;
      for (int64_t j = 0; j < k; ++j) y += (double)e[r * k + j] * x[t * k + j];
      want += y * y / n;
    }
  }
  const std::vector<float> g = MeanGram(x, k);
  EXPECT_NEAR(GramQuadraticError(e.data(), rows, k, g.data()), want, 1e-4 * want);
}

TEST(W4QuantizeTest, GptqWithUncorrelatedInputsIsRoundToNearest) {
  // A diagonal Gram matrix leaves nothing to compensate through.
  const W4Shape s{20, 96, 32, false};
  const std::vector<float> w = Normal(s.rows * s.k, 0.05f, 8);
  std::vector<float> gram(s.k * s.k, 0.0f);
  for (int64_t i = 0; i < s.k; ++i) gram[i * s.k + i] = 0.5f + (float)(i % 7);
  std::vector<float> importance(s.k);
  for (int64_t i = 0; i < s.k; ++i) importance[i] = gram[i * s.k + i];
  for (bool clip : {false, true}) {
    GptqOptions o;
    o.clip = clip;
    auto gptq = QuantizeW4Gptq(w.data(), s, gram.data(), o);
    ASSERT_TRUE(gptq.ok()) << gptq.status();
    const W4Codes rtn = QuantizeW4Rtn(w.data(), s, clip ? importance.data() : nullptr);
    EXPECT_EQ(gptq->codes, rtn.codes) << "clip " << clip;
    EXPECT_EQ(gptq->scales, rtn.scales);
    EXPECT_EQ(gptq->mins, rtn.mins);
  }
}

TEST(W4QuantizeTest, ClippingNeverLosesOnItsWeightedError) {
  const W4Shape s{32, 256, 128, false};
  std::vector<float> w = Normal(s.rows * s.k, 0.05f, 15);
  for (int64_t r = 0; r < s.rows; ++r) w[r * s.k + (r * 7) % s.k] = 0.5f;  // one outlier a row
  const std::vector<float> importance = Normal(s.k, 1.0f, 16);
  std::vector<float> imp(s.k);
  for (int64_t i = 0; i < s.k; ++i) imp[i] = std::abs(importance[i]);
  auto weighted = [&](const W4Codes& q) {
    const std::vector<float> deq = DequantizeW4(q, s);
    double e = 0;
    for (int64_t i = 0; i < s.rows * s.k; ++i) e += imp[i % s.k] * (w[i] - deq[i]) * (w[i] - deq[i]);
    return e;
  };
  EXPECT_LT(weighted(QuantizeW4Rtn(w.data(), s, imp.data())), 0.9 * weighted(QuantizeW4Rtn(w.data(), s)));
}

TEST(W4QuantizeTest, GptqCutsTheOutputErrorOnCorrelatedInputs) {
  for (bool symmetric : {false, true}) {
    const W4Shape s{48, 256, 128, symmetric};
    const std::vector<float> w = Normal(s.rows * s.k, 0.05f, 9);
    const std::vector<float> gram = MeanGram(CorrelatedInputs(1024, s.k, 10), s.k);
    auto gptq = QuantizeW4Gptq(w.data(), s, gram.data());
    ASSERT_TRUE(gptq.ok()) << gptq.status();
    const double rtn_err = OutputError(w, QuantizeW4Rtn(w.data(), s), s, gram);
    const double gptq_err = OutputError(w, *gptq, s, gram);
    EXPECT_LT(gptq_err, 0.5 * rtn_err) << "symmetric " << symmetric;
  }
}

TEST(W4QuantizeTest, GptqZeroesChannelsThatNeverFire) {
  const W4Shape s{16, 64, 32, false};
  std::vector<float> x = CorrelatedInputs(256, s.k, 11);
  for (int64_t t = 0; t < 256; ++t) x[t * s.k + 5] = 0.0f;
  const std::vector<float> gram = MeanGram(x, s.k);
  std::vector<float> w = Normal(s.rows * s.k, 0.05f, 12);
  for (int64_t r = 0; r < s.rows; ++r) w[r * s.k + 5] = 10.0f;  // would wreck its group
  auto gptq = QuantizeW4Gptq(w.data(), s, gram.data());
  ASSERT_TRUE(gptq.ok()) << gptq.status();
  const std::vector<float> deq = DequantizeW4(*gptq, s);
  for (int64_t r = 0; r < s.rows; ++r) {
    EXPECT_LT(std::abs(deq[r * s.k + 5]), 0.1f) << "row " << r;
    for (int64_t j = 0; j < s.k; ++j) ASSERT_TRUE(std::isfinite(deq[r * s.k + j]));
  }
}

TEST(W4QuantizeTest, AwqIsNeverWorseThanRtnAndHelpsWithOutlierChannels) {
  const W4Shape s{64, 256, 128, false};
  const std::vector<float> w = Normal(s.rows * s.k, 0.05f, 13);
  std::vector<float> x = Normal(512 * s.k, 1.0f, 14);
  for (int64_t t = 0; t < 512; ++t) {
    for (int64_t j : {3, 70, 200}) x[t * s.k + j] *= 30.0f;  // activation outliers
  }
  const std::vector<float> gram = MeanGram(x, s.k);
  std::vector<float> mean_abs(s.k, 0.0f);
  for (int64_t t = 0; t < 512; ++t) {
    for (int64_t j = 0; j < s.k; ++j) mean_abs[j] += std::abs(x[t * s.k + j]) / 512;
  }
  const AwqScales awq = SearchAwqScales(w.data(), s, mean_abs.data(), gram.data());
  EXPECT_GT(awq.alpha, 0.0);
  EXPECT_LT(awq.error, 0.8 * awq.rtn_error);
  EXPECT_NEAR(awq.rtn_error, OutputError(w, QuantizeW4Rtn(w.data(), s), s, gram),
              1e-3 * awq.rtn_error);
  EXPECT_GT(awq.scales[3], awq.scales[4]);

  // Uniform activations: nothing to gain, and the search must not lose.
  std::vector<float> ones(s.k, 1.0f);
  const AwqScales flat = SearchAwqScales(w.data(), s, ones.data(), gram.data());
  EXPECT_LE(flat.error, flat.rtn_error);
}

}  // namespace
}  // namespace pdq
