// `pdq plan`: how many prefill and decode workers a request rate needs, and
// the autoscaler thresholds that hold that ratio, from a `pdq bench --json`
// run against one prefill and one decode worker (harness/plan.h has the
// arithmetic).
#include <cstdio>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "harness/bench_result.h"
#include "harness/plan.h"
#include "nlohmann/json.hpp"
#include "tools/commands.h"

namespace pdq {

int PlanCommand(int argc, char** argv) {
  std::string bench_path, json_path;
  double rate = 0, ttft_ms = 0, tpot_ms = 0, headroom = 0.7;
  int64_t input_tokens = 0, output_tokens = 0, block_tokens = 16;
  FlagParser flags("plan",
                   "Recommends prefill and decode worker counts for a request rate, and the "
                   "autoscaler targets that hold them, from a pdq bench --json run against one "
                   "prefill and one decode worker.");
  flags.String("bench", &bench_path, "pdq bench --json output (concurrency levels, 1P+1D)");
  flags.Float("rate", &rate, 0, 1e9, "requests per second to serve");
  flags.Int("input-tokens", &input_tokens, 0, 1 << 20, "prompt tokens (default: the bench's)");
  flags.Int("output-tokens", &output_tokens, 0, 1 << 20, "output tokens (default: the bench's)");
  flags.Float("ttft-target-ms", &ttft_ms, 0, 1e9, "TTFT target (default: the bench's, else 2000)");
  flags.Float("tpot-target-ms", &tpot_ms, 0, 1e9, "TPOT target (default: the bench's, else 200)");
  flags.Float("headroom", &headroom, 0.05, 1, "fraction of measured capacity to plan for");
  flags.Int("block-tokens", &block_tokens, 1, 1024, "tokens per KV block of the workers");
  flags.String("json", &json_path, "also write the plan here");
  if (int rc = ParseOrExit(flags, argc, argv); rc >= 0) return rc;
  if (bench_path.empty()) return Fail("plan", absl::InvalidArgumentError("--bench is required"));
  if (rate <= 0)
    return Fail("plan",
                absl::InvalidArgumentError("--rate is required (requests per second, > 0)"));
  absl::StatusOr<BenchResult> read = ReadBenchResult(bench_path);
  if (!read.ok()) return Fail("plan", read.status());
  const BenchResult& bench = *read;
  PlanRequest request;
  request.rate = rate;
  request.input_tokens = input_tokens;
  request.output_tokens = output_tokens;
  request.ttft_target_ms = ttft_ms;
  request.tpot_target_ms = tpot_ms;
  request.headroom = headroom;
  request.block_tokens = block_tokens;
  absl::StatusOr<DeploymentPlan> plan = PlanDeployment(bench, request);
  if (!plan.ok()) return Fail("plan", plan.status());
  const DeploymentPlan& p = *plan;
  const PlanRequest& r = p.request;
  std::printf("measured in %s:\n", bench_path.c_str());
  std::printf("  a prefill worker computes %.0f prompt tokens/s while busy\n",
              p.prefill_tokens_per_s);
  std::printf(
      "  a decode worker keeps TPOT p90 within %.0f ms up to %d streams (TPOT p50 %.1f ms)\n",
      r.tpot_target_ms, p.decode_streams, p.tpot_p50 * 1e3);
  std::printf("for %.3g requests/s of %lld tokens in and %lld out, at %.0f%% of that capacity:\n",
              r.rate, (long long)r.input_tokens, (long long)r.output_tokens, r.headroom * 100);
  std::printf("  prefill workers: %d  (%.0f prompt tokens/s to compute)\n", p.prefill_workers,
              p.prefill_load);
  std::printf("  decode workers:  %d  (%.1f streams decoding at once)\n", p.decode_workers,
              p.streams);
  std::printf("autoscaler targets (average value per pod):\n");
  std::printf(
      "  prefill: pdq_queued_prompt_tokens %.0f  (a queue one worker computes in half the "
      "%.0f ms TTFT target)\n",
      p.hpa_prefill_queued_prompt_tokens, r.ttft_target_ms);
  std::printf(
      "  decode:  pdq_active_sequences %d  (the streams one worker runs within the TPOT "
      "target)\n",
      p.decode_streams);
  if (p.hpa_decode_kv_blocks_used_ratio > 0) {
    std::printf(
        "  decode:  pdq_kv_blocks_used_ratio %.2f  (the KV %d streams of %lld tokens "
        "reserve on one worker)\n",
        p.hpa_decode_kv_blocks_used_ratio, p.decode_streams,
        (long long)(r.input_tokens + r.output_tokens));
  }
  if (!json_path.empty()) {
    const nlohmann::json out = {
        {"rate", r.rate},
        {"input_tokens", r.input_tokens},
        {"output_tokens", r.output_tokens},
        {"ttft_target_ms", r.ttft_target_ms},
        {"tpot_target_ms", r.tpot_target_ms},
        {"headroom", r.headroom},
        {"prefill_tokens_per_s", p.prefill_tokens_per_s},
        {"decode_streams_per_worker", p.decode_streams},
        {"prefill_workers", p.prefill_workers},
        {"decode_workers", p.decode_workers},
        {"hpa_prefill_queued_prompt_tokens", p.hpa_prefill_queued_prompt_tokens},
        {"hpa_decode_kv_blocks_used_ratio", p.hpa_decode_kv_blocks_used_ratio}};
    std::ofstream f(json_path);
    f << out.dump(1) << "\n";
    if (!f) return Fail("plan", absl::UnavailableError(absl::StrCat("cannot write ", json_path)));
  }
  return 0;
}

}  // namespace pdq
