// How much prompt work one scheduler step takes, so that decoding streams
// keep their time per output token while prompts arrive (stall-free
// batching, as in Sarathi-Serve): pure functions of a snapshot and a step
// cost model the scheduler feeds with its measured step times. Nothing here
// reads a clock.
//
// A step runs the decode rows and prompt chunks it is given. Where prompts
// and decoding use one model (a monolithic worker at one precision, or a
// decode worker prefilling a short suffix) they run as one forward pass and
// the decode rows ride along with the prompt's matrix products ("fused");
// where they use two (a W8A8 prefill beside a W4A16 decode in one process),
// the prompt chunk runs before the decode step and the two together must fit
// the target.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace pdq::policy {

// What a forward pass computes, in the terms its time depends on.
struct StepWork {
  int64_t decode_rows = 0;     // sequences advanced by one token
  int64_t prefill_tokens = 0;  // prompt tokens computed
  // Attention's share: for each entry, new tokens x (tokens before them +
  // half the new ones), summed (a decode row over a 300-token sequence
  // counts 300.5).
  double attention = 0;
  void AddChunk(int64_t past, int64_t tokens);
  void AddDecodeRow(int64_t past);
};

// A forward pass's time as a linear function of StepWork (a fixed part,
// per decode row, per prompt token, per attention pair), fitted online by
// recursive least squares with forgetting, so it follows the machine (other
// load, frequency) within tens of steps. Deterministic.
class StepCostModel {
 public:
  StepCostModel();
  // Seconds; 0 until something was observed.
  double Predict(const StepWork& w) const;
  void Observe(const StepWork& w, double seconds);
  int64_t observations() const { return n_; }
  // Of those, steps that computed prompt tokens (until one has, their cost
  // is not known).
  int64_t prefill_observations() const { return n_prefill_; }
  // "2.1 ms + 0.40 ms/row + 0.52 ms/token + 31 ms/M pairs", for logs.
  std::string Describe() const;

 private:
  static constexpr int kDim = 4;
  double theta_[kDim];
  double p_[kDim][kDim];
  int64_t n_ = 0, n_prefill_ = 0;
};

struct PrefillNeed {
  int64_t past = 0;       // prompt tokens computed or cached already
  int64_t remaining = 0;  // still to compute (> 0)
};

struct StepInput {
  // Prompts waiting, in the order they should be served.
  std::vector<PrefillNeed> prefill;
  // The decode rows this step advances (already capped by the batch size)
  // and their attention share (StepWork::AddDecodeRow).
  int64_t decode_rows = 0;
  double decode_attention = 0;
  // One forward pass for both (see above).
  bool fused = false;
  // Prompt tokens per step, at most (--prefill-budget).
  int64_t token_budget = 2048;
  // The step time to keep while decode rows run, in seconds; 0: no bound
  // (each step takes token_budget).
  double tpot_target = 0;
  // Prompt tokens a step takes while any wait, however tight the target, so
  // prompts always progress. Not fused, at least as many as cost what the
  // prompt pass's fixed part costs (by the model), so a pass of its own is
  // never spent on a handful of tokens.
  int64_t min_chunk = 16;
  // Chunks that stop short of a prompt's end are cut to multiples of this
  // (the KV block), when at least one fits.
  int64_t align = 16;
};

struct StepPlan {
  // Per entry of StepInput::prefill: tokens computed this step (0: none).
  std::vector<int64_t> chunk;
  int64_t prefill_tokens = 0;
  // The predicted time of the step (both passes when not fused); 0 when
  // the models have not observed anything yet.
  double predicted_seconds = 0;
  // The prompt tokens were limited by the target (not by the budget or the
  // prompts).
  bool bounded = false;
};

// `prefill_cost` times the pass that computes prompts; `decode_cost` the
// decode pass (the same model when fused).
StepPlan PlanStep(const StepInput& in, const StepCostModel& prefill_cost,
                  const StepCostModel& decode_cost);

}  // namespace pdq::policy
