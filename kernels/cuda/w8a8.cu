// W8A8 (w8a8.h): per-row activation quantization, cuBLASLt's int8 matmul,
// and the dequantizing epilogue.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/w8a8.h"

namespace pdq::cuda {
namespace {

constexpr int kThreads = 256;

// One block per row: the absmax across the block, then the codes, rounded
// half to even and clamped as the CPU's QuantizeRowI8 does.
__global__ void QuantizeRowsI8Kernel(const __half* __restrict__ x, int64_t k, int64_t ldx,
                                     const float* __restrict__ in_scale, int64_t ld_q,
                                     int8_t* __restrict__ xq, float* __restrict__ xs) {
  const __half* row = x + blockIdx.x * ldx;
  auto value = [&](int64_t i) {
    const float v = __half2float(row[i]);
    return in_scale != nullptr ? v * in_scale[i] : v;
  };
  float absmax = 0.0f;
  for (int64_t i = threadIdx.x; i < k; i += blockDim.x) absmax = fmaxf(absmax, fabsf(value(i)));
  absmax = BlockReduce(absmax, [](float a, float b) { return fmaxf(a, b); });
  const float scale = absmax / 127.0f;
  const float inv = scale != 0.0f ? 127.0f / absmax : 0.0f;
  int8_t* out = xq + blockIdx.x * ld_q;
  for (int64_t i = threadIdx.x; i < ld_q; i += blockDim.x) {
    out[i] = i < k ? (int8_t)fminf(fmaxf(rintf(value(i) * inv), -127.0f), 127.0f) : 0;
  }
  if (threadIdx.x == 0) xs[blockIdx.x] = scale;
}

__global__ void DequantI32Kernel(const int32_t* __restrict__ acc, int64_t m, int64_t n, int64_t lda,
                                 const float* __restrict__ xs, const float* __restrict__ w_scale,
                                 float* __restrict__ y, int64_t ldy) {
  const int64_t total = m * n;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
       i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = i / n, c = i % n;
    y[r * ldy + c] = (float)acc[r * lda + c] * xs[r] * w_scale[c];
  }
}

int64_t Align256(int64_t bytes) { return (bytes + 255) / 256 * 256; }

}  // namespace

void RepackI8ForGpu(const PackedI8& w, int8_t* q) {
  const int64_t ld = GpuI8Ld(w.k), k4 = PackedI8K4(w.k);
  std::fill(q, q + GpuI8Bytes(w.n, w.k), (int8_t)0);
  for (int64_t row = 0; row < w.n; ++row) {
    const int8_t* panel = w.q + row / kPanelRows * k4 * 4 * kPanelRows;
    const int64_t j = row % kPanelRows;
    for (int64_t kk = 0; kk < w.k; ++kk) {
      q[row * ld + kk] = panel[(kk / 4) * 4 * kPanelRows + 4 * j + kk % 4];
    }
  }
}

absl::Status QuantizeRowsI8(const QuantizeRowsI8Params& p, cudaStream_t stream) {
  if (p.m <= 0 || p.m > 0x7fffffff || p.k <= 0 || p.ldx < p.k) {
    return BadInput("QuantizeRowsI8", absl::StrCat("bad shape ", p.m, "x", p.k, ", ldx ", p.ldx));
  }
  if (p.x == nullptr || p.xq == nullptr || p.xs == nullptr) {
    return BadInput("QuantizeRowsI8", "needs x, xq and xs");
  }
  QuantizeRowsI8Kernel<<<(unsigned)p.m, kThreads, 0, stream>>>(
      reinterpret_cast<const __half*>(p.x), p.k, p.ldx, p.in_scale, GpuI8Ld(p.k), p.xq, p.xs);
  return LaunchStatus("QuantizeRowsI8");
}

absl::Status DequantI32(const DequantI32Params& p, cudaStream_t stream) {
  if (p.m <= 0 || p.n <= 0 || p.lda < p.n || p.ldy < p.n) {
    return BadInput("DequantI32",
                    absl::StrCat("bad shape ", p.m, "x", p.n, ", lda ", p.lda, ", ldy ", p.ldy));
  }
  if (p.acc == nullptr || p.xs == nullptr || p.w_scale == nullptr || p.y == nullptr) {
    return BadInput("DequantI32", "needs acc, xs, w_scale and y");
  }
  DequantI32Kernel<<<GridStrideBlocks(p.m * p.n, kThreads), kThreads, 0, stream>>>(
      p.acc, p.m, p.n, p.lda, p.xs, p.w_scale, p.y, p.ldy);
  return LaunchStatus("DequantI32");
}

int64_t W8A8ScratchBytes(int64_t m, int64_t n, int64_t k) {
  return Align256(m * GpuI8Ld(k)) + Align256(m * (int64_t)sizeof(float)) +
         Align256(m * GpuI8Rows(n) * (int64_t)sizeof(int32_t));
}

absl::Status W8A8Gemm(const W8A8GemmParams& p, cudaStream_t stream) {
  if (p.w.n <= 0 || p.w.k <= 0 || p.m <= 0 || p.ldx < p.w.k || p.ldy < p.w.n) {
    return BadInput("W8A8Gemm", absl::StrCat("bad shape ", p.m, "x", p.w.n, "x", p.w.k, ", ldx ",
                                             p.ldx, ", ldy ", p.ldy));
  }
  if (p.blas == nullptr || p.w.q == nullptr || p.w.scale == nullptr || p.x == nullptr ||
      p.y == nullptr || p.scratch == nullptr) {
    return BadInput("W8A8Gemm", "needs cuBLAS handles, weights, scales, x, y and scratch");
  }
  if (reinterpret_cast<uintptr_t>(p.scratch) % 256 != 0 ||
      reinterpret_cast<uintptr_t>(p.w.q) % 16 != 0) {
    return BadInput("W8A8Gemm", "scratch must be 256-byte aligned and the weights 16-byte aligned");
  }
  auto* base = static_cast<uint8_t*>(p.scratch);
  auto* xq = reinterpret_cast<int8_t*>(base);
  base += Align256(p.m * GpuI8Ld(p.w.k));
  auto* xs = reinterpret_cast<float*>(base);
  base += Align256(p.m * (int64_t)sizeof(float));
  auto* acc = reinterpret_cast<int32_t*>(base);
  PDQ_RETURN_IF_ERROR(QuantizeRowsI8({p.x, p.m, p.w.k, p.ldx, p.in_scale, xq, xs}, stream));
  PDQ_RETURN_IF_ERROR(
      p.blas->Int8Matmul(xq, p.w.q, p.m, GpuI8Rows(p.w.n), GpuI8Ld(p.w.k), acc, stream));
  return DequantI32({acc, p.m, p.w.n, GpuI8Rows(p.w.n), xs, p.w.scale, p.y, p.ldy}, stream);
}

}  // namespace pdq::cuda
