// `pdq perplexity`: llama-perplexity's windowed method over a text file.
#include <chrono>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "eval/perplexity.h"
#include "nlohmann/json.hpp"
#include "tools/commands.h"

namespace pdq {

int PerplexityCommand(int argc, char** argv) {
  FlagParser flags("perplexity",
                   "Perplexity of a text file by llama.cpp's method: windows of --ctx tokens,\n"
                   "the second half of each scored.");
  ModelFlags mf;
  mf.Register(flags, /*device_flag=*/true);
  std::string text_path;
  int64_t ctx = 512, chunks = 0;
  bool json = false;
  flags.String("text", &text_path, "UTF-8 text file to score (required)");
  flags.Int("ctx", &ctx, 4, 1 << 20, "window length in tokens");
  flags.Int("chunks", &chunks, 0, INT64_MAX, "score at most this many windows; 0: all");
  std::string prefill_precision, decode_precision, kl_reference;
  flags.String("prefill-precision", &prefill_precision,
               "disaggregated: prefill each window's first half at this precision");
  flags.String("decode-precision", &decode_precision,
               "disaggregated: score the second half token by token at this precision, "
               "reading the prefill's KV cache");
  flags.String("kl-reference", &kl_reference,
               "also report KL divergence and top-1 agreement against this precision");
  flags.Bool("json", &json, "print one JSON object");
  if (int rc = ParseOrExit(flags, argc, argv); rc >= 0) return rc;
  const bool disaggregated = !prefill_precision.empty() || !decode_precision.empty();
  if (prefill_precision.empty()) prefill_precision = mf.precision;
  if (decode_precision.empty()) decode_precision = mf.precision;
  if (text_path.empty())
    return Fail("perplexity", absl::InvalidArgumentError("--text is required"));
  // W4A8 takes decode steps of --w4a8-rows rows or more, never prompt rows:
  // windows scored in one pass would measure W4A16 while the flag says W4A8.
  if (mf.w4a8_rows > 1 || (mf.w4a8_rows == 1 && !disaggregated)) {
    return Fail("perplexity",
                absl::InvalidArgumentError(absl::StrCat(
                    "--w4a8-rows ", mf.w4a8_rows,
                    " changes nothing here: W4A8 takes decode steps of that many rows, and this "
                    "command scores windows as prompt rows, or token by token (one-row steps) "
                    "with --decode-precision; to score W4A8 use --decode-precision w4a16 "
                    "--w4a8-rows 1")));
  }
  auto text = ReadTextFile(text_path, "text file");
  if (!text.ok()) return Fail("perplexity", text.status());

  auto model = mf.Load(/*quiet=*/false, prefill_precision);
  if (!model.ok()) return Fail("perplexity", model.status());
  PerplexityOptions options;
  LoadedModel decode_model, reference;
  if (disaggregated) {
    options.decode = model->ctx.get();
    if (decode_precision != prefill_precision) {
      auto loaded = mf.Load(false, decode_precision);
      if (!loaded.ok()) return Fail("perplexity", loaded.status());
      decode_model = std::move(*loaded);
      options.decode = decode_model.ctx.get();
    }
  }
  if (!kl_reference.empty()) {
    // The reference computes attention in fp32 on an fp16 cache whatever
    // --bf16-attention and --kv-dtype say, so the KL measures what those
    // choices cost too.
    mf.pool();  // made first, so the copy shares it
    ModelFlags ref = mf;
    ref.bf16_attention = false;
    ref.kv_dtype = "fp16";
    auto loaded = ref.Load(false, kl_reference);
    if (!loaded.ok()) return Fail("perplexity", loaded.status());
    reference = std::move(*loaded);
    options.kl_reference = reference.ctx.get();
  }
  options.ctx = (int)ctx;
  options.max_chunks = chunks;
  const auto start = std::chrono::steady_clock::now();
  options.progress = [&](int64_t done, int64_t total, double ppl) {
    if (done % 10 != 0 && done != total && done != 1) return;
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::fprintf(stderr, "pdq: chunk %lld/%lld  ppl %.4f  %.1f s elapsed, ~%.0f s left\n",
                 (long long)done, (long long)total, ppl, s, s / done * (total - done));
  };
  auto result = ComputePerplexity(*model->ctx, *text, options);
  if (!result.ok()) {
    return Fail("perplexity",
                WithFlagNames(result.status(), {{"ctx", "--ctx"}, {"max_chunks", "--chunks"}}));
  }
  if (json) {
    nlohmann::json j;
    j["ppl"] = result->ppl;
    j["nll_mean"] = result->nll_mean;
    j["tokens_scored"] = result->tokens_scored;
    j["chunks"] = result->chunks;
    j["seconds"] = result->seconds;
    j["ctx"] = ctx;
    j["prefill_precision"] = prefill_precision;
    j["decode_precision"] = decode_precision;
    j["disaggregated"] = disaggregated;
    if (result->has_kl) {
      j["kl_reference"] = kl_reference;
      j["kl_mean"] = result->kl_mean;
      j["kl_p99"] = result->kl_p99;
      j["top1_agreement"] = result->top1_agreement;
    }
    std::puts(j.dump().c_str());
  } else {
    std::printf("perplexity %.4f (mean NLL %.5f) over %lld tokens in %lld chunks of %lld; %.1f s\n",
                result->ppl, result->nll_mean, (long long)result->tokens_scored,
                (long long)result->chunks, (long long)ctx, result->seconds);
    if (result->has_kl) {
      std::printf("vs %s: KL mean %.5f, KL p99 %.5f, top-1 agreement %.2f%%\n",
                  kl_reference.c_str(), result->kl_mean, result->kl_p99,
                  100 * result->top1_agreement);
    }
  }
  return 0;
}

}  // namespace pdq
