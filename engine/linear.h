// Linear layers y = x W^T (+ b) at a weight precision: the interface the
// forward pass calls, and the writable backends (FP16, W8A8, W4A16) the
// loader fills, one class per storage format.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/kernels.h"

namespace pdq {

// Weight precision is a property of a loaded weight set, chosen per process.
// FP16 is the reference; W8A8 (int8 weights and per-token int8 activations,
// integer dot products) is for compute-bound prefill; W4A16 (4-bit groups,
// 16-bit activations) is for bandwidth-bound decode.
enum class Precision { kFp16, kW8A8, kW4A16 };
const char* PrecisionName(Precision p);
// Parses "fp16" / "w8a8" / "w4a16"; InvalidArgument names the accepted values.
absl::StatusOr<Precision> ParsePrecision(const std::string& name);

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

// True when `name` matches `pattern`, where '*' matches any run of characters.
bool MatchesLayerPattern(const std::string& pattern, const std::string& name);

// A linear layer's weights as a device backend uploads them: exactly one of
// f16, i8, w4 and w8 holds data, with the per-input scale x is multiplied by
// before the product (AWQ, SmoothQuant; null without) and the bias (null
// or empty without). Views into the layer; valid while it lives.
struct PackedLinear {
  PackedF16 f16;
  PackedI8 i8;
  PackedW4 w4;
  PackedW8 w8;
  const float* in_scale = nullptr;
  const std::vector<float>* bias = nullptr;
};

// A linear layer whose storage format is the backend's own.
class LinearWeights {
 public:
  virtual ~LinearWeights() = default;
  virtual int64_t in_features() const = 0;
  virtual int64_t out_features() const = 0;
  // Bytes of weight data streamed by one Forward call.
  virtual int64_t weight_bytes() const = 0;
  // x: m rows, ldx apart; y: m rows, ldy apart. The weights are read-only
  // and any scratch belongs to the calling thread, so several threads may
  // call Forward at once, each with its own CpuContext (a pool runs one
  // caller at a time).
  virtual void Forward(const CpuContext& ctx, const float* x, int64_t m, int64_t ldx, float* y,
                       int64_t ldy) const = 0;
  // True when prompt rows (CpuContext::prompt_rows) take other kernels than
  // decode rows of the same count, so a pass with both calls Forward once
  // for each.
  virtual bool prompt_path_differs() const { return false; }
  virtual PackedLinear Packed() const = 0;
};

class WritableLinear : public LinearWeights {
 public:
  // Stores output features [row0, row0 + rows) from row-major fp32 `src`
  // (rows x in_features). Safe to call concurrently for disjoint panels of 16
  // rows.
  virtual void SetRows(int64_t row0, int64_t rows, const float* src) = 0;
  // Adds a bias to output features [row0, row0 + b.size()).
  void SetBias(int64_t row0, const std::vector<float>& b);

  // Called once after every row is set, with the layer's calibration
  // statistics when there are any (null otherwise). Layers that need them
  // (SmoothQuant, calibrated W4 methods) fail with FailedPrecondition
  // without.
  virtual absl::Status Finalize(const LayerStats* stats) { return absl::OkStatus(); }

  // The packed weights (not the bias) as raw bytes, for quantized artifacts.
  virtual std::string SerializeWeights() const = 0;
  // Restores what SerializeWeights wrote for a layer of the same shape and
  // format; InvalidArgument when the size does not match.
  virtual absl::Status DeserializeWeights(std::string_view bytes) = 0;

 protected:
  void AddBias(float* y, int64_t m, int64_t ldy) const;
  std::vector<float> bias_;
};

struct LinearOptions {
  Precision precision = Precision::kFp16;
  int w4_group = 128;
  bool w4_symmetric = false;
  float smooth_alpha = 0.0f;  // W8A8: SmoothQuant migration strength; 0 is off
  W4Method w4_method = W4Method::kRtn;
  // W4A16: in decode calls of this many rows up to kW4IntMaxRows (batched
  // decode; prompt rows never), int8 activations per group
  // (PackedW4::a8_min_rows); 0: never. A run-time choice, not part of the
  // stored weights.
  int w4_a8_min_rows = 0;
  // Store this layer as W8A16 (int8 weights per group of kW8Group inputs,
  // 16-bit activations) whatever `precision` says: for layers too sensitive
  // for the precision's own format (LoadOptions::w8_layers).
  bool w8a16 = false;
  // W4A16 and W8A16 layers: in calls of this many rows or more, bf16
  // activations and weights in AMX tiles where the CPU has them
  // (PackedW4::bf16_min_rows, PackedW8::bf16_min_rows); 0: never. A run-time
  // choice, like w4_a8_min_rows.
  int bf16_min_rows = 0;
};

std::unique_ptr<WritableLinear> MakeLinear(const LinearOptions& options, int64_t out, int64_t in);

}  // namespace pdq
