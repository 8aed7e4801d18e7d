// Weight-set backends behind LinearWeights: one class per storage format.
// The loader fills them row range by row range from fp32 values that are
// first rounded to FP16, so every precision quantizes the same FP16 reference.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "engine/model.h"

namespace pdq {

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
};

std::unique_ptr<WritableLinear> MakeLinear(const LinearOptions& options, int64_t out, int64_t in);

}  // namespace pdq
