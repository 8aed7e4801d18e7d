// One simulated worker: the streams it holds and its step loop, batching
// with policy::FormStep and learning step costs online as the real
// scheduler does. sim::Simulate drives several of these from its event queue;
// the parity test (tests/sim_parity_test.cc) drives one with the arrivals
// and step times a real worker recorded.
#pragma once

#include <cstdint>
#include <vector>

#include "policy/batch.h"
#include "sim/sim.h"

namespace pdq::sim {

struct SimStream {
  int64_t id = 0;
  policy::StreamView::Stage stage = policy::StreamView::Stage::kPrompt;
  bool batch_priority = false;
  int64_t prefilled = 0, prompt_tokens = 0;
  int64_t kv_tokens = 0;
  int64_t output_tokens = 0;  // to generate (a prefill-only stream: 1, the first token)
  int64_t emitted = 0;
  bool prefill_only = false;  // a prefill worker's: ends when its prompt is computed
};

// What a step computed, by stream id.
struct SimStep {
  std::vector<int64_t> rows;
  std::vector<std::pair<int64_t, int64_t>> chunks;  // (id, tokens)
  // The work of each pass: everything in pass_work when fused.
  policy::StepWork pass_work, prompt_work;
  double predicted_seconds = 0;
  bool empty() const { return rows.empty() && chunks.empty(); }
};

// A step's time by pass: `prompt` is the prompt model's pass when it is
// not fused (0 otherwise).
struct StepTimes {
  double pass = 0, prompt = 0;
  double overhead = 0;          // WorkerSpec::step_overhead's, its per-row part included
  double overhead_per_row = 0;  // the per-row part's price a row (the spec's used)
  double total() const { return pass + prompt + overhead; }
};

// What ending a step did.
struct StepOutcome {
  std::vector<int64_t> tokens;     // streams that emitted a token (first tokens included)
  std::vector<int64_t> prefilled;  // streams whose prompt completed this step
  std::vector<int64_t> finished;   // streams that ended (all tokens, or prefill-only done)
};

class WorkerSim {
 public:
  // Observes the spec's calibration passes first when it asks for them (a
  // prefill worker never bounds a step, so it has none).
  WorkerSim(Role role, const WorkerSpec& spec);

  Role role() const { return role_; }
  const WorkerSpec& spec() const { return spec_; }
  // A prompt to compute (stage kPrompt), or a decode reservation waiting
  // for its KV (kOther), which joins the streams where the worker holds
  // them: at the end, as the worker appends a new sequence.
  void Add(const SimStream& s);
  // The reservation's KV landed with its first token: it decodes from the
  // next step.
  void KvLanded(int64_t id);
  void Remove(int64_t id);
  bool HasWork() const;
  // Prompt tokens waiting to be computed.
  int64_t queued_prompt_tokens() const;
  // Streams decoding (the worker's active sequences).
  int64_t decoding() const;
  // The step's decode rows whose streams end with this step's token.
  int64_t Ending(const SimStep& step) const;
  int64_t streams() const { return (int64_t)streams_.size(); }
  // KV blocks held (reserved for prompt + output, as the worker reserves).
  int64_t kv_blocks_used() const { return kv_blocks_used_; }
  bool Reserve(int64_t tokens);
  void Unreserve(int64_t tokens);

  // The next step: policy::FormStep over the streams, the rows then move to
  // the back. Empty when there is nothing to do.
  SimStep Form();
  // The step's times by the spec's pass models; with `neighbour_idle` (a
  // co-located worker whose neighbour runs no step), by the spec's
  // neighbour_idle ones where it has them.
  StepTimes ModelTimes(const SimStep& step, bool neighbour_idle = false) const;
  // Ends the step: the cost models observe each pass's time (as the
  // worker's do), tokens are emitted, chunks advance.
  StepOutcome Finish(const SimStep& step, const StepTimes& times);
  // The streams, in the worker's order.
  const std::vector<SimStream>& stream_list() const { return streams_; }

 private:
  int64_t BlocksFor(int64_t tokens) const;
  // Whether a decode row's next token is its stream's last (Ending before
  // the step, Finish after it).
  static bool LastToken(const SimStream& s) { return s.emitted + 1 >= s.output_tokens; }

  Role role_;
  WorkerSpec spec_;
  std::vector<SimStream> streams_;
  policy::StepCostModel prompt_cost_, decode_cost_;
  int64_t kv_blocks_used_ = 0;
};

}  // namespace pdq::sim
