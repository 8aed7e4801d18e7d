// The shape of a Llama-family model (llama, qwen2, phi3, gemma), as read
// from GGUF metadata or a synthetic spec, and the arithmetic that follows
// from it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "kernels/kernels.h"

namespace pdq {

// The gate's activation in a gated feed-forward layer.
enum class Activation { kSilu, kGeluTanh };

// What a GGUF architecture name means beyond the shape its metadata gives:
// the variations of the Llama block that pdq runs.
struct Architecture {
  const char* name;  // general.architecture
  RopeStyle rope_style = RopeStyle::kHalfSplit;
  bool qkv_bias = false;  // attn_q/k/v carry biases (Qwen2)
  // One attn_qkv tensor with the q, k, v rows where the file has it (Phi-3;
  // separate attn_q/k/v are read too, as llama.cpp does).
  bool fused_qkv = false;
  bool fused_gate_up = false;  // no ffn_gate: ffn_up holds the gate rows, then the up rows (Phi-3)
  Activation activation = Activation::kSilu;  // of the feed-forward gate (Gemma: GELU)
  bool scale_embedding = false;               // token embeddings times sqrt(d_model) (Gemma)
};

// The architecture of that name, or null when pdq does not run it.
const Architecture* FindArchitecture(std::string_view name);
// "llama, qwen2, phi3, gemma", for error messages.
std::string SupportedArchitectures();

struct ModelConfig {
  std::string arch;  // an Architecture's name
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
  Activation activation = Activation::kSilu;
  float embedding_scale = 1.0f;  // token embeddings are multiplied by this

  // Sets arch and the fields it fixes (RoPE style, biases, activation,
  // embedding scale); d_model must be set first.
  void ApplyArchitecture(const Architecture& a);

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
