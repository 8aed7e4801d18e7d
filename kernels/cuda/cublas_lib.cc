#include "kernels/cuda/cublas_lib.h"

#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <mutex>
#include <string>
#include <type_traits>

#include "absl/strings/str_cat.h"

namespace pdq::cuda {
namespace {

#define PDQ_CUBLAS_STR2(x) #x
#define PDQ_CUBLAS_STR(x) PDQ_CUBLAS_STR2(x)
#define PDQ_CUBLAS_SONAME(lib) "lib" lib ".so." PDQ_CUBLAS_STR(CUBLAS_VER_MAJOR)

constexpr char kCublas[] = PDQ_CUBLAS_SONAME("cublas");
constexpr char kCublasLt[] = PDQ_CUBLAS_SONAME("cublasLt");

// The directory holding the loaded cudart ("" when unknown): cuBLAS ships
// beside it, where the loader may not look (a RUNPATH applies to the
// executable's own needs, not always to dlopen from a library).
std::string CudartDirectory() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<const void*>(&cudaGetDeviceCount), &info) == 0 ||
      info.dli_fname == nullptr) {
    return "";
  }
  const std::string path = info.dli_fname;
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash + 1);
}

absl::StatusOr<void*> Open(const char* name) {
  // RTLD_LOCAL: nothing else in the process should bind to cuBLAS by name.
  if (void* h = dlopen(name, RTLD_NOW | RTLD_LOCAL)) return h;
  const std::string first = dlerror();
  const std::string dir = CudartDirectory();
  if (!dir.empty()) {
    if (void* h = dlopen((dir + name).c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
  }
  return absl::FailedPreconditionError(
      absl::StrCat("cannot load ", name, " (cuBLAS, needed for --device cuda): ", first,
                   dir.empty() ? "" : absl::StrCat("; not in ", dir, " either")));
}

absl::StatusOr<CublasLib> Load() {
  absl::StatusOr<void*> blas = Open(kCublas);
  if (!blas.ok()) return blas.status();
  absl::StatusOr<void*> lt = Open(kCublasLt);
  if (!lt.ok()) return lt.status();
  CublasLib lib{};
  absl::Status missing;
  // The symbol's real name is its spelling after the header's macros.
  auto get = [&](void* handle, const char* library, auto& fn, const char* symbol) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(handle, symbol));
    if (fn == nullptr && missing.ok()) {
      missing = absl::FailedPreconditionError(
          absl::StrCat(library, " has no ", symbol, " (a cuBLAS older than pdq was built with?)"));
    }
  };
#define PDQ_CUBLAS_GET(field, fn) get(*blas, kCublas, lib.field, PDQ_CUBLAS_STR(fn))
#define PDQ_CUBLASLT_GET(field, fn) get(*lt, kCublasLt, lib.field, PDQ_CUBLAS_STR(fn))
  PDQ_CUBLAS_GET(Create, cublasCreate);
  PDQ_CUBLAS_GET(Destroy, cublasDestroy);
  PDQ_CUBLAS_GET(SetStream, cublasSetStream);
  PDQ_CUBLAS_GET(SetWorkspace, cublasSetWorkspace);
  PDQ_CUBLAS_GET(GemmEx, cublasGemmEx);
  PDQ_CUBLAS_GET(GetStatusName, cublasGetStatusName);
  PDQ_CUBLAS_GET(GetStatusString, cublasGetStatusString);
  PDQ_CUBLASLT_GET(LtCreate, cublasLtCreate);
  PDQ_CUBLASLT_GET(LtDestroy, cublasLtDestroy);
  PDQ_CUBLASLT_GET(LtMatmul, cublasLtMatmul);
  PDQ_CUBLASLT_GET(LtMatmulAlgoGetHeuristic, cublasLtMatmulAlgoGetHeuristic);
  PDQ_CUBLASLT_GET(LtMatmulDescCreate, cublasLtMatmulDescCreate);
  PDQ_CUBLASLT_GET(LtMatmulDescDestroy, cublasLtMatmulDescDestroy);
  PDQ_CUBLASLT_GET(LtMatmulDescSetAttribute, cublasLtMatmulDescSetAttribute);
  PDQ_CUBLASLT_GET(LtMatmulPreferenceCreate, cublasLtMatmulPreferenceCreate);
  PDQ_CUBLASLT_GET(LtMatmulPreferenceDestroy, cublasLtMatmulPreferenceDestroy);
  PDQ_CUBLASLT_GET(LtMatmulPreferenceSetAttribute, cublasLtMatmulPreferenceSetAttribute);
  PDQ_CUBLASLT_GET(LtMatrixLayoutCreate, cublasLtMatrixLayoutCreate);
  PDQ_CUBLASLT_GET(LtMatrixLayoutDestroy, cublasLtMatrixLayoutDestroy);
#undef PDQ_CUBLAS_GET
#undef PDQ_CUBLASLT_GET
  if (!missing.ok()) return missing;
  return lib;  // the libraries stay open for the process's life
}

}  // namespace

const char* CublasLibraryName() { return kCublas; }
const char* CublasLtLibraryName() { return kCublasLt; }

absl::StatusOr<const CublasLib*> LoadCublas() {
  static std::once_flag once;
  static absl::StatusOr<CublasLib>* loaded = nullptr;
  std::call_once(once, [] { loaded = new absl::StatusOr<CublasLib>(Load()); });
  if (!loaded->ok()) return loaded->status();
  return &**loaded;
}

}  // namespace pdq::cuda
