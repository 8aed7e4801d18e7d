// Windowed perplexity, optionally disaggregated (prefill and decode by two
// weight sets over one KV cache) and compared with a reference model.
#include "eval/perplexity.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "engine/sampler.h"

namespace pdq {

absl::Status CheckCompatible(const Model& a, const Model& b, const char* role, bool shares_kv) {
  KvLayout theirs = b.kv_layout();
  if (!shares_kv) theirs.dtype = a.kv_layout().dtype;
  if (absl::Status s = CheckKvCompatible(a.kv_layout(), theirs); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("the ", role, " model (", b.config().name,
                                                   ") does not match the main model (",
                                                   a.config().name, "): ", s.message()));
  }
  return absl::OkStatus();
}

namespace {

// log(sum(exp(logits))), stable.
double LogSumExp(const float* logits, int vocab) {
  const float max_logit = *std::max_element(logits, logits + vocab);
  double sum = 0.0;
  for (int i = 0; i < vocab; ++i) sum += std::exp((double)logits[i] - max_logit);
  return std::log(sum) + max_logit;
}
}  // namespace

double TokenNll(const float* logits, int vocab, int32_t target) {
  return LogSumExp(logits, vocab) - logits[target];
}

double KlFromLogits(const float* p, const float* q, int vocab) {
  const double lzp = LogSumExp(p, vocab), lzq = LogSumExp(q, vocab);
  double kl = 0;
  for (int i = 0; i < vocab; ++i) {
    const double lp = (double)p[i] - lzp;
    kl += std::exp(lp) * (lp - ((double)q[i] - lzq));
  }
  return std::max(0.0, kl);
}

