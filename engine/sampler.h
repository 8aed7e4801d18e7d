// Token sampling: greedy, temperature, top-k and top-p (nucleus), seeded.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "absl/status/status.h"

namespace pdq {

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy (argmax)
  int top_k = 0;             // 0: no limit
  float top_p = 1.0f;        // 1: no limit
  uint64_t seed = 0;
  bool operator==(const SamplingParams&) const = default;
};

// InvalidArgument naming the first out-of-range parameter.
absl::Status ValidateSamplingParams(const SamplingParams& params);

class Sampler {
 public:
  // params must have passed ValidateSamplingParams.
  explicit Sampler(const SamplingParams& params);
  // Picks a token from `vocab` logits. Deterministic for a given seed and
  // sequence of calls (on one kernel path: the weights come from its
  // vector exp): a sampled (not greedy) pick takes exactly one draw.
  int32_t Sample(const float* logits, int vocab);
  // Continues a stream whose first `n` picks another Sampler with the same
  // parameters made (a prefill worker samples the first token, the decode
  // worker the rest), so a split deployment samples what one process would.
  void SkipSamples(int n);

 private:
  static constexpr int kChunk = 1024;  // logits whose weights are summed together
  int32_t SampleTopK(const float* logits, int vocab, float max_logit, double u);
  int32_t SampleNucleus(const float* logits, int vocab, float max_logit, double total, double u);
  // order_: the indices of every logit at least `floor`.
  void GatherAtLeast(const float* logits, int vocab, float floor);
  int32_t DrawFromCandidates(size_t n, double total, double u);

  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<float> weights_, chunk_sums_;  // every token's weight, per 1,024 tokens
  std::vector<int32_t> order_;               // candidates, in likelihood order once drawn from
  std::vector<double> candidate_weights_;    // theirs
};

// Index of the largest logit (the lowest index on ties).
int32_t Argmax(const float* logits, int vocab);

}  // namespace pdq
