#include "policy/batch.h"

namespace pdq::policy {

StepComposition FormStep(std::span<const StreamView> streams, const BatchOptions& options,
                         const StepCostModel& prefill_cost, const StepCostModel& decode_cost) {
  StepComposition c;
  for (size_t i = 0; i < streams.size(); ++i) {
    const StreamView& s = streams[i];
    if (s.stage == StreamView::Stage::kPrompt) c.prompts.push_back(i);
    if (s.stage == StreamView::Stage::kDecoding &&
        (int64_t)c.rows.size() < (int64_t)options.max_decode_batch) {
      c.rows.push_back(i);
    }
  }
  if (c.rows.empty() && c.prompts.empty()) return c;
  std::stable_partition(c.prompts.begin(), c.prompts.end(),
                        [&](size_t i) { return !streams[i].batch_priority; });
  StepInput in;
  in.fused = options.fused;
  in.token_budget = options.token_budget;
  in.tpot_target = options.tpot_target;
  in.prompt_share = options.prompt_share;
  in.min_chunk = in.align = options.block_tokens;
  for (size_t i : c.prompts) {
    in.prefill.push_back({streams[i].prefilled, streams[i].prompt_tokens - streams[i].prefilled});
  }
  for (size_t i : c.rows) {
    StepWork w;
    w.AddDecodeRow(streams[i].kv_tokens);
    in.decode_attention += w.decode_attention;
  }
  in.decode_rows = (int64_t)c.rows.size();
  c.plan = PlanStep(in, prefill_cost, decode_cost);
  c.chunk = c.plan.chunk;
  return c;
}

}  // namespace pdq::policy
