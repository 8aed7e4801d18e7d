// The CUDA RMSNorm against the scalar CPU reference (cpu::kScalarKernels);
// skips where no GPU is present.
#include <cuda_runtime.h>

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/isa.h"
#include "kernels/cuda/cuda_kernels.h"

namespace pdq {
namespace {

// Device memory freed on every path, including a failed assertion.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t floats) {
    if (cudaMalloc(&ptr_, floats * sizeof(float)) != cudaSuccess) ptr_ = nullptr;
  }
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  float* get() const { return static_cast<float*>(ptr_); }

 private:
  void* ptr_ = nullptr;
};

TEST(CudaRmsNormTest, MatchesScalarReference) {
  if (cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device present; GPU test skipped";
  for (auto [m, d] : {std::pair<int64_t, int64_t>{1, 576}, {7, 1000}, {33, 4096}, {3, 5}}) {
    std::mt19937 rng(m * 131 + d);
    std::normal_distribution<float> dist(0.0f, 2.0f);
    std::vector<float> x(m * d), w(d), want(m * d), got(m * d);
    for (float& v : x) v = dist(rng);
    for (float& v : w) v = dist(rng);
    for (int64_t i = 0; i < m; ++i) {
      cpu::kScalarKernels.rms_norm_row(x.data() + i * d, w.data(), d, 1e-5f, want.data() + i * d);
    }
    DeviceBuffer dx(x.size()), dw(w.size()), dout(x.size());
    ASSERT_TRUE(dx.get() && dw.get() && dout.get()) << "cudaMalloc failed";
    ASSERT_EQ(cudaMemcpy(dx.get(), x.data(), x.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(dw.get(), w.data(), w.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_TRUE(cuda::RmsNorm(dx.get(), dw.get(), m, d, 1e-5f, dout.get(), nullptr).ok());
    ASSERT_EQ(cudaMemcpy(got.data(), dout.get(), got.size() * 4, cudaMemcpyDeviceToHost),
              cudaSuccess);
    for (int64_t i = 0; i < m * d; ++i) {
      ASSERT_NEAR(got[i], want[i], 1e-4f * (1.0f + std::abs(want[i])))
          << "m=" << m << " d=" << d << " i=" << i;
    }
  }
}

TEST(CudaRmsNormTest, RejectsEmptyShape) {
  EXPECT_FALSE(cuda::RmsNorm(nullptr, nullptr, 0, 8, 1e-5f, nullptr, nullptr).ok());
}

}  // namespace
}  // namespace pdq
