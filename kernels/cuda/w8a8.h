// W8A8 on the GPU: y[m][n] = x[m][k] times W[n][k] transposed, with W in
// symmetric int8 per output row (w = scale[row] * q, as kernels.h's
// PackedI8) and x quantized per row at run time (absmax / 127, as the CPU
// does: given the same fp16 values, the same int8 codes). Three steps, each
// its own launcher so they can be measured apart: QuantizeRowsI8 (fp16 x,
// optional SmoothQuant input scale), cuBLASLt's int8 tensor-core matmul into
// int32 (BlasHandles::Int8Matmul), and DequantI32 (int32 x row scale x
// weight scale into fp32). W8A8Gemm runs all three.
//
// Layout (GpuI8): row-major int8, GpuI8Rows(n) rows of GpuI8Ld(k) bytes
// (k padded to 16 with zeros, n to 4 with zero rows: what cuBLASLt's int8
// matmul requires), 16-byte aligned; scale: n floats.
#pragma once

#include <cstdint>

#include "common/half.h"
#include "kernels/cuda/blas.h"
#include "kernels/cuda/launch.h"
#include "kernels/kernels.h"

namespace pdq::cuda {

inline int64_t GpuI8Ld(int64_t k) { return (k + 15) / 16 * 16; }
inline int64_t GpuI8Rows(int64_t n) { return (n + 3) / 4 * 4; }
inline int64_t GpuI8Bytes(int64_t n, int64_t k) { return GpuI8Rows(n) * GpuI8Ld(k); }

struct GpuI8 {
  const int8_t* q = nullptr;
  const float* scale = nullptr;
  int64_t n = 0;
  int64_t k = 0;
};

// Host side: CPU-packed int8 weights into a host buffer of GpuI8Bytes(n, k)
// (the scales are the same n floats in both layouts).
void RepackI8ForGpu(const PackedI8& w, int8_t* q);

// xq[i] (GpuI8Ld(k) bytes, zero-padded) and xs[i] for m rows of x (fp16,
// ldx apart), each optionally multiplied by in_scale (k floats) first.
struct QuantizeRowsI8Params {
  const fp16_t* x = nullptr;
  int64_t m = 0;
  int64_t k = 0;
  int64_t ldx = 0;
  const float* in_scale = nullptr;
  int8_t* xq = nullptr;
  float* xs = nullptr;
};
absl::Status QuantizeRowsI8(const QuantizeRowsI8Params& p, cudaStream_t stream);

// y[i][j] = acc[i][j] * xs[i] * w_scale[j] for j < n; acc rows lda apart.
struct DequantI32Params {
  const int32_t* acc = nullptr;
  int64_t m = 0;
  int64_t n = 0;
  int64_t lda = 0;
  const float* xs = nullptr;
  const float* w_scale = nullptr;
  float* y = nullptr;
  int64_t ldy = 0;
};
absl::Status DequantI32(const DequantI32Params& p, cudaStream_t stream);

// Device scratch W8A8Gemm needs for m rows (256-byte aligned pieces).
int64_t W8A8ScratchBytes(int64_t m, int64_t n, int64_t k);

struct W8A8GemmParams {
  BlasHandles* blas = nullptr;
  GpuI8 w;
  const fp16_t* x = nullptr;
  int64_t m = 0;
  int64_t ldx = 0;
  const float* in_scale = nullptr;
  float* y = nullptr;
  int64_t ldy = 0;
  void* scratch = nullptr;  // W8A8ScratchBytes(m, n, k), 256-byte aligned
};
absl::Status W8A8Gemm(const W8A8GemmParams& p, cudaStream_t stream);

}  // namespace pdq::cuda
