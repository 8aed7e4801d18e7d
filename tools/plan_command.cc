// `pdq plan`: how many prefill and decode workers a request rate needs, and
// the autoscaler thresholds that hold that ratio, from a `pdq bench --json`
// run against one prefill and one decode worker.
//
// Prefill capacity is what the prefill worker computed per second of
// forward passes (prompt tokens / busy seconds). A decode worker's capacity
// is the most concurrent streams at which the measured TPOT p90 stayed
// within the target. Then, planning at --headroom of those capacities:
//   prefill workers = rate x input tokens / (capacity x headroom)
//   decode workers  = concurrent streams (rate x output tokens x TPOT,
//                     Little's law) / (streams per worker x headroom)
// HPA targets: queued prompt tokens per prefill worker that drain in half
// the TTFT target; for decode, the streams per worker at the TPOT target,
// or the KV-block share they reserve (a weak signal when the cache is far
// larger than the workload needs).
#include <cmath>
#include <cstdio>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "harness/bench_result.h"
#include "nlohmann/json.hpp"
#include "tools/commands.h"

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
  for (const LevelResult& level : bench.levels) {
    if (level.workers.empty()) {
      return Invalid("the bench file has no per-worker figures (made by an older pdq bench, or "
                     "against --openai?)");
    }
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
  if (bench_path.empty()) return Fail("plan", Invalid("--bench is required"));
  if (rate <= 0) return Fail("plan", Invalid("--rate is required (requests per second, > 0)"));
  absl::StatusOr<BenchResult> read = ReadBenchResult(bench_path);
  if (!read.ok()) return Fail("plan", WithFlagNames(read.status(), {{"bench result", "--bench"}}));
  const BenchResult& bench = *read;
  if (input_tokens == 0) input_tokens = bench.input_tokens;
  if (output_tokens == 0) output_tokens = bench.output_tokens;
  if (ttft_ms == 0) ttft_ms = bench.ttft_target_ms;
  if (tpot_ms == 0) tpot_ms = bench.tpot_target_ms;
  if (ttft_ms == 0) ttft_ms = 2000;
  if (tpot_ms == 0) tpot_ms = 200;
  if (input_tokens <= 0 || output_tokens <= 0) {
    return Fail("plan", Invalid("the bench file has no token counts; give --input-tokens and "
                                "--output-tokens"));
  }
  absl::StatusOr<Measured> m = Measure(bench, tpot_ms / 1e3);
  if (!m.ok()) return Fail("plan", m.status());

  const double prefill_load = rate * input_tokens;  // prompt tokens per second
  const int prefill_workers =
      (int)std::ceil(prefill_load / (m->prefill_tokens_per_s * headroom) - 1e-9);
  const double streams = rate * output_tokens * m->tpot_p50;  // Little's law
  const int decode_workers = (int)std::ceil(streams / (m->decode_streams * headroom) - 1e-9);
  const double queue_target = m->prefill_tokens_per_s * ttft_ms / 1e3 / 2;
  const double blocks_per_stream =
      std::ceil(double(input_tokens + output_tokens) / double(block_tokens));
  const double kv_target =
      m->kv_blocks_total > 0
          ? std::min(0.9, m->decode_streams * blocks_per_stream / m->kv_blocks_total)
          : 0.0;

  std::printf("measured in %s:\n", bench_path.c_str());
  std::printf("  a prefill worker computes %.0f prompt tokens/s while busy\n",
              m->prefill_tokens_per_s);
  std::printf(
      "  a decode worker keeps TPOT p90 within %.0f ms up to %d streams (TPOT p50 %.1f ms)\n",
      tpot_ms, m->decode_streams, m->tpot_p50 * 1e3);
  std::printf("for %.3g requests/s of %lld tokens in and %lld out, at %.0f%% of that capacity:\n",
              rate, (long long)input_tokens, (long long)output_tokens, headroom * 100);
  std::printf("  prefill workers: %d  (%.0f prompt tokens/s to compute)\n", prefill_workers,
              prefill_load);
  std::printf("  decode workers:  %d  (%.1f streams decoding at once)\n", decode_workers, streams);
  std::printf("autoscaler targets (average value per pod):\n");
  std::printf(
      "  prefill: pdq_queued_prompt_tokens %.0f  (a queue one worker computes in half the "
      "%.0f ms TTFT target)\n",
      queue_target, ttft_ms);
  std::printf(
      "  decode:  pdq_active_sequences %d  (the streams one worker runs within the TPOT "
      "target)\n",
      m->decode_streams);
  if (kv_target > 0) {
    std::printf(
        "  decode:  pdq_kv_blocks_used_ratio %.2f  (the KV %d streams of %lld tokens "
        "reserve on one worker)\n",
        kv_target, m->decode_streams, (long long)(input_tokens + output_tokens));
  }
  if (!json_path.empty()) {
    const nlohmann::json out = {{"rate", rate},
                                {"input_tokens", input_tokens},
                                {"output_tokens", output_tokens},
                                {"ttft_target_ms", ttft_ms},
                                {"tpot_target_ms", tpot_ms},
                                {"headroom", headroom},
                                {"prefill_tokens_per_s", m->prefill_tokens_per_s},
                                {"decode_streams_per_worker", m->decode_streams},
                                {"prefill_workers", prefill_workers},
                                {"decode_workers", decode_workers},
                                {"hpa_prefill_queued_prompt_tokens", queue_target},
                                {"hpa_decode_kv_blocks_used_ratio", kv_target}};
    std::ofstream f(json_path);
    f << out.dump(1) << "\n";
    if (!f) return Fail("plan", absl::UnavailableError(absl::StrCat("cannot write ", json_path)));
  }
  return 0;
}

}  // namespace pdq
