// Lockstep teacher-forced comparison: the reference chooses every token, both
// models score it, all prompts advance together as one batch per model.
#include "eval/drift.h"

#include <algorithm>
#include <cmath>
#include <span>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "engine/sampler.h"
#include "eval/perplexity.h"

namespace pdq {
absl::StatusOr<DriftResult> MeasureDrift(Context& reference, Context& prefill, Context& decode,
                                         const std::vector<std::vector<int32_t>>& prompts,
                                         const DriftOptions& options) {
  const ModelConfig& c = reference.model().config();
  // The reference scores on a cache of its own (its dtype may differ);
  // prefill and decode share one.
  PDQ_RETURN_IF_ERROR(CheckCompatible(reference.model(), prefill.model(), "prefill", false));
  PDQ_RETURN_IF_ERROR(CheckCompatible(prefill.model(), decode.model(), "decode"));
  if (prompts.empty()) return absl::InvalidArgumentError("no prompts");
  if (options.max_tokens < 1) return absl::InvalidArgumentError("max tokens must be >= 1");
  if (options.test_kv != nullptr && options.test_seqs.size() != prompts.size()) {
    return absl::InvalidArgumentError("test_seqs must name one sequence per prompt");
  }
  std::vector<int64_t> held(prompts.size(), 0);
  int64_t total = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (prompts[i].empty()) {
      return absl::InvalidArgumentError(absl::StrCat("prompt ", i + 1, " is empty"));
    }
    if (options.test_kv != nullptr) {
      PDQ_ASSIGN_OR_RETURN(held[i], options.test_kv->Length(options.test_seqs[i]));
      if (held[i] >= (int64_t)prompts[i].size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("prompt ", i + 1, " has ", prompts[i].size(),
                         " tokens; its reused KV must hold fewer, not ", held[i]));
      }
    }
    const int64_t need = (int64_t)prompts[i].size() + options.max_tokens;
    if (need > c.max_context) {
      return absl::OutOfRangeError(absl::StrCat("prompt ", i + 1, " plus ", options.max_tokens,
                                                " tokens exceeds the context of ", c.max_context));
    }
    total += prefill.model().kv_layout().SequenceTokens(need);
  }
  const int vocab = c.vocab_size;
  const size_t n = prompts.size();
  PDQ_ASSIGN_OR_RETURN(std::unique_ptr<KvCache> ref_kv, reference.model().NewKvCache(total));
  std::unique_ptr<KvCache> own_kv;
  KvCache* test_kv = options.test_kv;
  if (test_kv == nullptr) {
    PDQ_ASSIGN_OR_RETURN(own_kv, prefill.model().NewKvCache(total));
    test_kv = own_kv.get();
  }

  std::vector<SeqId> ref_seq(n), test_seq(n);
  std::vector<BatchEntry> ref_batch(n), test_batch(n);
  for (size_t i = 0; i < n; ++i) {
    ref_seq[i] = ref_kv->AddSequence();
    test_seq[i] = options.test_kv != nullptr ? options.test_seqs[i] : test_kv->AddSequence();
    ref_batch[i] = BatchEntry{ref_seq[i], prompts[i], 1};
    test_batch[i] =
        BatchEntry{test_seq[i], std::span<const int32_t>(prompts[i]).subspan(held[i]), 1, true};
  }
  DriftResult result;
  result.first_divergence.assign(n, -1);
  result.reference_tokens.assign(n, {});
  Logits ref_logits, test_logits;
  PDQ_RETURN_IF_ERROR(reference.ForwardAll(*ref_kv, ref_batch, &ref_logits));
  PDQ_RETURN_IF_ERROR(prefill.ForwardAll(*test_kv, test_batch, &test_logits));
  std::vector<int32_t> next(n);
  double kl_total = 0;
  int64_t agree_total = 0;
  for (int pos = 0; pos < options.max_tokens; ++pos) {
    double kl_sum = 0;
    int64_t agree = 0;
    for (size_t i = 0; i < n; ++i) {
      const float* r = ref_logits.Row(i, 0);
      const float* t = test_logits.Row(i, 0);
      kl_sum += KlFromLogits(r, t, vocab);
      next[i] = Argmax(r, vocab);
      result.reference_tokens[i].push_back(next[i]);
      const bool same = next[i] == Argmax(t, vocab);
      agree += same;
      if (!same && result.first_divergence[i] < 0) result.first_divergence[i] = pos;
    }
    result.kl_mean.push_back(kl_sum / (double)n);
    result.agreement.push_back((double)agree / (double)n);
    kl_total += kl_sum;
    agree_total += agree;
    if (options.progress) options.progress(pos + 1, options.max_tokens);
    if (pos + 1 == options.max_tokens) break;
    for (size_t i = 0; i < n; ++i) {
      ref_batch[i] = BatchEntry{ref_seq[i], {&next[i], 1}, 1};
      test_batch[i] = BatchEntry{test_seq[i], {&next[i], 1}, 1};
    }
    PDQ_RETURN_IF_ERROR(reference.ForwardAll(*ref_kv, ref_batch, &ref_logits));
    PDQ_RETURN_IF_ERROR(decode.ForwardAll(*test_kv, test_batch, &test_logits));
  }
  const double count = (double)n * (double)options.max_tokens;
  result.kl_overall = kl_total / count;
  result.agreement_overall = (double)agree_total / count;
  return result;
}

}  // namespace pdq
