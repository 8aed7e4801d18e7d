// Calibration: run a model over a text and record, for every linear layer,
// the largest |activation| on each input channel (SmoothQuant's statistics).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "engine/model.h"

namespace pdq {

struct CalibrationOptions {
  int ctx = 512;               // window length in tokens
  int64_t max_windows = 16;    // windows of the text to run
  std::function<void(int64_t, int64_t)> progress;  // (done, total)
};

// InvalidArgument when the text has fewer than 16 tokens.
absl::StatusOr<ActivationStats> CollectActivationStats(Model& model, const std::string& text,
                                                       const CalibrationOptions& options);

}  // namespace pdq
