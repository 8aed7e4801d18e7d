// Where a Context runs its forward pass: "cpu" (the default), or "cuda" /
// "cuda:N" where pdq was built with CUDA and that GPU is present.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/context.h"
#include "engine/model.h"

namespace pdq {

// The accepted spellings, for --help: "cpu, cuda, cuda:N".
const char* DeviceChoices();

// Checks `device` before anything is loaded: InvalidArgument for an
// unknown name, Unimplemented in a build without CUDA, FailedPrecondition
// (with CUDA's reason) when that GPU is not there.
absl::Status CheckDevice(const std::string& device);

// The backend for `device`, or null for "cpu". InvalidArgument for an
// unknown name; Unimplemented in a build without CUDA; FailedPrecondition
// when no such GPU is present; what uploading the weights reports
// otherwise.
absl::StatusOr<std::unique_ptr<ForwardBackend>> MakeBackend(const Model& model,
                                                            const std::string& device);

}  // namespace pdq
