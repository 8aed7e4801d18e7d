// Paged attention on the GPU over the KV layout of kernels/kernels.h
// (KvLayerView: blocks of block_tokens tokens, [kv_heads][block_tokens]
// [head_dim] fp16 for K and the same for V), so a cache written by the CPU
// reads the same on the GPU and the reverse. Pointers are device memory.
#pragma once

#include <cstdint>

#include "kernels/cuda/launch.h"
#include "kernels/kernels.h"

namespace pdq::cuda {

// Writes k/v rows (row i at position positions[i]) into the blocks of
// block_table, as fp16 rounded to nearest even (the CPU's KvWrite).
struct KvWriteParams {
  KvLayerView layer;
  const int32_t* block_table = nullptr;
  const int32_t* positions = nullptr;
  int64_t m = 0;
  const float* k = nullptr;
  int64_t k_stride = 0;
  const float* v = nullptr;
  int64_t v_stride = 0;
};
absl::Status KvWrite(const KvWriteParams& p, cudaStream_t stream);

// Causal attention for m query rows of one sequence at positions
// first_pos .. first_pos + m - 1 whose K/V are already in the cache: a
// decode step is m = 1, a prefill chunk m > 1. q rows ([heads][head_dim])
// are q_stride floats apart, out rows out_stride; query head h reads kv
// head h / (heads / kv_heads). One warp per (row, head) walks the keys in
// tiles of 32 with an online softmax, so no score buffer is needed.
// head_dim: even, at most 256.
struct AttentionParams {
  KvLayerView layer;
  const int32_t* block_table = nullptr;
  int64_t first_pos = 0;
  int64_t m = 0;
  const float* q = nullptr;
  int64_t q_stride = 0;
  int heads = 0;
  float scale = 1.0f;
  float* out = nullptr;
  int64_t out_stride = 0;
};
absl::Status Attention(const AttentionParams& p, cudaStream_t stream);

}  // namespace pdq::cuda
