// A loaded Llama-family model (see engine/config.h): configuration, one weight set
// at one precision, and its tokenizer. Immutable once loaded, so any number
// of threads share it; per-call state (workspace, scratch, the calibration
// observer) lives in a Context (engine/context.h), and threads come from the
// caller, never from the model.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/config.h"
#include "engine/kv_cache.h"
#include "engine/kv_layout.h"
#include "engine/linear.h"
#include "tokenizer/tokenizer.h"

namespace pdq {

struct LoadOptions {
  Precision precision = Precision::kFp16;
  int w4_group = 128;                   // 32, 64 or 128 inputs per scale
  bool w4_symmetric = false;            // asymmetric (scale and min) by default
  W4Method w4_method = W4Method::kRtn;  // non-RTN methods need activation_stats with Gram
  // W4A16 with int8 activations in calls of this many rows up to 64
  // (LinearOptions::w4_a8_min_rows); 0: never. Not stored in artifacts.
  int w4_a8_min_rows = 0;
  // W4A16 and W8A16 layers on bf16 AMX tiles from this many rows a call
  // (LinearOptions::bf16_min_rows); 0: never. Not stored in artifacts.
  int bf16_min_rows = 0;
  // Linear layers that stay FP16 under a quantized precision: patterns with
  // '*' wildcards over the names "blk.N.qkv", "blk.N.out", "blk.N.gate_up",
  // "blk.N.down" and "output" (e.g. {"output", "blk.*.down"}).
  std::vector<std::string> fp16_layers;
  // Linear layers stored as W8A16 instead (int8 weights per group of 32
  // inputs, 16-bit activations; LinearOptions::w8a16), same patterns;
  // fp16_layers wins where both match.
  std::vector<std::string> w8_layers;
  // W8A8 SmoothQuant: migration strength alpha (0 = off). The statistics it
  // and the calibrated W4 methods need come from CollectActivationStats over
  // a calibration text (quant/quantized_load.h does all of it in one call).
  float smooth_alpha = 0.0f;
  const ActivationStats* activation_stats = nullptr;
  // Names the text the statistics came from; recorded in artifacts.
  std::string calibration;
  // A `pdq quantize` artifact made from this same model: its packed weights
  // are loaded as they are, and its scheme and parameters replace the
  // precision fields above.
  std::string quantized_weights;
  // The KV cache's element type (kv_layout()); not stored in artifacts.
  KvDtype kv_dtype = KvDtype::kFp16;
};

class Model {
 public:
  // `spec` is a GGUF path, or "synthetic:NAME" for deterministic random
  // weights of a named shape (see SyntheticModelNames()). Loading runs on
  // `ctx`'s threads; without one, on a temporary pool over every core.
  static absl::StatusOr<std::unique_ptr<Model>> Load(const std::string& spec,
                                                     const LoadOptions& options,
                                                     const CpuContext& ctx);
  static absl::StatusOr<std::unique_ptr<Model>> Load(const std::string& spec,
                                                     const LoadOptions& options);
  // The configuration and tokenizer of `spec` and no weights, labelled
  // `precision`: for a Context whose backend never reads weights (an
  // emulated worker's, emulate/). Forward on the CPU refuses such a model.
  // `kv_dtype`: its KV cache's element type (kv_layout()).
  static absl::StatusOr<std::unique_ptr<Model>> LoadShape(const std::string& spec,
                                                          Precision precision,
                                                          KvDtype kv_dtype = KvDtype::kFp16);
  // False for a LoadShape model.
  bool has_weights() const { return output_ != nullptr; }
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const { return config_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  Precision precision() const { return precision_; }
  // The options the weights were made with (an artifact's own, when loaded
  // from one).
  const LoadOptions& options() const { return options_; }
  // Bytes of weights read to produce one token (all matmuls incl. output).
  int64_t weight_bytes_per_token() const;
  // Bytes of weights held: every linear layer, the embedding and the norms.
  int64_t resident_weight_bytes() const;

  // What this model's KV bytes mean, with blocks of `block_tokens` tokens.
  // Independent of the weight precision.
  KvLayout kv_layout(int block_tokens = 16) const;
  // A KV cache laid out for this model holding `tokens` tokens in all, in
  // host memory or where `allocator` puts it.
  absl::StatusOr<std::unique_ptr<KvCache>> NewKvCache(
      int64_t tokens, std::shared_ptr<KvAllocator> allocator = nullptr) const;

  // Writes this weight set's packed linear layers as an artifact (see
  // quant/artifact.h). FailedPrecondition for FP16 weights.
  absl::Status SaveQuantized(const std::string& path) const;

 private:
  friend class ModelLoader;
  friend class Context;
  friend class CudaBackend;  // engine/cuda: uploads the weights
  struct Layer {
    std::vector<float> attn_norm, ffn_norm;
    std::unique_ptr<LinearWeights> qkv, out, gate_up, down;
  };

  Model();
  // Every linear layer with its artifact name ("blk.3.qkv", "output").
  std::vector<std::pair<std::string, LinearWeights*>> NamedLinears() const;

  ModelConfig config_;
  LoadOptions options_;
  std::string source_spec_;
  Precision precision_ = Precision::kFp16;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::vector<fp16_t> embedding_;  // [vocab][d_model], row-major
  std::vector<float> output_norm_;
  std::unique_ptr<LinearWeights> output_;
  std::vector<Layer> layers_;
  std::vector<float> inv_freq_;
};

// The weights-independent identity of a model that KV bytes depend on:
// architecture, shape, RoPE settings and the tokenizer's fingerprint.
uint64_t ModelFingerprint(const ModelConfig& config, const Tokenizer& tokenizer);

}  // namespace pdq
