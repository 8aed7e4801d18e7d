#include "kernels/cuda/launch.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <string>

#include "absl/strings/str_cat.h"

namespace pdq::cuda {

int DeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

int MultiprocessorCount() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cached[kMaxDevices] = {};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0) {
    cudaGetLastError();
    return 0;
  }
  if (device < kMaxDevices && cached[device].load(std::memory_order_relaxed) > 0) {
    return cached[device].load(std::memory_order_relaxed);
  }
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  if (device < kMaxDevices) cached[device].store(sms, std::memory_order_relaxed);
  return sms;
}

absl::Status DevicePresent(int device) {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error
    return absl::FailedPreconditionError(
        absl::StrCat("no CUDA device present (", cudaGetErrorString(err), ")"));
  }
  if (device < 0 || device >= n) {
    return absl::FailedPreconditionError(
        n == 0 ? std::string("no CUDA device present")
               : absl::StrCat("no CUDA device ", device, ": ", n, " present"));
  }
  return absl::OkStatus();
}

absl::Status CudaStatus(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return absl::OkStatus();
  const std::string message =
      absl::StrCat(what, ": ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ")");
  if (err == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(message);
  return absl::InternalError(message);
}

absl::Status LaunchStatus(const char* kernel) {
  return CudaStatus(cudaGetLastError(), absl::StrCat(kernel, " launch").c_str());
}

absl::Status BadInput(const char* kernel, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(kernel, ": ", why));
}

unsigned GridStrideBlocks(int64_t n, int threads) {
  const int64_t want = (n + threads - 1) / threads;
  const int64_t cap = 32 * (int64_t)std::max(1, MultiprocessorCount());
  return (unsigned)std::max<int64_t>(1, std::min(want, cap));
}

}  // namespace pdq::cuda
