// Helpers for tests of kernels/cuda: random fp16-exact data and device
// buffers whose allocation or copy failure fails the test.
#pragma once

#include <cmath>
#include <random>
#include <vector>

#include "common/half.h"
#include "gtest/gtest.h"
#include "kernels/cuda/device_buffer.h"

namespace pdq::cuda_test {

#define PDQ_ASSERT_OK(expr)             \
  do {                                  \
    const absl::Status _pdq_s = (expr); \
    ASSERT_TRUE(_pdq_s.ok()) << _pdq_s; \
  } while (0)

// `auto name = DeviceBuffer` holding `host`, or a fatal test failure.
#define PDQ_DEVICE_COPY(name, host)                       \
  auto name##_or = ::pdq::cuda::DeviceBuffer::From(host); \
  ASSERT_TRUE(name##_or.ok()) << name##_or.status();      \
  ::pdq::cuda::DeviceBuffer name = std::move(*name##_or)

// `bytes` of device memory filled with 0xff (NaN as fp32 and fp16), so an
// element a kernel never wrote shows.
#define PDQ_DEVICE_POISONED(name, bytes)                       \
  auto name##_or = ::pdq::cuda::DeviceBuffer::Allocate(bytes); \
  ASSERT_TRUE(name##_or.ok()) << name##_or.status();           \
  ::pdq::cuda::DeviceBuffer name = std::move(*name##_or);      \
  ASSERT_EQ(cudaMemset(name.get(), 0xff, (size_t)(bytes)), cudaSuccess)

// `const std::vector<T> name` holding the whole of device buffer `buf`, or
// a fatal test failure (never an empty vector read past its end).
#define PDQ_DOWNLOAD(name, T, buf)                   \
  auto name##_or = (buf).template ToHost<T>();       \
  ASSERT_TRUE(name##_or.ok()) << name##_or.status(); \
  const std::vector<T> name = std::move(*name##_or)

// n values drawn from N(0, sigma), rounded to fp16: `half` holds the bits,
// `f` the same values as floats (what a CPU reference reads).
struct HalfData {
  std::vector<fp16_t> half;
  std::vector<float> f;
};
inline HalfData RandomHalf(size_t n, std::mt19937& rng, float sigma = 1.0f) {
  std::normal_distribution<float> dist(0.0f, sigma);
  HalfData d;
  d.half.resize(n);
  d.f.resize(n);
  for (size_t i = 0; i < n; ++i) {
    d.half[i] = Fp32ToFp16(dist(rng));
    d.f[i] = Fp16ToFp32(d.half[i]);
  }
  return d;
}

inline std::vector<float> RandomFloats(size_t n, std::mt19937& rng, float sigma = 1.0f) {
  std::normal_distribution<float> dist(0.0f, sigma);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// ||got - want|| / ||want|| over rows x cols elements ld apart; every
// element must be finite.
inline double RelativeError(const std::vector<float>& got, const std::vector<float>& want,
                            int64_t rows, int64_t cols, int64_t ld) {
  double num = 0.0, den = 0.0;
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      const double g = got[i * ld + j], w = want[i * ld + j];
      if (!std::isfinite(g)) return INFINITY;
      num += (g - w) * (g - w);
      den += w * w;
    }
  }
  return den > 0.0 ? std::sqrt(num / den) : std::sqrt(num);
}

}  // namespace pdq::cuda_test
