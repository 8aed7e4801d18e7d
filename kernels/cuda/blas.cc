#include "kernels/cuda/blas.h"

#include <cuda_runtime.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "kernels/cuda/cublas_lib.h"
#include "kernels/cuda/launch.h"

namespace pdq::cuda {

absl::Status BlasStatus(cublasStatus_t status, const char* what) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  // A status to report came from a loaded cuBLAS.
  absl::StatusOr<const CublasLib*> lib = LoadCublas();
  if (!lib.ok()) return absl::InternalError(absl::StrCat(what, ": cuBLAS status ", (int)status));
  return absl::InternalError(absl::StrCat(what, ": ", (*lib)->GetStatusName(status), " (",
                                          (*lib)->GetStatusString(status), ")"));
}

// One shape's cuBLASLt descriptors and the algorithm its heuristic chose.
struct BlasHandles::Plan {
  explicit Plan(const CublasLib& lib) : lib(lib) {}
  const CublasLib& lib;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  ~Plan() {
    if (d != nullptr) lib.LtMatrixLayoutDestroy(d);
    if (b != nullptr) lib.LtMatrixLayoutDestroy(b);
    if (a != nullptr) lib.LtMatrixLayoutDestroy(a);
    if (op != nullptr) lib.LtMatmulDescDestroy(op);
  }
};

BlasHandles::BlasHandles(const CublasLib& lib) : lib_(lib) {}

absl::StatusOr<std::unique_ptr<BlasHandles>> BlasHandles::Create() {
  PDQ_ASSIGN_OR_RETURN(const CublasLib* lib, LoadCublas());
  std::unique_ptr<BlasHandles> h(new BlasHandles(*lib));
  PDQ_RETURN_IF_ERROR(BlasStatus(lib->Create(&h->blas_), "cublasCreate"));
  PDQ_RETURN_IF_ERROR(BlasStatus(lib->LtCreate(&h->lt_), "cublasLtCreate"));
  PDQ_RETURN_IF_ERROR(CudaStatus(cudaMalloc(&h->blas_workspace_, kBlasWorkspaceBytes),
                                 "cudaMalloc (cuBLAS workspace)"));
  PDQ_RETURN_IF_ERROR(CudaStatus(cudaMalloc(&h->lt_workspace_, kBlasWorkspaceBytes),
                                 "cudaMalloc (cuBLASLt workspace)"));
  return h;
}

BlasHandles::~BlasHandles() {
  int8_plans_.clear();
  if (lt_ != nullptr) lib_.LtDestroy(lt_);
  if (blas_ != nullptr) lib_.Destroy(blas_);
  if (blas_workspace_ != nullptr) cudaFree(blas_workspace_);
  if (lt_workspace_ != nullptr) cudaFree(lt_workspace_);
}

absl::StatusOr<cublasHandle_t> BlasHandles::BlasOn(cudaStream_t stream) {
  PDQ_RETURN_IF_ERROR(BlasStatus(lib_.SetStream(blas_, stream), "cublasSetStream"));
  PDQ_RETURN_IF_ERROR(BlasStatus(lib_.SetWorkspace(blas_, blas_workspace_, kBlasWorkspaceBytes),
                                 "cublasSetWorkspace"));
  return blas_;
}

namespace {

// The largest power of two up to 256 that divides the address.
int Alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  int align = 256;
  while (align > 1 && a % align != 0) align /= 2;
  return align;
}

}  // namespace

