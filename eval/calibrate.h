// Calibration: run a model over a text and record, for every linear layer,
// the largest and mean |activation| on each input channel (SmoothQuant's and
// AWQ's statistics) and, for the layers asked for, the Gram matrix of its
// inputs (GPTQ's and AWQ's objective).
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
  // Layers (by name) whose Gram matrix to collect: k x k floats each, and
  // ~k^2 multiply-adds per input row. Null: none.
  std::function<bool(const std::string&)> want_gram;
};

// InvalidArgument when the text has fewer than 16 tokens.
absl::StatusOr<ActivationStats> CollectActivationStats(Model& model, const std::string& text,
                                                       const CalibrationOptions& options);

}  // namespace pdq
