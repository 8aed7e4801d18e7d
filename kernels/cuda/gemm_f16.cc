#include "kernels/cuda/gemm_f16.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "common/check.h"

namespace pdq::cuda {

void UnpackF16ForGpu(const PackedF16& w, fp16_t* dst) {
  for (int64_t row = 0; row < w.n; ++row) {
    const fp16_t* panel = w.data + row / kPanelRows * w.k * kPanelRows;
    for (int64_t kk = 0; kk < w.k; ++kk)
      dst[row * w.k + kk] = panel[kk * kPanelRows + row % kPanelRows];
  }
}

absl::Status GemmF16(const GemmF16Params& p, cudaStream_t stream) {
  constexpr int64_t kMax = std::numeric_limits<int>::max();
  if (p.n <= 0 || p.k <= 0 || p.m <= 0 || p.ldw < p.k || p.ldx < p.k || p.ldy < p.n || p.n > kMax ||
      p.k > kMax || p.m > kMax || p.ldw > kMax || p.ldx > kMax || p.ldy > kMax) {
    return BadInput("GemmF16", absl::StrCat("bad shape ", p.m, "x", p.n, "x", p.k, " (ldw ", p.ldw,
                                            ", ldx ", p.ldx, ", ldy ", p.ldy, ")"));
  }
  if (p.blas == nullptr || p.w == nullptr || p.x == nullptr || p.y == nullptr) {
    return BadInput("GemmF16", "needs cuBLAS handles, w, x and y");
  }
  PDQ_ASSIGN_OR_RETURN(cublasHandle_t handle, p.blas->BlasOn(stream));
  // cuBLAS is column-major: W (n x k row-major) is k x n there, taken
  // transposed; x is k x m; y is y^T, n x m with leading dimension ldy.
  const float alpha = 1.0f, beta = 0.0f;
  return BlasStatus(
      p.blas->lib().GemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, (int)p.n, (int)p.m, (int)p.k, &alpha,
                           p.w, CUDA_R_16F, (int)p.ldw, p.x, CUDA_R_16F, (int)p.ldx, &beta, p.y,
                           CUDA_R_32F, (int)p.ldy, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
      "cublasGemmEx (fp16)");
}

}  // namespace pdq::cuda
