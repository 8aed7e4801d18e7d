// Per-channel statistics over every position of every window.
#include "quant/calibrate.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/check.h"
#include "quant/w4_quantize.h"

namespace pdq {
namespace {

// The text's paragraphs (blank-line separated) as conversations of two
// exchanges each, rendered with the model's chat template.
absl::StatusOr<std::vector<int32_t>> ChatTokens(const Tokenizer& tok, const std::string& text) {
  std::vector<std::string> paragraphs;
  for (absl::string_view p : absl::StrSplit(text, "\n\n", absl::SkipWhitespace())) {
    paragraphs.emplace_back(absl::StripAsciiWhitespace(p));
  }
  std::vector<int32_t> out;
  for (size_t i = 0; i + 4 <= paragraphs.size(); i += 4) {
    std::vector<ChatMessage> messages = {{"user", paragraphs[i]},
                                         {"assistant", paragraphs[i + 1]},
                                         {"user", paragraphs[i + 2]},
                                         {"assistant", paragraphs[i + 3]}};
    PDQ_ASSIGN_OR_RETURN(const std::string rendered,
                         tok.ApplyChatTemplate(messages, /*add_generation_prompt=*/false));
    const std::vector<int32_t> ids = tok.Encode(rendered, tok.add_bos(), /*parse_special=*/true);
    out.insert(out.end(), ids.begin(), ids.end());
  }
  return out;
}

}  // namespace

absl::StatusOr<ActivationStats> CollectActivationStats(Context& context, const std::string& text,
                                                       const CalibrationOptions& options) {
  const Model& model = context.model();
  const Tokenizer& tok = model.tokenizer();
  const std::vector<int32_t> tokens = tok.Encode(text, tok.add_bos(), /*parse_special=*/false);
  if (tokens.size() < 16) {
    return absl::InvalidArgumentError(absl::StrCat("the calibration text has ", tokens.size(),
                                                   " tokens; at least 16 are needed"));
  }
  const int64_t ctx = std::min<int64_t>(options.ctx, model.config().max_context);
  PDQ_ASSIGN_OR_RETURN(const std::vector<int32_t> chat,
                       options.chat_windows ? ChatTokens(tok, text) : std::vector<int32_t>{});
  // Window w: plain text, or (odd w, with chat windows) the conversations.
  auto window = [&](int64_t w) -> std::span<const int32_t> {
    const bool use_chat = !chat.empty() && w % 2 == 1;
    const std::vector<int32_t>& src = use_chat ? chat : tokens;
    const int64_t i = chat.empty() ? w : w / 2;
    const int64_t begin = i * ctx;
    if (begin >= (int64_t)src.size()) return {};
    return std::span<const int32_t>(src).subspan(begin, std::min<int64_t>(ctx, src.size() - begin));
  };
  int64_t windows = 0;
  while (windows < options.max_windows && !window(windows).empty()) ++windows;
  ActivationStats stats;
  std::map<std::string, std::unique_ptr<GramAccumulator>> grams;
  std::map<std::string, std::vector<double>> abs_sums;
  context.SetActivationObserver([&](const std::string& name, const float* x, int64_t m, int64_t k) {
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
      it->second->Add(x, m, k, context.cpu().pool);
    }
  });
  PDQ_ASSIGN_OR_RETURN(std::unique_ptr<KvCache> kv, model.NewKvCache(ctx));
  Logits logits;
  absl::Status status;
  for (int64_t w = 0; w < windows && status.ok(); ++w) {
    const std::span<const int32_t> piece = window(w);
    const SeqId seq = kv->AddSequence();
    BatchEntry e{seq, piece, (int64_t)piece.size()};
    status = context.ForwardAll(*kv, {&e, 1}, &logits);
    if (status.ok()) status = kv->RemoveSequence(seq);
    if (options.progress) options.progress(w + 1, windows);
  }
  context.SetActivationObserver(nullptr);
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

namespace {
constexpr char kStatsMagic[8] = {'P', 'D', 'Q', 'S', 'T', 'A', 'T', '1'};
}  // namespace

absl::Status SaveActivationStats(const ActivationStats& stats, const std::string& path) {
  std::string out(kStatsMagic, 8);
  auto put = [&out](const void* p, size_t n) { out.append(static_cast<const char*>(p), n); };
  const uint64_t count = stats.size();
  put(&count, 8);
  for (const auto& [name, s] : stats) {
    if (!s.gram.empty() || s.mean_abs.size() != s.absmax.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("statistics of '", name, "' hold a Gram matrix; not cached"));
    }
    const uint64_t name_len = name.size(), n = s.absmax.size();
    put(&name_len, 8);
    put(name.data(), name.size());
    put(&s.rows, 8);
    put(&n, 8);
    put(s.absmax.data(), n * sizeof(float));
    put(s.mean_abs.data(), n * sizeof(float));
  }
  const std::string tmp = absl::StrCat(path, ".tmp.", ::getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f.write(out.data(), (std::streamsize)out.size());
    if (!f) return absl::UnavailableError(absl::StrCat("cannot write '", tmp, "'"));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return absl::UnavailableError(absl::StrCat("cannot rename '", tmp, "' to '", path, "'"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ActivationStats> LoadActivationStats(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return absl::NotFoundError(absl::StrCat("no statistics at '", path, "'"));
  const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  size_t pos = 0;
  auto take = [&](void* p, size_t n) {
    if (bytes.size() - pos < n) return false;
    std::memcpy(p, bytes.data() + pos, n);
    pos += n;
    return true;
  };
  auto corrupt = [&] {
    return absl::InvalidArgumentError(absl::StrCat("'", path, "' is not a statistics file"));
  };
  char magic[8];
  uint64_t count = 0;
  if (!take(magic, 8) || std::memcmp(magic, kStatsMagic, 8) != 0 || !take(&count, 8)) {
    return corrupt();
  }
  ActivationStats stats;
  for (uint64_t i = 0; i < count; ++i) {
    uint64_t name_len = 0, n = 0;
    if (!take(&name_len, 8) || name_len > 4096 || bytes.size() - pos < name_len) return corrupt();
    std::string name = bytes.substr(pos, name_len);
    pos += name_len;
    LayerStats s;
    if (!take(&s.rows, 8) || !take(&n, 8) || n > (1u << 24)) return corrupt();
    s.absmax.resize(n);
    s.mean_abs.resize(n);
    if (!take(s.absmax.data(), n * sizeof(float)) || !take(s.mean_abs.data(), n * sizeof(float))) {
      return corrupt();
    }
    stats.emplace(std::move(name), std::move(s));
  }
  if (pos != bytes.size()) return corrupt();
  return stats;
}

}  // namespace pdq
