// A loaded Llama-family model (llama, qwen2): configuration, one weight set
// at one precision, its tokenizer, and the batched forward pass over a paged
// KV cache.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/kv_cache.h"
#include "engine/tokenizer.h"
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

// Weight precision is a property of a loaded weight set, chosen per process.
// FP16 is the reference; W8A8 (int8 weights and per-token int8 activations,
// integer dot products) is for compute-bound prefill; W4A16 (4-bit groups,
// float activations) is for bandwidth-bound decode.
enum class Precision { kFp16, kW8A8, kW4A16 };
const char* PrecisionName(Precision p);
// Parses "fp16" / "w8a8" / "w4a16"; InvalidArgument names the accepted values.
absl::StatusOr<Precision> ParsePrecision(const std::string& name);

// A linear layer y = x W^T (+ b) whose storage format is the backend's own.
class LinearWeights {
 public:
  virtual ~LinearWeights() = default;
  virtual int64_t in_features() const = 0;
  virtual int64_t out_features() const = 0;
  // Bytes of weight data streamed by one Forward call.
  virtual int64_t weight_bytes() const = 0;
  // x: m rows, ldx apart; y: m rows, ldy apart. Safe for concurrent use.
  virtual void Forward(const CpuContext& ctx, const float* x, int64_t m, int64_t ldx, float* y,
                       int64_t ldy) const = 0;
};

// One forward-pass request: append `tokens` to sequence `seq` of the cache.
struct BatchEntry {
  SeqId seq = 0;
  std::span<const int32_t> tokens;
  // Logits for the last num_logits new tokens (1: next-token prediction;
  // tokens.size(): every position, for scoring).
  int64_t num_logits = 1;
};

// Logits of a Forward call: rows in batch order, vocab_size floats each.
struct Logits {
  std::vector<float> data;
  std::vector<int64_t> first_row;  // per batch entry
  std::vector<int64_t> num_rows;   // per batch entry
  int vocab_size = 0;
  const float* Row(size_t entry, int64_t i) const {
    return data.data() + (first_row[entry] + i) * vocab_size;
  }
};

// How W4A16 codes are chosen. RTN rounds each group to nearest; the others
// need calibration statistics with Gram matrices (LayerStats::gram): AWQ
// scales input channels by a searched power of their mean |activation|
// (the inverse scales ride along at run time), GPTQ compensates rounding
// errors through the inputs' Gram matrix, and "awq+gptq" runs GPTQ on the
// AWQ-scaled weights.
enum class W4Method { kRtn, kAwq, kGptq, kAwqGptq };
const char* W4MethodName(W4Method m);
// Parses "rtn" / "awq" / "gptq" / "awq+gptq"; InvalidArgument otherwise.
absl::StatusOr<W4Method> ParseW4Method(const std::string& name);

// Calibration statistics of one linear layer's inputs.
struct LayerStats {
  std::vector<float> absmax;    // largest |x| per input channel (SmoothQuant)
  std::vector<float> mean_abs;  // mean |x| per input channel (AWQ)
  std::vector<float> gram;      // mean of x x^T, k x k row-major; empty unless collected
  int64_t rows = 0;             // inputs seen
};
// Per linear layer name ("blk.3.qkv", "output").
using ActivationStats = std::map<std::string, LayerStats>;

struct LoadOptions {
  Precision precision = Precision::kFp16;
  int w4_group = 128;          // 32, 64 or 128 inputs per scale
  bool w4_symmetric = false;   // asymmetric (scale and min) by default
  W4Method w4_method = W4Method::kRtn;  // non-RTN methods need activation_stats with Gram
  // Linear layers that stay FP16 under a quantized precision: patterns with
  // '*' wildcards over the names "blk.N.qkv", "blk.N.out", "blk.N.gate_up",
  // "blk.N.down" and "output" (e.g. {"output", "blk.*.down"}).
  std::vector<std::string> fp16_layers;
  // W8A8 SmoothQuant: migration strength alpha (0 = off). The statistics it
  // and the calibrated W4 methods need come from CollectActivationStats over
  // a calibration text.
  float smooth_alpha = 0.0f;
  const ActivationStats* activation_stats = nullptr;
  // A `pdq quantize` artifact made from this same model: its packed weights
  // are loaded as they are, and its scheme and parameters replace the
  // precision fields above.
  std::string quantized_weights;
  int threads = 0;  // 0: every core
  bool verbose = false;  // progress on stderr
};

class Model {
 public:
  // `spec` is a GGUF path, or "synthetic:NAME" for deterministic random
  // weights of a named shape (see SyntheticModelNames()).
  static absl::StatusOr<std::unique_ptr<Model>> Load(const std::string& spec,
                                                     const LoadOptions& options);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const { return config_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  Precision precision() const { return precision_; }
  const CpuContext& context() const { return ctx_; }
  int num_threads() const { return pool_->size(); }
  // Bytes of weights read to produce one token (all matmuls incl. output).
  int64_t weight_bytes_per_token() const;

  // A KV cache shaped for this model holding `tokens` tokens in all.
  absl::StatusOr<std::unique_ptr<KvCache>> NewKvCache(int64_t tokens) const;

  // Called with every linear layer's input during Forward (name, rows, row
  // count, width); for calibration. Null to stop.
  using ActivationObserver =
      std::function<void(const std::string&, const float*, int64_t, int64_t)>;
  void SetActivationObserver(ActivationObserver observer) { observer_ = std::move(observer); }

  // Writes this weight set's packed linear layers as an artifact (see
  // engine/artifact.h). FailedPrecondition for FP16 weights.
  absl::Status SaveQuantized(const std::string& path) const;

  // Runs all entries as one batch. Validates everything first (token ids,
  // context length, KV capacity); on error the cache is unchanged. One call
  // at a time per Model (it owns one workspace); the cache may have been
  // written by another Model of the same shape.
  absl::Status Forward(KvCache& kv, std::span<const BatchEntry> batch, Logits* logits);

 private:
  friend class ModelLoader;
  struct Layer {
    std::vector<float> attn_norm, ffn_norm;
    std::unique_ptr<LinearWeights> qkv, out, gate_up, down;
  };
  struct Workspace;

  Model();
  // Every linear layer with its artifact name ("blk.3.qkv", "output").
  std::vector<std::pair<std::string, LinearWeights*>> NamedLinears() const;

  ModelConfig config_;
  LoadOptions options_;
  std::string source_spec_;
  Precision precision_ = Precision::kFp16;
  std::unique_ptr<ThreadPool> pool_;
  CpuContext ctx_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::vector<fp16_t> embedding_;  // [vocab][d_model], row-major
  std::vector<float> output_norm_;
  std::unique_ptr<LinearWeights> output_;
  std::vector<Layer> layers_;
  std::vector<float> inv_freq_;
  std::unique_ptr<Workspace> ws_;
  ActivationObserver observer_;
};

// True when `name` matches `pattern`, where '*' matches any run of characters.
bool MatchesLayerPattern(const std::string& pattern, const std::string& name);

// Names accepted after "synthetic:".
std::vector<std::string> SyntheticModelNames();

}  // namespace pdq
