// `pdq drift`: how far greedy generation under a (prefill, decode) precision
// pair drifts from the reference, position by position.
#include <cstdio>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "eval/drift.h"
#include "nlohmann/json.hpp"
#include "tools/commands.h"

namespace pdq {

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
  flags.Bool("json", &json, "print one JSON object");
  if (int rc = ParseOrExit(flags, argc, argv); rc >= 0) return rc;
  if (prompts_path.empty()) return Fail("drift", absl::InvalidArgumentError("--prompts is required"));
  std::ifstream in(prompts_path);
  if (!in) {
    return Fail("drift", absl::NotFoundError(absl::StrCat("cannot read prompts file '",
                                                          prompts_path, "'")));
  }
  std::vector<std::string> texts;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) texts.push_back(line);
  }
  if (texts.empty()) {
    return Fail("drift", absl::InvalidArgumentError(
                             absl::StrCat("'", prompts_path, "' has no non-empty lines")));
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
