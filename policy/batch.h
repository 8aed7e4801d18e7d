// What one worker step computes, from the streams a worker holds: which
// decoding streams advance (the decode rows) and how much of which waiting
// prompts is computed (the chunks). A pure function: the worker's scheduler
// (worker/scheduler.h) calls it on its sequences and the cluster simulator
// (sim/sim.h) on its simulated ones, so the simulator batches as the worker
// does (tests/sim_parity_test.cc checks that the two form the same steps).
//
// The rules: every decoding stream that is not paused is a row, in the order
// the worker holds them, up to the batch size; the streams that ran move to
// the back afterwards (RanToBack), so a full batch rotates fairly. Waiting
// prompts are served interactive first, each class in arrival order, and
// their chunks come from PlanStep (policy/step_plan.h).
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "policy/step_plan.h"

namespace pdq::policy {

// A stream as batch formation sees it.
struct StreamView {
  enum class Stage {
    kOther,     // neither (awaiting its KV, sending it, paused, suspended, finished)
    kPrompt,    // its prompt waits for (more) prefill
    kDecoding,  // advances one token a step
  };
  Stage stage = Stage::kOther;
  bool batch_priority = false;  // batch class: served after interactive prompts
  int64_t prefilled = 0;        // prompt tokens computed or cached
  int64_t prompt_tokens = 0;
  int64_t kv_tokens = 0;  // a decoding stream's tokens in the KV cache
};

struct BatchOptions {
  int max_decode_batch = 64;
  int64_t token_budget = 2048;  // prompt tokens a step, at most
  double tpot_target = 0;       // seconds; 0: no bound (StepInput::tpot_target)
  double prompt_share = 0;      // with no tpot_target (StepInput::prompt_share)
  int64_t block_tokens = 16;    // the KV block: chunk alignment and least progress
  bool fused = true;            // one forward pass for prompts and decoding
};

struct StepComposition {
  std::vector<size_t> rows;     // indices of the decode rows, in stream order
  std::vector<size_t> prompts;  // indices of the waiting prompts, in serving order
  std::vector<int64_t> chunk;   // per prompts[i]: tokens computed this step (0: none)
  StepPlan plan;
  bool empty() const { return rows.empty() && plan.prefill_tokens == 0; }
};

StepComposition FormStep(std::span<const StreamView> streams, const BatchOptions& options,
                         const StepCostModel& prefill_cost, const StepCostModel& decode_cost);

// Moves the elements at `rows` (indices, ascending) to the back, keeping the
// order of the rest and of the moved ones.
template <class T>
void RanToBack(std::vector<T>& streams, std::span<const size_t> rows) {
  std::vector<T> ran;
  ran.reserve(rows.size());
  size_t keep = 0, r = 0;
  for (size_t i = 0; i < streams.size(); ++i) {
    if (r < rows.size() && rows[r] == i) {
      ran.push_back(std::move(streams[i]));
      ++r;
    } else {
      if (keep != i) streams[keep] = std::move(streams[i]);
      ++keep;
    }
  }
  std::move(ran.begin(), ran.end(), streams.begin() + keep);
}

}  // namespace pdq::policy
