// Drift of greedy generation under a (prefill, decode) precision pair
// against a reference model. Both run in lockstep on the reference's own
// greedy continuation (teacher forcing), so every position compares the two
// next-token distributions in the same context; the first position where the
// argmaxes differ is where free-running generations would part.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/context.h"

namespace pdq {

struct DriftOptions {
  int max_tokens = 128;
  // Called after each generated position with (position, max_tokens).
  std::function<void(int, int)> progress;
  // KV reuse (a prefix cache): the test side continues these sequences of
  // `test_kv`, one per prompt, which already hold the KV of each prompt's
  // first Length(seq) tokens (written by whatever wrote them), and prefills
  // only the rest. Null: a fresh cache, every prompt prefilled whole.
  KvCache* test_kv = nullptr;
  std::vector<SeqId> test_seqs;
};

struct DriftResult {
  // Per generated position, averaged over prompts.
  std::vector<double> kl_mean;    // KL(reference || test)
  std::vector<double> agreement;  // fraction of prompts with the same argmax
  // Per prompt: first position whose argmax differs, or -1 when none does.
  std::vector<int64_t> first_divergence;
  // Per prompt: the reference's greedy tokens (what both models were fed).
  std::vector<std::vector<int32_t>> reference_tokens;
  double kl_overall = 0;
  double agreement_overall = 0;
};

// `prefill` produces each prompt's KV cache and first token's distribution;
// `decode` continues from that cache. Prompts are token ids (non-empty).
// InvalidArgument for empty prompts or mismatched models; OutOfRange when a
// prompt plus max_tokens exceeds the context.
absl::StatusOr<DriftResult> MeasureDrift(Context& reference, Context& prefill, Context& decode,
                                         const std::vector<std::vector<int32_t>>& prompts,
                                         const DriftOptions& options);

}  // namespace pdq
