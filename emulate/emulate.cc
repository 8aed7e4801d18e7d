#include "emulate/emulate.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "engine/linear.h"

namespace pdq::emulate {

policy::StepWork PassWork(std::span<const BatchEntry> batch, const ForwardPlan& plan) {
  policy::StepWork work;
  for (size_t e : plan.run) {
    // As the scheduler counts its passes: a prompt's last token after a
    // prefix-cache hit is a 1-token chunk, not a decode row.
    if (IsPromptEntry(batch[e])) {
      work.AddChunk(plan.start[e], (int64_t)batch[e].tokens.size());
    } else {
      work.AddDecodeRow(plan.start[e]);
    }
  }
  return work;
}

TimedBackend::TimedBackend(TimedPassOptions options) : o_(std::move(options)) {
  PDQ_CHECK(o_.num_layers > 0 && o_.vocab_size > 0 && !o_.script.empty());
  if (!o_.now) o_.now = [] { return absl::Now(); };
  if (!o_.sleep_until) o_.sleep_until = [](absl::Time t) { absl::SleepFor(t - absl::Now()); };
}

absl::Status TimedBackend::Run(std::span<const BatchEntry> batch, const ForwardPlan& plan,
                               KvCache& /*kv*/, const std::function<void(int)>& layer_done,
                               Logits* logits) {
  const absl::Time start = o_.now();
  const double seconds = o_.time_scale * o_.time.Seconds(PassWork(batch, plan));
  // The logit rows first (their cost is the emulation's own, inside the
  // pass's time): one-hot on the script's token for each row's position.
  const int64_t vocab = o_.vocab_size;
  logits->vocab_size = (int)vocab;
  logits->data.assign((size_t)(plan.logit_rows * vocab), 0.0f);
  for (size_t e : plan.run) {
    const int64_t n = (int64_t)batch[e].tokens.size();
    for (int64_t i = 0; i < logits->num_rows[e]; ++i) {
      // The row predicts the token after position start + n - rows + i.
      const int64_t pos = plan.start[e] + n - logits->num_rows[e] + i + 1;
      const int32_t token = o_.script[(size_t)(pos % (int64_t)o_.script.size())];
      logits->data[(size_t)((logits->first_row[e] + i) * vocab + token)] = 30.0f;
    }
  }
  for (int layer = 0; layer < o_.num_layers; ++layer) {
    o_.sleep_until(start + absl::Seconds(seconds * (layer + 1) / o_.num_layers));
    if (layer_done) layer_done(layer);
  }
  return absl::OkStatus();
}

absl::StatusOr<EmulatedModel> LoadEmulated(const sim::Profile& profile, const std::string& spec,
                                           const std::string& precision, int threads,
                                           double time_scale, const CpuContext& cpu,
                                           KvDtype kv_dtype) {
  if (!(time_scale > 0)) {
    return absl::InvalidArgumentError(absl::StrCat("time scale must be above 0, not ", time_scale));
  }
  EmulatedModel out;
  PDQ_ASSIGN_OR_RETURN(const Precision p, ParsePrecision(precision));
  PDQ_ASSIGN_OR_RETURN(out.pass, profile.Pass(PrecisionName(p), threads));
  PDQ_ASSIGN_OR_RETURN(const KvDtype profiled, ParseKvDtype(profile.kv_dtype));
  if (profiled != kv_dtype) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the profile (of '", profile.model_path, "') ran its passes with a KV cache of ",
        profile.kv_dtype, "; this worker's is of ", KvDtypeName(kv_dtype), " (pass --kv-dtype ",
        profile.kv_dtype, " to follow it, or use a profile measured with --kv-dtype ",
        KvDtypeName(kv_dtype), ")"));
  }
  PDQ_ASSIGN_OR_RETURN(out.model, Model::LoadShape(spec, p, kv_dtype));
  const ModelConfig& c = out.model->config();
  const KvLayout layout = out.model->kv_layout((int)std::max<int64_t>(profile.block_tokens, 1));
  const int64_t kv_bytes = layout.bytes_per_token();
  if (profile.num_layers != c.num_layers || profile.kv_bytes_per_token != kv_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("the profile was measured on a model of ", profile.num_layers, " layers and ",
                     profile.kv_bytes_per_token, " KV bytes a token ('", profile.model_path,
                     "'); '", spec, "' has ", c.num_layers, " and ", kv_bytes));
  }
  TimedPassOptions o;
  o.time = out.pass.time;
  o.time_scale = time_scale;
  o.num_layers = c.num_layers;
  o.vocab_size = c.vocab_size;
  // Readable text, so the streams look like a model's (no end-of-text
  // token: an emulated answer runs to its max_tokens).
  o.script = out.model->tokenizer().Encode(
      "Emulated worker: this text stands in for a model's answer, one token a step at the "
      "profile's pace. ",
      /*add_bos=*/false, /*parse_special=*/false);
  if (o.script.empty()) o.script.push_back(0);
  out.ctx = std::make_unique<Context>(*out.model, cpu, std::make_unique<TimedBackend>(o));
  return out;
}

}  // namespace pdq::emulate
