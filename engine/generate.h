// Single-sequence generation on top of Model::Forward: prefill the prompt,
// then decode token by token with timing for TTFT and TPOT.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/context.h"
#include "engine/sampler.h"

namespace pdq {

struct GenerateOptions {
  int max_tokens = 128;
  SamplingParams sampling;
  std::vector<int32_t> stop_tokens;  // besides the model's end-of-generation tokens
  bool ignore_eos = false;           // run to max_tokens (benchmarks)
  // Called with each new token and the text it completes (may be empty).
  std::function<void(int32_t, const std::string&)> on_token;
};

struct GenerateResult {
  std::vector<int32_t> tokens;  // generated ids, excluding a final stop token
  std::string text;
  int64_t prompt_tokens = 0;
  double ttft_ms = 0;  // start to first generated token (prefill + sampling)
  double tpot_ms = 0;  // mean time per later token
  std::string stop_reason;  // "eos", "stop_token" or "max_tokens"
};

// Generates from `prompt` (token ids) with the context's model and threads.
// InvalidArgument for an empty prompt, ids outside the vocabulary or bad
// sampling params; OutOfRange when the prompt fills the model's context.
absl::StatusOr<GenerateResult> Generate(Context& ctx, const std::vector<int32_t>& prompt,
                                        const GenerateOptions& options);

}  // namespace pdq
