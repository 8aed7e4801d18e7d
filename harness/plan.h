// `pdq plan`'s arithmetic: how many prefill and decode workers a request
// rate needs, and the autoscaler thresholds that hold that ratio, from a
// `pdq bench` run (harness/bench_result.h) against one prefill and one
// decode worker.
//
// Prefill capacity is what the prefill worker computed per second of
// forward passes (prompt tokens / busy seconds). A decode worker's capacity
// is the most concurrent streams at which the measured TPOT p90 stayed
// within the target. Then, planning at `headroom` of those capacities:
//   prefill workers = rate x input tokens / (capacity x headroom)
//   decode workers  = concurrent streams (rate x output tokens x TPOT,
//                     Little's law) / (streams per worker x headroom)
// HPA targets: queued prompt tokens per prefill worker that drain in half
// the TTFT target; for decode, the streams per worker at the TPOT target,
// or the KV-block share they reserve (a weak signal when the cache is far
// larger than the workload needs).
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "harness/bench_result.h"

namespace pdq {

struct PlanRequest {
  double rate = 0;  // requests per second to serve
  // 0: the bench's (targets: the bench's, else 2000 and 200 ms).
  int64_t input_tokens = 0, output_tokens = 0;
  double ttft_target_ms = 0, tpot_target_ms = 0;
  double headroom = 0.7;      // the fraction of measured capacity to plan for
  int64_t block_tokens = 16;  // tokens per KV block of the workers
};

struct DeploymentPlan {
  PlanRequest request;  // with the bench's values filled in
  // Measured.
  double prefill_tokens_per_s = 0;  // a prefill worker, while busy
  int decode_streams = 0;           // a decode worker, within the TPOT target
  double tpot_p50 = 0;              // at that level, seconds
  double kv_blocks_total = 0;
  // Planned.
  double prefill_load = 0;  // prompt tokens per second to compute
  double streams = 0;       // streams decoding at once
  int prefill_workers = 0, decode_workers = 0;
  double hpa_prefill_queued_prompt_tokens = 0;
  double hpa_decode_kv_blocks_used_ratio = 0;  // 0: the bench saw no KV cache size
};

// InvalidArgument saying what the bench lacks (levels, per-worker figures,
// prefill work, a level within the TPOT target, token counts).
absl::StatusOr<DeploymentPlan> PlanDeployment(const BenchResult& bench, PlanRequest request);

}  // namespace pdq
