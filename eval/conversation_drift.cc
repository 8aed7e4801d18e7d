// Drift over a scripted conversation (eval/conversation_drift.h).
#include "eval/conversation_drift.h"

#include <algorithm>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "eval/drift.h"

namespace pdq {

absl::StatusOr<ConversationDriftResult> MeasureConversationDrift(
    Context& reference, Context& prefill, Context& decode, const std::vector<std::string>& turns,
    const ConversationDriftOptions& o) {
  if (turns.empty()) return absl::InvalidArgumentError("the conversation has no turns");
  if (o.follow_ups_at_decode && !o.reuse_kv) {
    return absl::InvalidArgumentError("follow-ups prefilled at the decode precision need reuse_kv");
  }
  const Tokenizer& tok = reference.model().tokenizer();
  std::vector<ChatMessage> history;
  std::unique_ptr<KvCache> kept;
  SeqId seq = 0;
  std::vector<int32_t> stored;  // the tokens whose KV `kept` holds
  if (o.reuse_kv) {
    PDQ_ASSIGN_OR_RETURN(kept, prefill.model().NewKvCache(prefill.model().config().max_context));
    seq = kept->AddSequence();
  }
  ConversationDriftResult out;
  int64_t reused_total = 0, prompt_total = 0;
  double kl_sum = 0, agree_sum = 0;
  for (size_t k = 0; k < turns.size(); ++k) {
    history.push_back({"user", turns[k]});
    PDQ_ASSIGN_OR_RETURN(const std::string rendered, tok.ApplyChatTemplate(history, true));
    const std::vector<int32_t> prompt = tok.Encode(rendered, tok.add_bos(), true);
    DriftOptions options;
    options.max_tokens = o.turn_tokens;
    int64_t reused = 0;
    if (o.reuse_kv) {
      // Whole blocks of the common prefix, at most the prompt less one
      // token: what the prefix cache would reuse.
      const int64_t bt = kept->layout().block_tokens;
      const size_t common =
          std::mismatch(stored.begin(), stored.end(), prompt.begin(), prompt.end()).first -
          stored.begin();
      reused = std::min<int64_t>((int64_t)common, (int64_t)prompt.size() - 1) / bt * bt;
      PDQ_RETURN_IF_ERROR(kept->SetLength(seq, reused));
      options.test_kv = kept.get();
      options.test_seqs = {seq};
    }
    reused_total += reused;
    prompt_total += (int64_t)prompt.size();
    Context& writer = o.follow_ups_at_decode && k > 0 ? decode : prefill;
    absl::StatusOr<DriftResult> r = MeasureDrift(reference, writer, decode, {prompt}, options);
    if (!r.ok()) {
      return absl::Status(r.status().code(),
                          absl::StrCat("turn ", k + 1, ": ", r.status().message()));
    }
    // The answer ends at the reference's end-of-generation token, which is
    // scored (predicting the end is part of the answer) but not kept.
    const std::vector<int32_t>& ref = r->reference_tokens[0];
    if (o.reuse_kv) {
      // The prompt and every answer token fed back (all but the last).
      stored = prompt;
      stored.insert(stored.end(), ref.begin(), ref.end() - 1);
      PDQ_CHECK(*kept->Length(seq) == (int64_t)stored.size());
    }
    size_t len = ref.size();
    for (size_t p = 0; p < ref.size(); ++p) {
      if (tok.IsEndOfGeneration(ref[p])) {
        len = p + 1;
        break;
      }
    }
    double kl = 0, agree = 0;
    for (size_t p = 0; p < len; ++p) {
      kl += r->kl_mean[p];
      agree += r->agreement[p];
      out.kl_by_position.push_back(r->kl_mean[p]);
      out.agreement_by_position.push_back(r->agreement[p]);
    }
    kl_sum += kl;
    agree_sum += agree;
    std::vector<int32_t> answer(ref.begin(), ref.begin() + len);
    if (!answer.empty() && tok.IsEndOfGeneration(answer.back())) answer.pop_back();
    PDQ_ASSIGN_OR_RETURN(const std::string said, tok.Decode(answer));
    history.push_back({"assistant", said});
    ConversationTurnDrift t;
    t.turn = (int)k + 1;
    t.prompt_tokens = (int64_t)prompt.size();
    t.reused_tokens = reused;
    t.answer_tokens = (int64_t)len;
    t.kl_mean = kl / (double)len;
    t.agreement = agree / (double)len;
    t.first_divergence = r->first_divergence[0] < (int64_t)len ? r->first_divergence[0] : -1;
    out.turns.push_back(t);
    if (o.progress) o.progress(t, turns.size());
  }
  const double positions = (double)out.kl_by_position.size();
  out.kl_mean = kl_sum / positions;
  out.agreement = agree_sum / positions;
  out.reused_fraction = prompt_total > 0 ? (double)reused_total / prompt_total : 0.0;
  return out;
}

}  // namespace pdq
