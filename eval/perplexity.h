// Perplexity by llama.cpp's `llama-perplexity` method, so figures compare
// with published ones: tokenize the whole text, cut non-overlapping windows
// of ctx tokens (the first replaced by BOS when the tokenizer adds one), and
// score only the second half of each window.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "engine/model.h"

namespace pdq {

struct PerplexityOptions {
  int ctx = 512;
  int64_t max_chunks = 0;  // 0: every full window in the text
  // Called after each chunk with (chunks done, chunks total, running ppl).
  std::function<void(int64_t, int64_t, double)> progress;
};

struct PerplexityResult {
  double ppl = 0;
  double nll_mean = 0;
  int64_t tokens_scored = 0;
  int64_t chunks = 0;
  double seconds = 0;
};

// InvalidArgument when ctx is out of range or the text is shorter than two
// windows.
absl::StatusOr<PerplexityResult> ComputePerplexity(Model& model, const std::string& text,
                                                   const PerplexityOptions& options);

// -log softmax(logits)[target], in double precision.
double TokenNll(const float* logits, int vocab, int32_t target);

}  // namespace pdq
