// Perplexity by llama.cpp's `llama-perplexity` method, so figures compare
// with published ones: tokenize the whole text, cut non-overlapping windows
// of ctx tokens (the first replaced by BOS when the tokenizer adds one), and
// score only the second half of each window.
//
// Disaggregated mode (a decode model is given) does what a prefill/decode
// split deployment does: each window's first half is prefilled by the main
// model, and the second half is fed token by token to the decode model,
// which reads the KV cache the main model wrote. With a KL reference the
// same positions are also compared with the reference model's distributions.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "engine/context.h"

namespace pdq {

struct PerplexityOptions {
  int ctx = 512;
  int64_t max_chunks = 0;         // 0: every full window in the text
  Context* decode = nullptr;        // disaggregated mode when set
  Context* kl_reference = nullptr;  // also KL divergence and top-1 agreement
  int parallel_windows = 8;       // windows decoded as one batch (disaggregated mode)
  // Called after each chunk with (chunks done, chunks total, running ppl).
  std::function<void(int64_t, int64_t, double)> progress;
};

struct PerplexityResult {
  double ppl = 0;
  double nll_mean = 0;
  int64_t tokens_scored = 0;
  int64_t chunks = 0;
  double seconds = 0;
  bool has_kl = false;
  double kl_mean = 0;  // mean KL(reference || model) in nats
  double kl_p99 = 0;   // 99th percentile of the per-token KL
  double top1_agreement = 0;  // fraction of positions with the same argmax
};

// Scores with `model`'s weights (the prefill side in disaggregated mode).
// InvalidArgument when ctx is out of range, the text is shorter than two
// windows, or the models differ in vocabulary or KV layout.
absl::StatusOr<PerplexityResult> ComputePerplexity(Context& model, const std::string& text,
                                                   const PerplexityOptions& options);

// InvalidArgument unless `b` can read `a`'s KV cache and logits: the same KV
// layout (which covers the vocabulary through the tokenizer's fingerprint).
// `role` names b in the message. Without `shares_kv` (a reference scoring
// on its own cache) the element types may differ.
absl::Status CheckCompatible(const Model& a, const Model& b, const char* role,
                             bool shares_kv = true);

// -log softmax(logits)[target], in double precision.
double TokenNll(const float* logits, int vocab, int32_t target);

// KL(softmax(p) || softmax(q)) for two logit rows, in double precision.
double KlFromLogits(const float* p, const float* q, int vocab);

}  // namespace pdq
