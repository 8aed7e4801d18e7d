// Sampling follows the usual order: top-k, then temperature softmax, then
// the smallest top-p nucleus, then a draw.
#include "engine/sampler.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace pdq {

absl::Status ValidateSamplingParams(const SamplingParams& p) {
  if (!(p.temperature >= 0.0f) || !std::isfinite(p.temperature)) {
    return absl::InvalidArgumentError(
        absl::StrCat("temperature must be >= 0, got ", p.temperature));
  }
  if (p.top_k < 0) return absl::InvalidArgumentError(absl::StrCat("top-k must be >= 0, got ", p.top_k));
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("top-p must be in (0, 1], got ", p.top_p));
  }
  return absl::OkStatus();
}

int32_t Argmax(const float* logits, int vocab) {
  int32_t best = 0;
  for (int i = 1; i < vocab; ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  return best;
}

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {}

void Sampler::SkipSamples(int n) {
  if (params_.temperature != 0.0f && params_.top_k != 1) rng_.discard(n);
}

int32_t Sampler::Sample(const float* logits, int vocab) {
  if (params_.temperature == 0.0f || params_.top_k == 1) return Argmax(logits, vocab);
  candidates_.resize(vocab);
  for (int i = 0; i < vocab; ++i) candidates_[i] = {logits[i], i};
  auto by_logit = [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  size_t n = candidates_.size();
  if (params_.top_k > 0 && (size_t)params_.top_k < n) {
    n = params_.top_k;
    std::partial_sort(candidates_.begin(), candidates_.begin() + n, candidates_.end(), by_logit);
  } else {
    std::sort(candidates_.begin(), candidates_.end(), by_logit);
  }
  const float max_logit = candidates_[0].first;
  double sum = 0.0;
  for (size_t i = 0; i < n; ++i) {
    candidates_[i].first = std::exp((candidates_[i].first - max_logit) / params_.temperature);
    sum += candidates_[i].first;
  }
  // The nucleus: the fewest most-likely tokens whose mass reaches top_p.
  if (params_.top_p < 1.0f) {
    double mass = 0.0;
    for (size_t i = 0; i < n; ++i) {
      mass += candidates_[i].first / sum;
      if (mass >= params_.top_p) {
        n = i + 1;
        break;
      }
    }
    sum = 0.0;
    for (size_t i = 0; i < n; ++i) sum += candidates_[i].first;
  }
  // One 64-bit draw (generate_canonical needs ceil(53 / 64) of them), the
  // same value uniform_real_distribution(0, sum) gives; SkipSamples relies
  // on the count.
  const double r = std::generate_canonical<double, 53>(rng_) * sum;
  double acc = 0.0;
  for (size_t i = 0; i < n; ++i) {
    acc += candidates_[i].first;
    if (r < acc) return candidates_[i].second;
  }
  return candidates_[n - 1].second;
}

}  // namespace pdq
