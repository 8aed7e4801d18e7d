// `pdq generate`: one prompt in, streamed text out (or one JSON object).
#include <cstdio>

#include "engine/generate.h"
#include "nlohmann/json.hpp"
#include "tools/commands.h"

namespace pdq {

int GenerateCommand(int argc, char** argv) {
  FlagParser flags("generate", "Generates text from a prompt with one model.");
  ModelFlags mf;
  mf.Register(flags, /*device_flag=*/true);
  std::string prompt;
  bool chat = false, json = false;
  int64_t max_tokens = 128, top_k = 0, seed = 0;
  double temperature = 0.0, top_p = 1.0;
  flags.String("prompt", &prompt, "prompt text (required)");
  flags.Bool("chat", &chat, "wrap the prompt as a user turn in the model's chat template");
  flags.Int("max-tokens", &max_tokens, 1, 1 << 20, "most tokens to generate");
  flags.Float("temperature", &temperature, 0.0, 100.0, "sampling temperature; 0 is greedy");
  flags.Int("top-k", &top_k, 0, 1 << 30, "sample from the k most likely tokens; 0: all");
  flags.Float("top-p", &top_p, 1e-6, 1.0, "nucleus sampling mass");
  flags.Int("seed", &seed, 0, INT64_MAX, "random seed for sampling");
  flags.Bool("json", &json, "print one JSON object instead of streaming text");
  if (int rc = ParseOrExit(flags, argc, argv); rc >= 0) return rc;
  if (prompt.empty()) return Fail("generate", absl::InvalidArgumentError("--prompt is empty"));

  auto model = mf.Load(/*quiet=*/false);
  if (!model.ok()) return Fail("generate", model.status());
  const Tokenizer& tok = model->model->tokenizer();
  std::string text = prompt;
  if (chat) {
    auto rendered = tok.ApplyChatTemplate({{"user", prompt}}, /*add_generation_prompt=*/true);
    if (!rendered.ok()) return Fail("generate", rendered.status());
    text = *rendered;
  }
  const std::vector<int32_t> ids = tok.Encode(text, tok.add_bos(), /*parse_special=*/chat);

  GenerateOptions options;
  options.max_tokens = (int)max_tokens;
  options.sampling = {(float)temperature, (int)top_k, (float)top_p, (uint64_t)seed};
  if (!json) {
    options.on_token = [](int32_t, const std::string& piece) {
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
    };
  }
  auto result = Generate(*model->ctx, ids, options);
  if (!result.ok()) return Fail("generate", result.status());
  if (json) {
    nlohmann::json j;
    j["tokens"] = result->tokens;
    j["text"] = result->text;
    j["prompt_tokens"] = result->prompt_tokens;
    j["ttft_ms"] = result->ttft_ms;
    j["tpot_ms"] = result->tpot_ms;
    j["stop_reason"] = result->stop_reason;
    std::puts(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else {
    std::printf("\n");
    std::fflush(stdout);  // the text ends before the statistics on stderr
    std::fprintf(stderr,
                 "pdq: %lld prompt tokens, %zu generated (%s); TTFT %.1f ms, TPOT %.2f ms "
                 "(%.1f tokens/s)\n",
                 (long long)result->prompt_tokens, result->tokens.size(),
                 result->stop_reason.c_str(), result->ttft_ms, result->tpot_ms,
                 result->tpot_ms > 0 ? 1000.0 / result->tpot_ms : 0.0);
  }
  return 0;
}

}  // namespace pdq
