// RMSNorm on the GPU: one block per row, a warp-shuffle tree reduction.
#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_kernels.h"

namespace pdq::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void RmsNormKernel(const float* __restrict__ x, const float* __restrict__ weight,
                              int64_t d, float eps, float* __restrict__ out) {
  const float* row = x + blockIdx.x * d;
  float* out_row = out + blockIdx.x * d;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) ss += row[i] * row[i];
  for (int offset = 16; offset > 0; offset /= 2) ss += __shfl_xor_sync(0xffffffff, ss, offset);
  __shared__ float warp_sums[kThreads / 32];
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = ss;
  __syncthreads();
  if (threadIdx.x < 32) {
    ss = threadIdx.x < blockDim.x / 32 ? warp_sums[threadIdx.x] : 0.0f;
    for (int offset = 16; offset > 0; offset /= 2) ss += __shfl_xor_sync(0xffffffff, ss, offset);
    if (threadIdx.x == 0) warp_sums[0] = ss;
  }
  __syncthreads();
  const float scale = rsqrtf(warp_sums[0] / (float)d + eps);
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) out_row[i] = row[i] * scale * weight[i];
}

}  // namespace

int DeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

absl::Status RmsNorm(const float* x, const float* weight, int64_t m, int64_t d, float eps,
                     float* out, void* stream) {
  if (m <= 0 || d <= 0 || m > 0x7fffffff) {
    return absl::InvalidArgumentError(absl::StrCat("RmsNorm: bad shape ", m, "x", d));
  }
  RmsNormKernel<<<(unsigned)m, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(x, weight, d,
                                                                                 eps, out);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    return absl::InternalError(absl::StrCat("RmsNorm launch failed: ", cudaGetErrorString(err)));
  }
  return absl::OkStatus();
}

}  // namespace pdq::cuda
