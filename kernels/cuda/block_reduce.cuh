// Device-side helper shared by the row kernels: a reduction over a whole
// thread block (at most 1024 threads), every thread getting the result.
// Device code: included by .cu files only.
#pragma once

#include <cuda_runtime.h>

namespace pdq::cuda {

// op(a, b) over every thread's `value`, by warp shuffles and one shared
// round. Every thread of the block must call it.
template <typename Op>
__device__ inline float BlockReduce(float value, Op op) {
  __shared__ float warp_results[32];
  for (int offset = 16; offset > 0; offset /= 2) {
    value = op(value, __shfl_xor_sync(0xffffffff, value, offset));
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = (blockDim.x + 31) / 32;
  __syncthreads();  // a previous call's readers are done with warp_results
  if (lane == 0) warp_results[warp] = value;
  __syncthreads();
  value = warp_results[0];
  for (int w = 1; w < warps; ++w) value = op(value, warp_results[w]);
  return value;
}

}  // namespace pdq::cuda
