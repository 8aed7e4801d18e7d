// Sampling follows the usual order: top-k, then temperature softmax, then
// the smallest top-p nucleus, then a draw.
#include "engine/sampler.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/kernels.h"

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

int32_t Argmax(const float* logits, int vocab) { return (int32_t)ArgmaxRow(logits, vocab); }

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {}

void Sampler::SkipSamples(int n) {
  if (params_.temperature != 0.0f && params_.top_k != 1) rng_.discard(n);
}

// A sampled pick costs about what one pass over the logits costs: the
// weights exp((logit - max) / temperature) come from a vector kernel
// (ExpRow) in chunks whose sums locate the draw, and only top-k's candidates
// or the tokens that can hold top-p's nucleus are ever sorted. (It sorted
// the whole vocabulary for every pick: 3.5 ms a token at 49,152 entries, at
// the OpenAI API's default temperature of 1.)
int32_t Sampler::Sample(const float* logits, int vocab) {
  if (params_.temperature == 0.0f || params_.top_k == 1) return Argmax(logits, vocab);
  const int32_t top = Argmax(logits, vocab);
  const float max_logit = logits[top];
  // One 64-bit draw per pick whatever the path (generate_canonical needs
  // ceil(53 / 64) of them; SkipSamples relies on the count).
  const double u = std::generate_canonical<double, 53>(rng_);
  // An infinite largest logit is certain; all -inf or NaN leave no
  // distribution to draw from: the argmax either way.
  if (!std::isfinite(max_logit)) return top;
  if (params_.top_k > 0 && params_.top_k < vocab) return SampleTopK(logits, vocab, max_logit, u);
  const float scale = 1.0f / params_.temperature;
  weights_.resize(vocab);
  const int chunks = (vocab + kChunk - 1) / kChunk;
  chunk_sums_.resize(chunks);
  double total = 0.0;
  for (int c = 0; c < chunks; ++c) {
    const int begin = c * kChunk;
    chunk_sums_[c] = ExpRow(logits + begin, std::min(kChunk, vocab - begin), max_logit, scale,
                            weights_.data() + begin);
    total += chunk_sums_[c];
  }
  if (params_.top_p < 1.0f) return SampleNucleus(logits, vocab, max_logit, total, u);
  // The inverse of the distribution function in index order (any fixed
  // order draws from the same distribution): the chunk, then the token.
  const double r = u * total;
  double acc = 0.0;
  for (int c = 0; c < chunks; ++c) {
    if (r >= acc + chunk_sums_[c]) {
      acc += chunk_sums_[c];
      continue;
    }
    const int begin = c * kChunk, end = std::min(vocab, begin + kChunk);
    int32_t last = top;
    for (int i = begin; i < end; ++i) {
      if (weights_[i] == 0.0f) continue;
      last = i;
      acc += weights_[i];
      if (r < acc) return i;
    }
    return last;  // the chunk's vector sum and this scan rounded apart
  }
  return top;  // u * total rounded up to the total
}

namespace {

// Likelihood order: the larger logit first, the lower index among equals.
struct Likelier {
  const float* logits;
  bool operator()(int32_t a, int32_t b) const {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  }
};

}  // namespace

void Sampler::GatherAtLeast(const float* logits, int vocab, float floor) {
  order_.clear();
  for (int i = 0; i < vocab; ++i) {
    if (logits[i] >= floor) order_.push_back(i);
  }
}

// Top-k's candidates are the k likeliest tokens, which lie within any set
// of every token above a floor that holds at least k: gather those within a
// widening span of the largest logit and order only them.
int32_t Sampler::SampleTopK(const float* logits, int vocab, float max_logit, double u) {
  const size_t k = params_.top_k;
  for (float span : {4.0f, 16.0f, 64.0f, 256.0f, INFINITY}) {
    GatherAtLeast(logits, vocab, max_logit - span);
    if (order_.size() >= k) break;
  }
  const size_t n = std::min(k, order_.size());  // fewer only where the rest are NaN
  std::partial_sort(order_.begin(), order_.begin() + n, order_.end(), Likelier{logits});
  candidate_weights_.resize(n);
  double total = 0.0;
  for (size_t i = 0; i < n; ++i) {
    total += candidate_weights_[i] =
        std::exp((logits[order_[i]] - max_logit) / params_.temperature);
  }
  return DrawFromCandidates(n, total, u);
}

// The nucleus, the fewest most likely tokens whose mass reaches top_p, is a
// prefix of the tokens in likelihood order, so it lies within any set of
// every token above a floor whose mass reaches top_p: gather those within a
// widening span of the largest logit (weights_ holds every token's) and
// order only them.
int32_t Sampler::SampleNucleus(const float* logits, int vocab, float max_logit, double total,
                               double u) {
  const double need = params_.top_p * total;
  for (float span : {4.0f, 16.0f, 64.0f, 256.0f, INFINITY}) {
    GatherAtLeast(logits, vocab, max_logit - span * params_.temperature);
    double mass = 0.0;
    for (int32_t i : order_) mass += weights_[i];
    if (mass >= need) break;
  }
  std::sort(order_.begin(), order_.end(), Likelier{logits});
  candidate_weights_.resize(order_.size());
  for (size_t i = 0; i < order_.size(); ++i) candidate_weights_[i] = weights_[order_[i]];
  return DrawFromCandidates(order_.size(), total, u);
}

// order_[0, n) in likelihood order, candidate_weights_ theirs (of `total`
// in all): cut to top-p's nucleus, then draw.
int32_t Sampler::DrawFromCandidates(size_t n, double total, double u) {
  if (params_.top_p < 1.0f) {
    const double need = params_.top_p * total;
    double mass = 0.0;
    for (size_t i = 0; i < n; ++i) {
      mass += candidate_weights_[i];
      if (mass >= need) {
        n = i + 1;
        break;
      }
    }
  }
  double sum = 0.0;
  for (size_t i = 0; i < n; ++i) sum += candidate_weights_[i];
  const double r = u * sum;
  double acc = 0.0;
  for (size_t i = 0; i < n; ++i) {
    acc += candidate_weights_[i];
    if (r < acc) return order_[i];
  }
  return order_[n - 1];
}

}  // namespace pdq
