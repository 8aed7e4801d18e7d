// cuBLAS and cuBLASLt opened with dlopen on first use instead of linked.
// Linked, the two libraries were mapped and relocated before main in every
// pdq process, about 144 MiB resident in a CPU-only worker that never
// calls them (issue 22's memory bounds). No packaged library loads a CUDA
// library lazily, and the table is the few entry points pdq calls, so this
// is a small loader of our own; cudart stays linked (it is small, and
// loads the driver only on the first CUDA call).
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>

#include "absl/status/statusor.h"

namespace pdq::cuda {

// The entry points pdq uses, typed from CUDA's own headers (cublas_v2.h
// maps cublasCreate and friends to their _v2 symbols; so does the table).
struct CublasLib {
  decltype(&cublasCreate) Create;
  decltype(&cublasDestroy) Destroy;
  decltype(&cublasSetStream) SetStream;
  decltype(&cublasSetWorkspace) SetWorkspace;
  // The C entry point (C++ also sees an inline overload taking a
  // cudaDataType compute type).
  cublasStatus_t (*GemmEx)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                           const void*, const void*, cudaDataType, int, const void*, cudaDataType,
                           int, const void*, void*, cudaDataType, int, cublasComputeType_t,
                           cublasGemmAlgo_t);
  decltype(&cublasGetStatusName) GetStatusName;
  decltype(&cublasGetStatusString) GetStatusString;
  decltype(&cublasLtCreate) LtCreate;
  decltype(&cublasLtDestroy) LtDestroy;
  decltype(&cublasLtMatmul) LtMatmul;
  decltype(&cublasLtMatmulAlgoGetHeuristic) LtMatmulAlgoGetHeuristic;
  decltype(&cublasLtMatmulDescCreate) LtMatmulDescCreate;
  decltype(&cublasLtMatmulDescDestroy) LtMatmulDescDestroy;
  decltype(&cublasLtMatmulDescSetAttribute) LtMatmulDescSetAttribute;
  decltype(&cublasLtMatmulPreferenceCreate) LtMatmulPreferenceCreate;
  decltype(&cublasLtMatmulPreferenceDestroy) LtMatmulPreferenceDestroy;
  decltype(&cublasLtMatmulPreferenceSetAttribute) LtMatmulPreferenceSetAttribute;
  decltype(&cublasLtMatrixLayoutCreate) LtMatrixLayoutCreate;
  decltype(&cublasLtMatrixLayoutDestroy) LtMatrixLayoutDestroy;
};

// The libraries' file names pdq opens (the major version it was built
// against), for messages and tests.
const char* CublasLibraryName();
const char* CublasLtLibraryName();

// Opens both libraries once (later calls return the same table or error):
// by name through the usual search path, then from the directory cudart
// was loaded from. FailedPrecondition naming the library and dlerror's
// reason when one cannot be opened or lacks an entry point.
absl::StatusOr<const CublasLib*> LoadCublas();

}  // namespace pdq::cuda