// Row-major operands seen as cuBLAS's column-major ones: D^T (n_pad x m) =
// W (k_pad x n_pad, transposed) times X^T (k_pad x m); int8 tensor-core
// matmuls take only this "TN" form.
absl::StatusOr<const BlasHandles::Plan*> BlasHandles::Int8Plan(const PlanKey& key) {
  if (auto it = int8_plans_.find(key); it != int8_plans_.end()) return it->second.get();
  // Decode batches vary m; keep the plans bounded.
  constexpr size_t kMaxPlans = 256;
  if (int8_plans_.size() >= kMaxPlans) int8_plans_.clear();
  const auto [m, n_pad, k_pad, align] = key;
  auto plan = std::make_unique<Plan>(lib_);
  PDQ_RETURN_IF_ERROR(BlasStatus(lib_.LtMatmulDescCreate(&plan->op, CUBLAS_COMPUTE_32I, CUDA_R_32I),
                                 "cublasLtMatmulDescCreate (int8)"));
  const cublasOperation_t trans = CUBLAS_OP_T, no_trans = CUBLAS_OP_N;
  PDQ_RETURN_IF_ERROR(BlasStatus(
      lib_.LtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSA, &trans, sizeof(trans)),
      "cublasLtMatmulDescSetAttribute (TRANSA)"));
  PDQ_RETURN_IF_ERROR(
      BlasStatus(lib_.LtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSB, &no_trans,
                                               sizeof(no_trans)),
                 "cublasLtMatmulDescSetAttribute (TRANSB)"));
  PDQ_RETURN_IF_ERROR(BlasStatus(
      lib_.LtMatrixLayoutCreate(&plan->a, CUDA_R_8I, (uint64_t)k_pad, (uint64_t)n_pad, k_pad),
      "cublasLtMatrixLayoutCreate (weights)"));
  PDQ_RETURN_IF_ERROR(BlasStatus(
      lib_.LtMatrixLayoutCreate(&plan->b, CUDA_R_8I, (uint64_t)k_pad, (uint64_t)m, k_pad),
      "cublasLtMatrixLayoutCreate (activations)"));
  PDQ_RETURN_IF_ERROR(BlasStatus(
      lib_.LtMatrixLayoutCreate(&plan->d, CUDA_R_32I, (uint64_t)n_pad, (uint64_t)m, n_pad),
      "cublasLtMatrixLayoutCreate (output)"));

  cublasLtMatmulPreference_t pref = nullptr;
  PDQ_RETURN_IF_ERROR(
      BlasStatus(lib_.LtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate"));
  const uint64_t workspace = kBlasWorkspaceBytes;
  cublasStatus_t st = lib_.LtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof(workspace));
  // The heuristic assumes 256-byte aligned operands unless told otherwise.
  const uint32_t align_bytes = (uint32_t)align;
  for (auto attr :
       {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
    if (st == CUBLAS_STATUS_SUCCESS) {
      st = lib_.LtMatmulPreferenceSetAttribute(pref, attr, &align_bytes, sizeof(align_bytes));
    }
  }
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  if (st == CUBLAS_STATUS_SUCCESS) {
    st = lib_.LtMatmulAlgoGetHeuristic(lt_, plan->op, plan->a, plan->b, plan->d, plan->d, pref, 1,
                                       &result, &found);
  }
  lib_.LtMatmulPreferenceDestroy(pref);
  PDQ_RETURN_IF_ERROR(BlasStatus(st, "cublasLtMatmulAlgoGetHeuristic (int8)"));
  if (found == 0) {
    return absl::UnimplementedError(absl::StrCat("cuBLASLt has no int8 matmul for ", m, "x", n_pad,
                                                 "x", k_pad, " on this device"));
  }
  plan->algo = result.algo;
  const Plan* raw = plan.get();
  int8_plans_.emplace(key, std::move(plan));
  return raw;
}

absl::Status BlasHandles::Int8Matmul(const int8_t* xq, const int8_t* wq, int64_t m, int64_t n_pad,
                                     int64_t k_pad, int32_t* y, cudaStream_t stream) {
  if (m <= 0 || n_pad <= 0 || k_pad <= 0 || n_pad % 4 != 0 || k_pad % 4 != 0) {
    return BadInput("Int8Matmul", absl::StrCat("bad shape ", m, "x", n_pad, "x", k_pad,
                                               " (n and k: multiples of 4)"));
  }
  if (xq == nullptr || wq == nullptr || y == nullptr) {
    return BadInput("Int8Matmul", "needs xq, wq and y");
  }
  const int align = std::min({Alignment(xq), Alignment(wq), Alignment(y)});
  if (align < 4) {
    return BadInput("Int8Matmul", "operands must be at least 4-byte aligned");
  }
  PDQ_ASSIGN_OR_RETURN(const Plan* plan, Int8Plan({m, n_pad, k_pad, align}));
  const int32_t alpha = 1, beta = 0;
  return BlasStatus(
      lib_.LtMatmul(lt_, plan->op, &alpha, wq, plan->a, xq, plan->b, &beta, y, plan->d, y, plan->d,
                    &plan->algo, lt_workspace_, kBlasWorkspaceBytes, stream),
      "cublasLtMatmul (int8)");
}

}  // namespace pdq::cuda
