// Per-channel statistics over every position of every window.
#include "eval/calibrate.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "engine/w4_quantize.h"

namespace pdq {

absl::StatusOr<ActivationStats> CollectActivationStats(Model& model, const std::string& text,
                                                       const CalibrationOptions& options) {
  const Tokenizer& tok = model.tokenizer();
  const std::vector<int32_t> tokens = tok.Encode(text, tok.add_bos(), /*parse_special=*/false);
  if (tokens.size() < 16) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the calibration text has ", tokens.size(), " tokens; at least 16 are needed"));
  }
  const int64_t ctx = std::min<int64_t>(options.ctx, model.config().max_context);
  const int64_t windows =
      std::min<int64_t>(options.max_windows, ((int64_t)tokens.size() + ctx - 1) / ctx);
  ActivationStats stats;
  std::map<std::string, std::unique_ptr<GramAccumulator>> grams;
  std::map<std::string, std::vector<double>> abs_sums;
  model.SetActivationObserver([&](const std::string& name, const float* x, int64_t m, int64_t k) {
    LayerStats& s = stats[name];
    std::vector<double>& abs_sum = abs_sums[name];
    if (s.absmax.empty()) {
      s.absmax.assign(k, 0.0f);
      abs_sum.assign(k, 0.0);
      if (options.want_gram && options.want_gram(name)) {
        grams[name] = std::make_unique<GramAccumulator>(k);
      }
    }
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < k; ++j) {
        const float a = std::abs(x[i * k + j]);
        s.absmax[j] = std::max(s.absmax[j], a);
        abs_sum[j] += a;
      }
    }
    s.rows += m;
    if (auto it = grams.find(name); it != grams.end()) {
      it->second->Add(x, m, k, model.context().pool);
    }
  });
  PDQ_ASSIGN_OR_RETURN(std::unique_ptr<KvCache> kv, model.NewKvCache(ctx));
  Logits logits;
  absl::Status status;
  for (int64_t w = 0; w < windows && status.ok(); ++w) {
    const int64_t begin = w * ctx, end = std::min<int64_t>((int64_t)tokens.size(), begin + ctx);
    const SeqId seq = kv->AddSequence();
    BatchEntry e{seq, std::span<const int32_t>(tokens).subspan(begin, end - begin), end - begin};
    status = model.Forward(*kv, {&e, 1}, &logits);
    kv->RemoveSequence(seq);
    if (options.progress) options.progress(w + 1, windows);
  }
  model.SetActivationObserver(nullptr);
  PDQ_RETURN_IF_ERROR(status);
  for (auto& [name, s] : stats) {
    const std::vector<double>& abs_sum = abs_sums[name];
    s.mean_abs.resize(abs_sum.size());
    for (size_t j = 0; j < abs_sum.size(); ++j) s.mean_abs[j] = (float)(abs_sum[j] / s.rows);
  }
  for (auto& [name, g] : grams) {
    stats[name].gram = g->MeanGram();
    g.reset();  // one k x k matrix at a time in flight
  }
  return stats;
}

}  // namespace pdq
