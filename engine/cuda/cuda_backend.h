// The CUDA forward backend (see ForwardBackend in engine/context.h): the
// model's weights uploaded once to one GPU in the layouts of kernels/cuda
// (W4A16 repacked for the tensor-core GEMV, W8A8 for cuBLASLt's int8
// matmul, FP16 row-major for cuBLAS), KV caches in that GPU's memory with
// the CPU's block layout, and the forward pass of engine/context.cc on the
// CUDA kernels, with fp16 activations into every GEMM and fp32 elsewhere.
//
// Never yet run on a GPU (none has been lent to this project).
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "engine/context.h"
#include "engine/model.h"

namespace pdq {

// FailedPrecondition when GPU `device` does not exist; InvalidArgument for
// a layer the GPU kernels cannot take (W4A16 widths that are not multiples
// of 16); ResourceExhausted when the weights do not fit.
absl::StatusOr<std::unique_ptr<ForwardBackend>> MakeCudaBackend(const Model& model, int device);

}  // namespace pdq
