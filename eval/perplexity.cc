// Windowed perplexity over one model; each window is its own KV sequence.
#include "eval/perplexity.h"

#include <chrono>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/check.h"

namespace pdq {

double TokenNll(const float* logits, int vocab, int32_t target) {
  float max_logit = logits[0];
  for (int i = 1; i < vocab; ++i) max_logit = std::max(max_logit, logits[i]);
  double sum = 0.0;
  for (int i = 0; i < vocab; ++i) sum += std::exp((double)logits[i] - max_logit);
  return std::log(sum) + max_logit - logits[target];
}

absl::StatusOr<PerplexityResult> ComputePerplexity(Model& model, const std::string& text,
                                                   const PerplexityOptions& options) {
  const ModelConfig& c = model.config();
  if (options.ctx < 4 || options.ctx > c.max_context) {
    return absl::InvalidArgumentError(absl::StrCat("--ctx must be in [4, ", c.max_context,
                                                   "], got ", options.ctx));
  }
  if (options.max_chunks < 0) return absl::InvalidArgumentError("--chunks must be >= 0");
  const auto start = std::chrono::steady_clock::now();
  const Tokenizer& tok = model.tokenizer();
  const std::vector<int32_t> tokens = tok.Encode(text, tok.add_bos(), /*parse_special=*/false);
  const int64_t ctx = options.ctx;
  if ((int64_t)tokens.size() < 2 * ctx) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the text has ", tokens.size(), " tokens; perplexity with --ctx ", ctx,
        " needs at least ", 2 * ctx));
  }
  int64_t chunks = (int64_t)tokens.size() / ctx;
  if (options.max_chunks > 0) chunks = std::min(chunks, options.max_chunks);
  const int64_t first = ctx / 2;

  PDQ_ASSIGN_OR_RETURN(std::unique_ptr<KvCache> kv, model.NewKvCache(ctx));
  PerplexityResult result;
  double nll_sum = 0.0;
  Logits logits;
  std::vector<int32_t> window(ctx);
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    std::copy(tokens.begin() + chunk * ctx, tokens.begin() + (chunk + 1) * ctx, window.begin());
    if (tok.add_bos() && tok.bos_id() >= 0) window[0] = tok.bos_id();
    const SeqId seq = kv->AddSequence();
    // Logits for positions first .. ctx-1; position j predicts token j + 1.
    BatchEntry entry{seq, window, ctx - first};
    PDQ_RETURN_IF_ERROR(model.Forward(*kv, {&entry, 1}, &logits));
    kv->RemoveSequence(seq);
    for (int64_t j = first; j < ctx - 1; ++j) {
      nll_sum += TokenNll(logits.Row(0, j - first), c.vocab_size, window[j + 1]);
      ++result.tokens_scored;
    }
    result.chunks = chunk + 1;
    if (options.progress) {
      options.progress(chunk + 1, chunks, std::exp(nll_sum / (double)result.tokens_scored));
    }
  }
  result.nll_mean = nll_sum / (double)result.tokens_scored;
  result.ppl = std::exp(result.nll_mean);
  result.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace pdq
