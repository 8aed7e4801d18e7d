// Dequantization of GGUF tensor data (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1,
// Q8_0, Q4_K, Q5_K, Q6_K) to fp32, following the ggml block layouts.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "gguf/gguf.h"

namespace pdq {

// Bytes occupied by `n` consecutive elements of `type`; InvalidArgument when
// the type is unsupported or n is not a multiple of its block size.
absl::StatusOr<uint64_t> GgmlRowBytes(GgmlType type, int64_t n);

// Dequantizes `n` elements (a multiple of the type's block size) from `src`
// into `dst`. InvalidArgument for unsupported types or a partial block.
absl::Status DequantizeRow(GgmlType type, const void* src, float* dst, int64_t n);

}  // namespace pdq