absl::StatusOr<PerplexityResult> ComputePerplexity(Context& main, const std::string& text,
                                                   const PerplexityOptions& options) {
  const Model& model = main.model();
  const ModelConfig& c = model.config();
  if (options.ctx < 4 || options.ctx > c.max_context) {
    return absl::InvalidArgumentError(absl::StrCat("ctx must be in [4, ", c.max_context,
                                                   "], got ", options.ctx));
  }
  if (options.max_chunks < 0) return absl::InvalidArgumentError("max_chunks must be >= 0");
  if (options.parallel_windows < 1) {
    return absl::InvalidArgumentError("parallel windows must be >= 1");
  }
  if (options.decode) {
    PDQ_RETURN_IF_ERROR(CheckCompatible(model, options.decode->model(), "decode"));
    if (options.decode->device() != main.device()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the decode context runs on ", options.decode->device(), " and the prefill on ",
          main.device(), "; they share one KV cache, so they must run on one device"));
    }
  }
  if (options.kl_reference) {
    PDQ_RETURN_IF_ERROR(CheckCompatible(model, options.kl_reference->model(), "reference", false));
  }
  const auto start = std::chrono::steady_clock::now();
  const Tokenizer& tok = model.tokenizer();
  const std::vector<int32_t> tokens = tok.Encode(text, tok.add_bos(), /*parse_special=*/false);
  const int64_t ctx = options.ctx;
  if ((int64_t)tokens.size() < 2 * ctx) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the text has ", tokens.size(), " tokens; perplexity with ctx ", ctx,
        " needs at least ", 2 * ctx));
  }
  int64_t chunks = (int64_t)tokens.size() / ctx;
  if (options.max_chunks > 0) chunks = std::min(chunks, options.max_chunks);
  const int64_t first = ctx / 2, scored = ctx - 1 - first;
  const int vocab = c.vocab_size;
  const int64_t group = options.decode ? options.parallel_windows : 1;

  // Blocks are per sequence, so each window takes ctx rounded up to a block.
  const int64_t window_tokens = model.kv_layout().SequenceTokens(ctx);
  PDQ_ASSIGN_OR_RETURN(std::unique_ptr<KvCache> kv, main.NewKvCache(window_tokens * group));
  std::unique_ptr<KvCache> ref_kv;
  if (options.kl_reference) {
    PDQ_ASSIGN_OR_RETURN(ref_kv, options.kl_reference->NewKvCache(ctx));
  }
  PerplexityResult result;
  result.has_kl = options.kl_reference != nullptr;
  double nll_sum = 0.0, kl_sum = 0.0;
  int64_t agree = 0;
  std::vector<double> kls;
  Logits logits, ref_logits;

  for (int64_t g0 = 0; g0 < chunks; g0 += group) {
    const int64_t n_windows = std::min(group, chunks - g0);
    std::vector<std::vector<int32_t>> windows(n_windows);
    std::vector<SeqId> seqs(n_windows);
    for (int64_t w = 0; w < n_windows; ++w) {
      windows[w].assign(tokens.begin() + (g0 + w) * ctx, tokens.begin() + (g0 + w + 1) * ctx);
      if (tok.add_bos() && tok.bos_id() >= 0) windows[w][0] = tok.bos_id();
      seqs[w] = kv->AddSequence();
    }
    // logit rows for positions first .. ctx-2 of every window: [window][pos][vocab].
    std::vector<float> rows((size_t)n_windows * scored * vocab);
    if (options.decode == nullptr) {
      BatchEntry entry{seqs[0], windows[0], ctx - first};
      PDQ_RETURN_IF_ERROR(main.ForwardAll(*kv, {&entry, 1}, &logits));
      std::copy(logits.data.begin(), logits.data.begin() + scored * vocab, rows.begin());
    } else {
      for (int64_t w = 0; w < n_windows; ++w) {
        BatchEntry entry{seqs[w], std::span<const int32_t>(windows[w]).first(first), 0, true};
        PDQ_RETURN_IF_ERROR(main.ForwardAll(*kv, {&entry, 1}, &logits));
      }
      std::vector<BatchEntry> step(n_windows);
      for (int64_t j = first; j < ctx - 1; ++j) {
        for (int64_t w = 0; w < n_windows; ++w) {
          step[w] = BatchEntry{seqs[w], std::span<const int32_t>(windows[w]).subspan(j, 1), 1};
        }
        PDQ_RETURN_IF_ERROR(options.decode->ForwardAll(*kv, step, &logits));
        for (int64_t w = 0; w < n_windows; ++w) {
          std::copy(logits.Row(w, 0), logits.Row(w, 0) + vocab,
                    rows.begin() + ((w * scored) + (j - first)) * vocab);
        }
      }
    }
    for (int64_t w = 0; w < n_windows; ++w) {
      PDQ_RETURN_IF_ERROR(kv->RemoveSequence(seqs[w]));
      if (options.kl_reference) {
        const SeqId rs = ref_kv->AddSequence();
        BatchEntry entry{rs, windows[w], ctx - first};
        PDQ_RETURN_IF_ERROR(options.kl_reference->ForwardAll(*ref_kv, {&entry, 1}, &ref_logits));
        PDQ_RETURN_IF_ERROR(ref_kv->RemoveSequence(rs));
      }
      for (int64_t j = first; j < ctx - 1; ++j) {
        const float* row = rows.data() + ((w * scored) + (j - first)) * vocab;
        nll_sum += TokenNll(row, vocab, windows[w][j + 1]);
        ++result.tokens_scored;
        if (options.kl_reference) {
          const float* ref = ref_logits.Row(0, j - first);
          const double kl = KlFromLogits(ref, row, vocab);
          kl_sum += kl;
          kls.push_back(kl);
          agree += Argmax(ref, vocab) == Argmax(row, vocab);
        }
      }
      result.chunks = g0 + w + 1;
      if (options.progress) {
        options.progress(result.chunks, chunks, std::exp(nll_sum / (double)result.tokens_scored));
      }
    }
  }
  result.nll_mean = nll_sum / (double)result.tokens_scored;
  result.ppl = std::exp(result.nll_mean);
  if (result.has_kl) {
    result.kl_mean = kl_sum / (double)kls.size();
    std::sort(kls.begin(), kls.end());
    result.kl_p99 = kls[std::min(kls.size() - 1, (size_t)std::ceil(0.99 * (double)kls.size()) - 1)];
    result.top1_agreement = (double)agree / (double)kls.size();
  }
  result.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace pdq
