// Calibration: run a model over a text and record, for every linear layer,
// the largest and mean |activation| on each input channel (SmoothQuant's and
// AWQ's statistics) and, for the layers asked for, the Gram matrix of its
// inputs (GPTQ's and AWQ's objective).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "engine/context.h"

namespace pdq {

struct CalibrationOptions {
  int ctx = 512;               // window length in tokens
  int64_t max_windows = 16;    // windows of the text to run
  std::function<void(int64_t, int64_t)> progress = nullptr;  // (done, total)
  // Layers (by name) whose Gram matrix to collect: k x k floats each, and
  // ~k^2 multiply-adds per input row. Null: none.
  std::function<bool(const std::string&)> want_gram = nullptr;
  // Every other window is the text's paragraphs rendered as conversations
  // with the model's chat template, special tokens included, so the
  // statistics also cover the chat-formatted prompts a server sees (the
  // chat tokens carry activation outliers plain text never shows; without
  // them SmoothQuant scales that ruin chat answers).
  bool chat_windows = false;
};

// InvalidArgument when the text has fewer than 16 tokens.
// Runs on `context` (its model and threads); the context's observer is
// used and cleared.
absl::StatusOr<ActivationStats> CollectActivationStats(Context& context, const std::string& text,
                                                       const CalibrationOptions& options);

// A local cache of statistics without Gram matrices (host byte order; a
// cache, not an interchange format). Save writes a temporary file and
// renames it, so a reader never sees half a file; Load returns
// InvalidArgument for anything that is not a complete file of this format.
absl::Status SaveActivationStats(const ActivationStats& stats, const std::string& path);
absl::StatusOr<ActivationStats> LoadActivationStats(const std::string& path);

}  // namespace pdq
