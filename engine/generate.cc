// The generation loop used by `pdq generate` and the benchmarks.
#include "engine/generate.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/check.h"

namespace pdq {

absl::StatusOr<GenerateResult> Generate(Context& ctx, const std::vector<int32_t>& prompt,
                                        const GenerateOptions& options) {
  const Model& model = ctx.model();
  const ModelConfig& c = model.config();
  if (prompt.empty()) return absl::InvalidArgumentError("the prompt is empty");
  if (options.max_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max tokens must be >= 1, got ", options.max_tokens));
  }
  PDQ_RETURN_IF_ERROR(ValidateSamplingParams(options.sampling));
  if ((int64_t)prompt.size() >= c.max_context) {
    return absl::OutOfRangeError(absl::StrCat("the prompt has ", prompt.size(),
                                              " tokens; the model's context is ",
                                              c.max_context));
  }
  const int64_t capacity =
      std::min<int64_t>(c.max_context, (int64_t)prompt.size() + options.max_tokens);
  PDQ_ASSIGN_OR_RETURN(std::unique_ptr<KvCache> kv, ctx.NewKvCache(capacity));
  const SeqId seq = kv->AddSequence();
  Sampler sampler(options.sampling);
  StreamingDetokenizer detok(model.tokenizer());
  GenerateResult result;
  result.prompt_tokens = (int64_t)prompt.size();
  result.stop_reason = "max_tokens";

  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  auto first_token_time = start, last_token_time = start;
  Logits logits;
  std::vector<int32_t> next = prompt;
  for (int step = 0; step < options.max_tokens; ++step) {
    if (*kv->Length(seq) + (int64_t)next.size() > c.max_context) {
      result.stop_reason = "context_full";
      break;
    }
    BatchEntry entry{seq, next, 1, /*prompt=*/step == 0};
    PDQ_RETURN_IF_ERROR(ctx.ForwardAll(*kv, {&entry, 1}, &logits));
    const int32_t token = sampler.Sample(logits.Row(0, 0), c.vocab_size);
    if (step == 0) first_token_time = Clock::now();
    const bool eog = !options.ignore_eos && model.tokenizer().IsEndOfGeneration(token);
    const bool stop = std::find(options.stop_tokens.begin(), options.stop_tokens.end(), token) !=
                      options.stop_tokens.end();
    if (eog || stop) {
      result.stop_reason = eog ? "eos" : "stop_token";
      break;
    }
    result.tokens.push_back(token);
    last_token_time = Clock::now();
    PDQ_ASSIGN_OR_RETURN(std::string piece, detok.Push(token));
    result.text += piece;
    if (options.on_token) options.on_token(token, piece);
    next.assign(1, token);
  }
  std::string tail = detok.Finish();
  result.text += tail;
  if (options.on_token && !tail.empty()) options.on_token(-1, tail);
  auto ms = [](auto d) { return std::chrono::duration<double, std::milli>(d).count(); };
  result.ttft_ms = ms(first_token_time - start);
  const int64_t later = (int64_t)result.tokens.size() - 1;
  result.tpot_ms = later > 0 ? ms(last_token_time - first_token_time) / (double)later : 0.0;
  return result;
}

}  // namespace pdq
