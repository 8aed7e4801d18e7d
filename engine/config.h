// The shape of a Llama-family model (llama, qwen2), as read from GGUF
// metadata or a synthetic spec, and the arithmetic that follows from it.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/kernels.h"

namespace pdq {

struct ModelConfig {
  std::string arch;  // "llama" or "qwen2"
  std::string name;
  int num_layers = 0;
  int d_model = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int ffn_dim = 0;
  int vocab_size = 0;
  int max_context = 0;
  float rope_base = 10000.0f;
  float rope_linear_scale = 1.0f;  // positions are divided by this
  RopeStyle rope_style = RopeStyle::kInterleaved;
  float norm_eps = 1e-5f;
  bool tied_output = false;
  bool qkv_bias = false;

  int q_dim() const { return num_heads * head_dim; }
  int kv_dim() const { return num_kv_heads * head_dim; }
  // Weight parameters of the transformer layers' matmuls, and of the output
  // projection: a token costs 2 FLOPs per parameter it passes through.
  int64_t layer_matmul_params() const;
  int64_t output_params() const { return (int64_t)d_model * vocab_size; }
  // FLOPs of one forward pass over `tokens` new tokens after `past` cached
  // ones, with logits for `logit_rows` of them: matmuls plus attention.
  double ForwardFlops(int64_t past, int64_t tokens, int64_t logit_rows) const;
};

}  // namespace pdq
