// FP16 GEMM through cuBLAS: y[m][n] (fp32) = x[m][k] (fp16) times W[n][k]
// (fp16, row-major) transposed, fp32 accumulation. The prefill path of an
// FP16 worker and the baseline the quantized kernels are measured against.
#pragma once

#include <cstdint>

#include "common/half.h"
#include "kernels/cuda/blas.h"
#include "kernels/cuda/launch.h"
#include "kernels/kernels.h"

namespace pdq::cuda {

// Host side: unpacks CPU panel-packed fp16 weights into n x k row-major.
void UnpackF16ForGpu(const PackedF16& w, fp16_t* dst);

struct GemmF16Params {
  BlasHandles* blas = nullptr;
  const fp16_t* w = nullptr;  // n rows of k, ldw apart
  int64_t n = 0;
  int64_t k = 0;
  int64_t ldw = 0;
  const fp16_t* x = nullptr;
  int64_t m = 0;
  int64_t ldx = 0;
  float* y = nullptr;
  int64_t ldy = 0;
};
absl::Status GemmF16(const GemmF16Params& p, cudaStream_t stream);

}  // namespace pdq::cuda
