// cuBLAS is opened on first use, not linked (kernels/cuda/cublas_lib.h):
// a process that never asks for it does not map it, and loading it finds
// every entry point pdq calls. Runs without a GPU (nothing here touches
// the device).
#include "kernels/cuda/cublas_lib.h"

#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"

namespace pdq::cuda {
namespace {

std::string Maps() {
  std::ifstream in("/proc/self/maps");
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(CublasLibTest, MappedOnlyOnceLoadedAndEveryEntryPointFound) {
  // This binary links pdq::kernels_cuda (cudart) and nothing has loaded
  // cuBLAS yet.
  EXPECT_EQ(Maps().find("libcublas"), std::string::npos);
  absl::StatusOr<const CublasLib*> lib = LoadCublas();
  ASSERT_TRUE(lib.ok()) << lib.status();
  const std::string maps = Maps();
  EXPECT_NE(maps.find(CublasLibraryName()), std::string::npos) << maps;
  EXPECT_NE(maps.find(CublasLtLibraryName()), std::string::npos) << maps;
  const CublasLib& l = **lib;
  for (const void* fn :
       {(const void*)l.Create, (const void*)l.Destroy, (const void*)l.SetStream,
        (const void*)l.SetWorkspace, (const void*)l.GemmEx, (const void*)l.GetStatusName,
        (const void*)l.GetStatusString, (const void*)l.LtCreate, (const void*)l.LtDestroy,
        (const void*)l.LtMatmul, (const void*)l.LtMatmulAlgoGetHeuristic,
        (const void*)l.LtMatmulDescCreate, (const void*)l.LtMatmulDescDestroy,
        (const void*)l.LtMatmulDescSetAttribute, (const void*)l.LtMatmulPreferenceCreate,
        (const void*)l.LtMatmulPreferenceDestroy, (const void*)l.LtMatmulPreferenceSetAttribute,
        (const void*)l.LtMatrixLayoutCreate, (const void*)l.LtMatrixLayoutDestroy}) {
    EXPECT_NE(fn, nullptr);
  }
  // A host-only call through the table: cuBLAS names its own statuses.
  EXPECT_STREQ(l.GetStatusName(CUBLAS_STATUS_NOT_INITIALIZED), "CUBLAS_STATUS_NOT_INITIALIZED");
  // Loaded once.
  absl::StatusOr<const CublasLib*> again = LoadCublas();
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *lib);
}

}  // namespace
}  // namespace pdq::cuda
