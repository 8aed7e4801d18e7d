// CUDA kernels; the header has no device code, so plain C++ can include it.
// Every launcher takes device pointers, the stream last, and returns a status.
#pragma once

#include <cstdint>

#include "absl/status/status.h"

namespace pdq::cuda {

// Number of visible CUDA devices; 0 where there is no driver or no GPU.
int DeviceCount();

// out[i] = x[i] / rms(x[i]) * weight for m rows of length d (device memory).
absl::Status RmsNorm(const float* x, const float* weight, int64_t m, int64_t d, float eps,
                     float* out, void* stream);

}  // namespace pdq::cuda
