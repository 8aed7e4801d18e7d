#include "engine/device.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/check.h"

#if PDQ_WITH_CUDA
#include "engine/cuda/cuda_backend.h"
#include "kernels/cuda/launch.h"
#endif

namespace pdq {
namespace {

// The GPU index of "cuda" / "cuda:N"; -1 for "cpu".
absl::StatusOr<int> ParseDevice(const std::string& device) {
  if (device == "cpu") return -1;
  absl::string_view rest = device;
  int index = 0;
  if (!absl::ConsumePrefix(&rest, "cuda") ||
      !(rest.empty() ||
        (absl::ConsumePrefix(&rest, ":") && absl::SimpleAtoi(rest, &index) && index >= 0))) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown device '", device, "'; expected one of ", DeviceChoices()));
  }
#if PDQ_WITH_CUDA
  return index;
#else
  return absl::UnimplementedError(
      "this pdq was built without CUDA (no nvcc at configure time, or -DPDQ_CUDA=OFF); "
      "use --device cpu");
#endif
}

}  // namespace

const char* DeviceChoices() { return "cpu, cuda, cuda:N"; }

absl::Status CheckDevice(const std::string& device) {
  PDQ_ASSIGN_OR_RETURN(const int index, ParseDevice(device));
#if PDQ_WITH_CUDA
  if (index >= 0) return cuda::DevicePresent(index);
#endif
  (void)index;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ForwardBackend>> MakeBackend(const Model& model,
                                                            const std::string& device) {
  PDQ_ASSIGN_OR_RETURN(const int index, ParseDevice(device));
  if (index < 0) return nullptr;
  if (model.options().kv_dtype != KvDtype::kFp16) {
    return absl::InvalidArgumentError(absl::StrCat("--device ", device,
                                                   " reads an fp16 KV cache only; drop --kv-dtype ",
                                                   KvDtypeName(model.options().kv_dtype)));
  }
#if PDQ_WITH_CUDA
  return MakeCudaBackend(model, index);
#else
  (void)model;
  return absl::InternalError("a GPU device parsed in a build without CUDA");
#endif
}

}  // namespace pdq
