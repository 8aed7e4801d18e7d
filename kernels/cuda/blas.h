// cuBLAS and cuBLASLt handles for the current device, with their
// workspaces and the matmul plans cuBLASLt needs, created once per worker.
// One stream at a time: the workspaces are reused by every call, so GEMMs
// that may overlap (another thread, another stream) need their own
// BlasHandles.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/cublas_lib.h"

namespace pdq::cuda {

// cuBLAS's recommended workspace on Hopper.
constexpr int64_t kBlasWorkspaceBytes = 32ll << 20;

class BlasHandles {
 public:
  // Loads cuBLAS (FailedPrecondition when it cannot: cublas_lib.h); fails
  // (Internal, with cuBLAS's reason) where there is no usable device.
  static absl::StatusOr<std::unique_ptr<BlasHandles>> Create();
  ~BlasHandles();
  BlasHandles(const BlasHandles&) = delete;
  BlasHandles& operator=(const BlasHandles&) = delete;

  // The cuBLAS entry points these handles were made with.
  const CublasLib& lib() const { return lib_; }
  // The cuBLAS handle bound to `stream`, with this object's workspace (a
  // stream change resets cuBLAS's workspace, so it is set again each time).
  absl::StatusOr<cublasHandle_t> BlasOn(cudaStream_t stream);

  // y (int32, n_pad columns per row) = xq (m rows of k_pad int8) times
  // wq (n_pad rows of k_pad int8) transposed, through cuBLASLt's int8
  // tensor-core matmul; the plan for each shape is chosen once and kept.
  // n_pad and k_pad: multiples of 4; pointers at least 4-byte aligned
  // (16 or more is faster: plans are chosen per alignment).
  absl::Status Int8Matmul(const int8_t* xq, const int8_t* wq, int64_t m, int64_t n_pad,
                          int64_t k_pad, int32_t* y, cudaStream_t stream);

 private:
  explicit BlasHandles(const CublasLib& lib);
  struct Plan;
  using PlanKey = std::tuple<int64_t, int64_t, int64_t, int>;  // m, n_pad, k_pad, alignment
  absl::StatusOr<const Plan*> Int8Plan(const PlanKey& key);

  const CublasLib& lib_;
  cublasHandle_t blas_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  void* blas_workspace_ = nullptr;
  void* lt_workspace_ = nullptr;
  std::map<PlanKey, std::unique_ptr<Plan>> int8_plans_;
};

// OK for CUBLAS_STATUS_SUCCESS, else Internal naming `what`.
absl::Status BlasStatus(cublasStatus_t status, const char* what);

}  // namespace pdq::cuda
