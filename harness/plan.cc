// `pdq plan`'s arithmetic (harness/plan.h).
#include "harness/plan.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/check.h"

namespace pdq {
namespace {

absl::Status Invalid(const std::string& why) { return absl::InvalidArgumentError(why); }

struct Measured {
  double prefill_tokens_per_s = 0;  // while busy
  int decode_streams = 0;           // at the TPOT target
  double tpot_p50 = 0;              // at that level, seconds
  double kv_blocks_total = 0;
};

absl::StatusOr<Measured> Measure(const BenchResult& bench, double tpot_target) {
  if (bench.levels.empty()) {
    return Invalid("the bench file has no levels (want the JSON of pdq bench --concurrency ...)");
  }
  Measured m;
  double tokens = 0, busy = 0;
  bool any_workers = false;
  for (const LevelResult& level : bench.levels) {
    // A level whose /metrics snapshot failed has none; it still counts for
    // the decode capacity below.
    any_workers = any_workers || !level.workers.empty();
    for (const WorkerUsage& w : level.workers) {
      if (w.role == "prefill") {
        if (std::isfinite(w.prefill_tokens)) tokens += w.prefill_tokens;
        if (std::isfinite(w.prefill_busy_seconds)) busy += w.prefill_busy_seconds;
      } else if (w.role == "decode" && std::isfinite(w.kv_blocks_total)) {
        m.kv_blocks_total = std::max(m.kv_blocks_total, w.kv_blocks_total);
      }
    }
    const int c = level.concurrency;
    const double p90 = level.tpot_s.p90;
    if (c > m.decode_streams && level.requests_ok > 0 && p90 > 0 && p90 <= tpot_target) {
      m.decode_streams = c;
      m.tpot_p50 = level.tpot_s.p50;
    }
  }
  if (!any_workers) {
    return Invalid(
        "the bench file has no per-worker figures (made by an older pdq bench, or "
        "against --openai?)");
  }
  if (busy <= 0)
    return Invalid("the bench file shows no prefill work (was a prefill worker in it?)");
  m.prefill_tokens_per_s = tokens / busy;
  if (m.decode_streams == 0) {
    return Invalid(absl::StrCat("no concurrency level in the bench file kept TPOT p90 within ",
                                tpot_target * 1e3,
                                " ms; measure lower levels or relax the target"));
  }
  return m;
}

}  // namespace

absl::StatusOr<DeploymentPlan> PlanDeployment(const BenchResult& bench, PlanRequest r) {
  if (r.input_tokens == 0) r.input_tokens = bench.input_tokens;
  if (r.output_tokens == 0) r.output_tokens = bench.output_tokens;
  if (r.ttft_target_ms == 0) r.ttft_target_ms = bench.ttft_target_ms;
  if (r.tpot_target_ms == 0) r.tpot_target_ms = bench.tpot_target_ms;
  if (r.ttft_target_ms == 0) r.ttft_target_ms = 2000;
  if (r.tpot_target_ms == 0) r.tpot_target_ms = 200;
  if (r.input_tokens <= 0 || r.output_tokens <= 0) {
    return Invalid("the bench file has no token counts; give --input-tokens and --output-tokens");
  }
  PDQ_ASSIGN_OR_RETURN(const Measured m, Measure(bench, r.tpot_target_ms / 1e3));
  DeploymentPlan p;
  p.request = r;
  p.prefill_tokens_per_s = m.prefill_tokens_per_s;
  p.decode_streams = m.decode_streams;
  p.tpot_p50 = m.tpot_p50;
  p.kv_blocks_total = m.kv_blocks_total;
  p.prefill_load = r.rate * r.input_tokens;
  p.prefill_workers = (int)std::ceil(p.prefill_load / (m.prefill_tokens_per_s * r.headroom) - 1e-9);
  p.streams = r.rate * r.output_tokens * m.tpot_p50;  // Little's law
  p.decode_workers = (int)std::ceil(p.streams / (m.decode_streams * r.headroom) - 1e-9);
  p.hpa_prefill_queued_prompt_tokens = m.prefill_tokens_per_s * r.ttft_target_ms / 1e3 / 2;
  const double blocks_per_stream =
      std::ceil(double(r.input_tokens + r.output_tokens) / double(r.block_tokens));
  p.hpa_decode_kv_blocks_used_ratio =
      m.kv_blocks_total > 0
          ? std::min(0.9, m.decode_streams * blocks_per_stream / m.kv_blocks_total)
          : 0.0;
  return p;
}

}  // namespace pdq
