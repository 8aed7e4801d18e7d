// FLOP and parameter counts of a model shape.
#include "engine/config.h"

namespace pdq {

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
