// How every kernel in kernels/cuda is called, stated once:
//
//   absl::Status Kernel(const KernelParams& p, cudaStream_t stream);
//
// The parameters struct holds device pointers and shapes; the stream comes
// last (nullptr: the legacy default stream). The status is InvalidArgument
// for a shape or pointer the kernel cannot take, checked before anything is
// launched, and Internal for what CUDA reported about the launch. A launcher
// never allocates and never synchronizes: errors while the kernel runs
// surface at the caller's next synchronization. Where a kernel needs
// temporary device memory, the caller passes it (a ...ScratchBytes function
// says how much).
//
// The headers in this folder hold no device code, so plain C++ includes them
// (with CUDA's include directory, which linking pdq::kernels_cuda adds).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace pdq::cuda {

// Number of visible CUDA devices; 0 where there is no driver or no GPU.
int DeviceCount();

// OK when CUDA device `device` can be used; FailedPrecondition otherwise,
// with CUDA's reason (no device, a driver too old for this build, ...).
absl::Status DevicePresent(int device);

// The multiprocessor count of the current device (cached per device), or 0.
int MultiprocessorCount();

// OK for cudaSuccess, else naming `what` and CUDA's message:
// ResourceExhausted for an allocation that failed, Internal otherwise.
absl::Status CudaStatus(cudaError_t err, const char* what);

// The status of the launch just made on this thread (cudaGetLastError).
absl::Status LaunchStatus(const char* kernel);

// InvalidArgument "<kernel>: <why>": what a launcher returns for input it
// cannot take.
absl::Status BadInput(const char* kernel, absl::string_view why);

// Blocks of `threads` for a grid-stride loop over n items: enough to fill
// the current device, at least 1.
unsigned GridStrideBlocks(int64_t n, int threads);

}  // namespace pdq::cuda
