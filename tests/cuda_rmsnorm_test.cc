// The CUDA RMSNorm against the CPU reference; skips where no GPU is present.
#include <cuda_runtime.h>

#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/kernels.h"

namespace pdq {
namespace {

TEST(CudaRmsNormTest, MatchesCpuReference) {
  if (cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device present; GPU test skipped";
  for (auto [m, d] : {std::pair<int64_t, int64_t>{1, 576}, {7, 1000}, {33, 4096}, {3, 5}}) {
    std::mt19937 rng(m * 131 + d);
    std::normal_distribution<float> dist(0.0f, 2.0f);
    std::vector<float> x(m * d), w(d), want(m * d), got(m * d);
    for (float& v : x) v = dist(rng);
    for (float& v : w) v = dist(rng);
    RmsNorm(CpuContext{}, x.data(), w.data(), m, d, 1e-5f, want.data());
    float *dx, *dw, *dout;
    ASSERT_EQ(cudaMalloc(&dx, x.size() * 4), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&dw, w.size() * 4), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&dout, x.size() * 4), cudaSuccess);
    cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(dw, w.data(), w.size() * 4, cudaMemcpyHostToDevice);
    ASSERT_TRUE(cuda::RmsNorm(dx, dw, m, d, 1e-5f, dout, nullptr).ok());
    ASSERT_EQ(cudaMemcpy(got.data(), dout, got.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    for (int64_t i = 0; i < m * d; ++i) {
      ASSERT_NEAR(got[i], want[i], 1e-4f * (1.0f + std::abs(want[i]))) << "m=" << m << " d=" << d << " i=" << i;
    }
    cudaFree(dx);
    cudaFree(dw);
    cudaFree(dout);
  }
}

TEST(CudaRmsNormTest, RejectsEmptyShape) {
  EXPECT_FALSE(cuda::RmsNorm(nullptr, nullptr, 0, 8, 1e-5f, nullptr, nullptr).ok());
}

}  // namespace
}  // namespace pdq
