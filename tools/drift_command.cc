// `pdq drift`: how far greedy generation under a (prefill, decode) precision
// pair drifts from the reference, position by position.
#include <algorithm>
#include <cstdio>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "eval/drift.h"
#include "nlohmann/json.hpp"
#include "tools/commands.h"

namespace pdq {
namespace {

// A scripted conversation: each line of the file is the user's next turn;
// the reference's greedy answer to each (cut at its end-of-generation token,
// at most `turn_tokens`) goes back into the history before the next, so
// the context grows turn by turn as in a real dialogue. Every turn re-reads
// the whole history, prefilled by the prefill precision and continued by
// the decode precision, as a disaggregated deployment without a prefix
// cache would; drift is measured on each answer's positions.
//
// With `reuse_kv`, the test side keeps its KV from turn to turn as a prefix
// cache would: each turn reuses the whole blocks of the previous turn's
// prompt (written by the prefill precision) and answer (written by the
// decode precision) that the new prompt starts with, and prefills only the
// rest; the reference still computes every turn afresh. Against a run
// without it, this is the accuracy cost of reading KV another precision
// wrote.
int ConversationDrift(Context& reference, Context& prefill, Context& decode,
                      const std::vector<std::string>& turns, int turn_tokens,
                      const std::string& prefill_precision, const std::string& decode_precision,
                      const std::string& reference_precision, bool reuse_kv, bool json) {
  const Tokenizer& tok = reference.model().tokenizer();
  std::vector<ChatMessage> history;
  std::unique_ptr<KvCache> kept;
  SeqId seq = 0;
  std::vector<int32_t> stored;  // the tokens whose KV `kept` holds
  if (reuse_kv) {
    absl::StatusOr<std::unique_ptr<KvCache>> kv =
        prefill.model().NewKvCache(prefill.model().config().max_context);
    if (!kv.ok()) return Fail("drift", kv.status());
    kept = std::move(*kv);
    seq = kept->AddSequence();
  }
  int64_t reused_total = 0, prompt_total = 0;
  nlohmann::json per_turn = nlohmann::json::array();
  std::vector<double> kl_by_position, agreement_by_position;
  double kl_sum = 0, agree_sum = 0;
  for (size_t k = 0; k < turns.size(); ++k) {
    history.push_back({"user", turns[k]});
    absl::StatusOr<std::string> rendered = tok.ApplyChatTemplate(history, true);
    if (!rendered.ok()) return Fail("drift", rendered.status());
    const std::vector<int32_t> prompt = tok.Encode(*rendered, tok.add_bos(), true);
    DriftOptions options;
    options.max_tokens = turn_tokens;
    int64_t reused = 0;
    if (reuse_kv) {
      // Whole blocks of the common prefix, at most the prompt less one
      // token: what the prefix cache would reuse.
      const int64_t bt = kept->layout().block_tokens;
      const size_t common =
          std::mismatch(stored.begin(), stored.end(), prompt.begin(), prompt.end()).first -
          stored.begin();
      reused = std::min<int64_t>((int64_t)common, (int64_t)prompt.size() - 1) / bt * bt;
      if (absl::Status s = kept->SetLength(seq, reused); !s.ok()) return Fail("drift", s);
      options.test_kv = kept.get();
      options.test_seqs = {seq};
    }
    reused_total += reused;
    prompt_total += (int64_t)prompt.size();
    absl::StatusOr<DriftResult> r = MeasureDrift(reference, prefill, decode, {prompt}, options);
    if (!r.ok()) {
      return Fail("drift", absl::Status(r.status().code(),
                                        absl::StrCat("turn ", k + 1, ": ", r.status().message())));
    }
    // The answer ends at the reference's end-of-generation token, which is
    // scored (predicting the end is part of the answer) but not kept.
    const std::vector<int32_t>& ref = r->reference_tokens[0];
    if (reuse_kv) {
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
      kl_by_position.push_back(r->kl_mean[p]);
      agreement_by_position.push_back(r->agreement[p]);
    }
    kl_sum += kl;
    agree_sum += agree;
    const int64_t diverged = r->first_divergence[0] < (int64_t)len ? r->first_divergence[0] : -1;
    std::vector<int32_t> answer(ref.begin(), ref.begin() + len);
    if (!answer.empty() && tok.IsEndOfGeneration(answer.back())) answer.pop_back();
    absl::StatusOr<std::string> said = tok.Decode(answer);
    if (!said.ok()) return Fail("drift", said.status());
    history.push_back({"assistant", *said});
    per_turn.push_back({{"turn", k + 1},
                        {"prompt_tokens", prompt.size()},
                        {"reused_tokens", reused},
                        {"answer_tokens", len},
                        {"kl_mean", kl / (double)len},
                        {"agreement", agree / (double)len},
                        {"first_divergence", diverged}});
    std::fprintf(stderr, "pdq: turn %zu/%zu: %zu prompt tokens, %zu answer tokens, KL %.5f\n",
                 k + 1, turns.size(), prompt.size(), len, kl / (double)len);
  }
  const double positions = (double)kl_by_position.size();
  if (json) {
    nlohmann::json j;
    j["conversation"] = true;
    j["reuse_kv"] = reuse_kv;
    j["reused_fraction"] = prompt_total > 0 ? (double)reused_total / prompt_total : 0.0;
    j["reference"] = reference_precision;
    j["prefill_precision"] = prefill_precision;
    j["decode_precision"] = decode_precision;
    j["turns"] = per_turn;
    j["turn_tokens"] = turn_tokens;
    j["kl_mean"] = kl_sum / positions;
    j["agreement"] = agree_sum / positions;
    j["kl_by_position"] = kl_by_position;
    j["agreement_by_position"] = agreement_by_position;
    std::puts(j.dump().c_str());
    return 0;
  }
  std::printf("%s prefill -> %s decode vs %s, a conversation of %zu turns%s\n",
              prefill_precision.c_str(), decode_precision.c_str(), reference_precision.c_str(),
              turns.size(), reuse_kv ? ", KV kept from turn to turn" : "");
  std::printf("  turn  prompt  reused  answer      KL mean  agreement  first divergence\n");
  for (const nlohmann::json& t : per_turn) {
    std::printf("  %4d  %6d  %6d  %6d  %11.5f  %8.1f%%  %s\n", t["turn"].get<int>(),
                t["prompt_tokens"].get<int>(), t["reused_tokens"].get<int>(),
                t["answer_tokens"].get<int>(),
                t["kl_mean"].get<double>(), 100 * t["agreement"].get<double>(),
                t["first_divergence"].get<int64_t>() < 0
                    ? "none"
                    : std::to_string(t["first_divergence"].get<int64_t>()).c_str());
  }
  std::printf("  all                            %11.5f  %8.1f%%\n", kl_sum / positions,
              100 * agree_sum / positions);
  return 0;
}

}  // namespace

int DriftCommand(int argc, char** argv) {
  FlagParser flags("drift",
                   "Greedy generations under a prefill/decode precision pair against a\n"
                   "reference precision: per generated position, the KL divergence of the\n"
                   "next-token distributions and the argmax agreement (both models follow the\n"
                   "reference's tokens), and where each prompt's generation first diverges.");
  ModelFlags mf;
  mf.Register(flags);
  std::string prompts_path, prefill_precision = "w8a8", decode_precision = "w4a16";
  std::string reference_precision = "fp16";
  int64_t max_tokens = 128;
  bool chat = false, json = false;
  flags.String("prompts", &prompts_path, "file with one prompt per line (required)");
  flags.String("prefill-precision", &prefill_precision, "precision that prefills each prompt");
  flags.String("decode-precision", &decode_precision,
               "precision that continues from the prefill's KV cache");
  flags.String("reference", &reference_precision, "precision to compare against");
  flags.Int("max-tokens", &max_tokens, 1, 1 << 20, "tokens to generate per prompt");
  flags.Bool("chat", &chat, "wrap each prompt as a user turn in the chat template");
  std::string conversation_path;
  int64_t turn_tokens = 128;
  flags.String("conversation", &conversation_path,
               "instead of --prompts: a scripted conversation, one user turn per line; each "
               "turn's answer (the reference's) is fed back before the next, and drift is "
               "reported per turn");
  flags.Int("turn-tokens", &turn_tokens, 1, 1 << 16,
            "--conversation: tokens each answer may take at most");
  bool reuse_kv = false;
  flags.Bool("reuse-kv", &reuse_kv,
             "--conversation: keep the KV from turn to turn as a prefix cache would (the "
             "prompt's blocks written by the prefill precision, the answer's by the decode "
             "precision) and prefill only what is new; the reference recomputes every turn");
  flags.Bool("json", &json, "print one JSON object");
  if (int rc = ParseOrExit(flags, argc, argv); rc >= 0) return rc;
  if (prompts_path.empty() == conversation_path.empty()) {
    return Fail("drift",
                absl::InvalidArgumentError("give --prompts or --conversation (one of the two)"));
  }
  if (reuse_kv && conversation_path.empty()) {
    return Fail("drift", absl::InvalidArgumentError("--reuse-kv needs --conversation"));
  }
  const std::string& lines_path = prompts_path.empty() ? conversation_path : prompts_path;
  std::ifstream in(lines_path);
  if (!in) {
    return Fail("drift",
                absl::NotFoundError(absl::StrCat("cannot read the file '", lines_path, "'")));
  }
  std::vector<std::string> texts;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) texts.push_back(line);
  }
  if (texts.empty()) {
    return Fail("drift", absl::InvalidArgumentError(
                             absl::StrCat("'", lines_path, "' has no non-empty lines")));
  }

  auto reference = mf.Load(false, reference_precision);
  if (!reference.ok()) return Fail("drift", reference.status());
  auto prefill = mf.Load(false, prefill_precision);
  if (!prefill.ok()) return Fail("drift", prefill.status());
  LoadedModel decode_owned;
  Context* decode = prefill->ctx.get();
  if (decode_precision != prefill_precision) {
    auto loaded = mf.Load(false, decode_precision);
    if (!loaded.ok()) return Fail("drift", loaded.status());
    decode_owned = std::move(*loaded);
    decode = decode_owned.ctx.get();
  }
  if (!conversation_path.empty()) {
    return ConversationDrift(*reference->ctx, *prefill->ctx, *decode, texts, (int)turn_tokens,
                             prefill_precision, decode_precision, reference_precision, reuse_kv,
                             json);
  }
  const Tokenizer& tok = reference->model->tokenizer();
  std::vector<std::vector<int32_t>> prompts;
  for (const std::string& t : texts) {
    std::string text = t;
    if (chat) {
      auto rendered = tok.ApplyChatTemplate({{"user", t}}, true);
      if (!rendered.ok()) return Fail("drift", rendered.status());
      text = *rendered;
    }
    prompts.push_back(tok.Encode(text, tok.add_bos(), chat));
  }
  DriftOptions options;
  options.max_tokens = (int)max_tokens;
  options.progress = [](int done, int total) {
    if (done % 64 == 0 || done == total) {
      std::fprintf(stderr, "pdq: position %d/%d\n", done, total);
    }
  };
  auto result = MeasureDrift(*reference->ctx, *prefill->ctx, *decode, prompts, options);
  if (!result.ok()) return Fail("drift", result.status());

  if (json) {
    nlohmann::json j;
    j["reference"] = reference_precision;
    j["prefill_precision"] = prefill_precision;
    j["decode_precision"] = decode_precision;
    j["prompts"] = prompts.size();
    j["max_tokens"] = max_tokens;
    j["kl_mean"] = result->kl_overall;
    j["agreement"] = result->agreement_overall;
    j["kl_by_position"] = result->kl_mean;
    j["agreement_by_position"] = result->agreement;
    j["first_divergence"] = result->first_divergence;
    std::puts(j.dump().c_str());
    return 0;
  }
  std::printf("%s prefill -> %s decode vs %s, %zu prompts, %lld tokens each\n",
              prefill_precision.c_str(), decode_precision.c_str(), reference_precision.c_str(),
              prompts.size(), (long long)max_tokens);
  std::printf("  positions      KL mean    agreement\n");
  for (int64_t lo = 0, hi = 16; lo < max_tokens; lo = hi, hi *= 2) {
    const int64_t end = std::min(hi, max_tokens);
    double kl = 0, agree = 0;
    for (int64_t p = lo; p < end; ++p) {
      kl += result->kl_mean[p];
      agree += result->agreement[p];
    }
    std::printf("  %5lld-%-5lld  %10.5f  %9.1f%%\n", (long long)lo, (long long)end - 1,
                kl / (double)(end - lo), 100 * agree / (double)(end - lo));
  }
  std::printf("  all          %10.5f  %9.1f%%\n", result->kl_overall,
              100 * result->agreement_overall);
  std::printf("  first divergence per prompt:");
  for (int64_t d : result->first_divergence) {
    if (d < 0) {
      std::printf(" none");
    } else {
      std::printf(" %lld", (long long)d);
    }
  }
  std::printf("\n");
  return 0;
}

}  // namespace pdq
