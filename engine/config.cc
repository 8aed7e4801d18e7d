// FLOP and parameter counts of a model shape.
#include "engine/config.h"

#include <cmath>

namespace pdq {
namespace {

constexpr Architecture kArchitectures[] = {
    {.name = "llama", .rope_style = RopeStyle::kInterleaved},
    {.name = "qwen2", .qkv_bias = true},
    {.name = "phi3", .fused_qkv = true, .fused_gate_up = true},
    {.name = "gemma", .activation = Activation::kGeluTanh, .scale_embedding = true},
};

}  // namespace

const Architecture* FindArchitecture(std::string_view name) {
  for (const Architecture& a : kArchitectures) {
    if (name == a.name) return &a;
  }
  return nullptr;
}

std::string SupportedArchitectures() {
  std::string s;
  for (const Architecture& a : kArchitectures) s += (s.empty() ? "" : ", ") + std::string(a.name);
  return s;
}

void ModelConfig::ApplyArchitecture(const Architecture& a) {
  arch = a.name;
  rope_style = a.rope_style;
  qkv_bias = a.qkv_bias;
  activation = a.activation;
  embedding_scale = a.scale_embedding ? std::sqrt((float)d_model) : 1.0f;
}

int64_t ModelConfig::layer_matmul_params() const {
  const int64_t per_layer = (int64_t)d_model * (q_dim() + 2 * kv_dim()) +
                            (int64_t)q_dim() * d_model + 3 * (int64_t)d_model * ffn_dim;
  return per_layer * num_layers;
}

double ModelConfig::ForwardFlops(int64_t past, int64_t tokens, int64_t logit_rows) const {
  // Query at position p attends to p + 1 keys: QK^T and PV, 2 FLOPs each.
  const double keys = (double)tokens * (double)past + (double)tokens * (tokens + 1) / 2.0;
  const double attention = 4.0 * keys * q_dim() * num_layers;
  return 2.0 * (double)layer_matmul_params() * (double)tokens +
         2.0 * (double)output_params() * (double)logit_rows + attention;
}

}  // namespace pdq
