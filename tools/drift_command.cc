// `pdq drift`: how far greedy generation under a (prefill, decode) precision
// pair drifts from the reference, position by position.
#include <algorithm>
#include <cstdio>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "eval/conversation_drift.h"
#include "eval/drift.h"
#include "nlohmann/json.hpp"
#include "tools/commands.h"

namespace pdq {
namespace {

// A scripted conversation (eval/conversation_drift.h), as JSON or a table.
int ConversationDrift(Context& reference, Context& prefill, Context& decode,
                      const std::vector<std::string>& turns, const std::string& prefill_precision,
                      const std::string& decode_precision, const std::string& reference_precision,
                      ConversationDriftOptions o, bool json) {
  o.progress = [](const ConversationTurnDrift& t, size_t n) {
    std::fprintf(stderr, "pdq: turn %d/%zu: %lld prompt tokens, %lld answer tokens, KL %.5f\n",
                 t.turn, n, (long long)t.prompt_tokens, (long long)t.answer_tokens, t.kl_mean);
  };
  absl::StatusOr<ConversationDriftResult> r =
      MeasureConversationDrift(reference, prefill, decode, turns, o);
  if (!r.ok()) return Fail("drift", r.status());
  if (json) {
    nlohmann::json per_turn = nlohmann::json::array();
    for (const ConversationTurnDrift& t : r->turns) {
      per_turn.push_back({{"turn", t.turn},
                          {"prompt_tokens", t.prompt_tokens},
                          {"reused_tokens", t.reused_tokens},
                          {"answer_tokens", t.answer_tokens},
                          {"kl_mean", t.kl_mean},
                          {"agreement", t.agreement},
                          {"first_divergence", t.first_divergence}});
    }
    nlohmann::json j;
    j["conversation"] = true;
    j["reuse_kv"] = o.reuse_kv;
    j["follow_ups_at_decode"] = o.follow_ups_at_decode;
    j["reused_fraction"] = r->reused_fraction;
    j["reference"] = reference_precision;
    j["prefill_precision"] = prefill_precision;
    j["decode_precision"] = decode_precision;
    j["turns"] = per_turn;
    j["turn_tokens"] = o.turn_tokens;
    j["kl_mean"] = r->kl_mean;
    j["agreement"] = r->agreement;
    j["kl_by_position"] = r->kl_by_position;
    j["agreement_by_position"] = r->agreement_by_position;
    std::puts(j.dump().c_str());
    return 0;
  }
  std::printf("%s prefill -> %s decode vs %s, a conversation of %zu turns%s\n",
              prefill_precision.c_str(), decode_precision.c_str(), reference_precision.c_str(),
              turns.size(),
              !o.reuse_kv              ? ""
              : o.follow_ups_at_decode ? ", KV kept from turn to turn, later turns prefilled at "
                                         "the decode precision"
                                       : ", KV kept from turn to turn");
  std::printf("  turn  prompt  reused  answer      KL mean  agreement  first divergence\n");
  for (const ConversationTurnDrift& t : r->turns) {
    std::printf("  %4d  %6lld  %6lld  %6lld  %11.5f  %8.1f%%  %s\n", t.turn,
                (long long)t.prompt_tokens, (long long)t.reused_tokens, (long long)t.answer_tokens,
                t.kl_mean, 100 * t.agreement,
                t.first_divergence < 0 ? "none" : std::to_string(t.first_divergence).c_str());
  }
  std::printf("  all                            %11.5f  %8.1f%%\n", r->kl_mean, 100 * r->agreement);
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
  bool follow_ups_at_decode = false;
  flags.Bool("follow-ups-at-decode", &follow_ups_at_decode,
             "--reuse-kv: prefill each later turn's new tokens at the decode precision, as a "
             "decode worker that prefills a short follow-up itself does (the first turn at "
             "the prefill precision, as the prefill worker would)");
  flags.Bool("json", &json, "print one JSON object");
  if (int rc = ParseOrExit(flags, argc, argv); rc >= 0) return rc;
  if (prompts_path.empty() == conversation_path.empty()) {
    return Fail("drift",
                absl::InvalidArgumentError("give --prompts or --conversation (one of the two)"));
  }
  if (reuse_kv && conversation_path.empty()) {
    return Fail("drift", absl::InvalidArgumentError("--reuse-kv needs --conversation"));
  }
  if (follow_ups_at_decode && !reuse_kv) {
    return Fail("drift", absl::InvalidArgumentError("--follow-ups-at-decode needs --reuse-kv"));
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

  // The reference on an fp16 cache whatever --kv-dtype says, so the drift
  // measures that choice too.
  mf.pool();  // made first, so the copy shares it
  ModelFlags ref = mf;
  ref.kv_dtype = "fp16";
  auto reference = ref.Load(false, reference_precision);
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
    return ConversationDrift(*reference->ctx, *prefill->ctx, *decode, texts, prefill_precision,
                             decode_precision, reference_precision,
                             {.turn_tokens = (int)turn_tokens,
                              .reuse_kv = reuse_kv,
                              .follow_ups_at_decode = follow_ups_at_decode,
                              .progress = nullptr},
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
