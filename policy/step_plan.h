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
#include <utility>
#include <vector>

namespace pdq::policy {

// What a forward pass computes, in the terms its time depends on.
struct StepWork {
  int64_t decode_rows = 0;     // sequences advanced by one token
  int64_t prefill_tokens = 0;  // prompt tokens computed
  // Attention's share, its pairs: for each prompt chunk, new tokens x
  // (tokens before them + half the new ones), summed.
  double attention = 0;
  // The decode rows' pairs, apart: a row over a 300-token sequence counts
  // 300.5. A row reads its sequence's whole KV for one query (bound by
  // memory bandwidth), while a chunk's tokens share each KV read (bound by
  // compute): measured, a decode pair costs 3-7x a prompt pair (FP16, W8A8
  // and W4A16 on Emerald Rapids, bench/RESULTS.md), and one price for both
  // missed decode steps at long contexts by up to two fifths.
  double decode_attention = 0;
  void AddChunk(int64_t past, int64_t tokens);
  void AddDecodeRow(int64_t past);
};

// A measured pass: its work and time, and its weight in a fit.
struct StepSample {
  StepWork work;
  double seconds = 0;
  double weight = 1;
};

// points' y at x, linear between them, held beyond the ends; points are
// non-empty, their x strictly ascending (StepCoefficients::row_steps,
// sim::WorkerSpec::row_factors).
double Interpolated(const std::vector<std::pair<double, double>>& points, double x);

// The coefficients of a pass's time: fixed + per decode row + per prompt
// token + per prompt attention pair + per decode attention pair.
struct StepCoefficients {
  double fixed = 0;            // per pass (reading the weights)
  double per_row = 0;          // per decode row
  double per_token = 0;        // per prompt token
  double per_pair = 0;         // per prompt attention pair (StepWork::attention)
  double per_decode_pair = 0;  // per decode attention pair (StepWork::decode_attention)
  // Where measured passes leave that line by the rows their matrix products
  // run on (decode rows + prompt tokens): (rows, seconds added) at each row
  // count measured, rows ascending, interpolated linearly between them and
  // held beyond the ends. A kernel whose cost changes shape with the row
  // count makes steps a line misses (on Zen 4 an FP16 pass of 8 rows takes a
  // fifth longer than the line through 1 to 16 rows). `pdq profile` fills
  // it from its passes without prompt tokens; the workers' online fit has
  // none.
  std::vector<std::pair<double, double>> row_steps;
  double RowStep(double rows) const;
  // row_steps' rows are finite, >= 1 and strictly ascending, its seconds
  // finite; kRowStepsRule says so in error messages.
  bool RowStepsValid() const;
  static constexpr const char* kRowStepsRule =
      "row_steps' rows must be >= 1 and ascending, their seconds finite";
  double Seconds(const StepWork& w) const {
    return fixed + per_row * double(w.decode_rows) + per_token * double(w.prefill_tokens) +
           per_pair * w.attention + per_decode_pair * w.decode_attention +
           (row_steps.empty() ? 0 : RowStep(double(w.decode_rows + w.prefill_tokens)));
  }
};

// Non-negative weighted least squares of the samples' seconds on the five
// parts, each sample counting by its relative error (weight / seconds^2):
// every subset of the parts is solved and the one with no negative
// coefficient and the least residual kept (time is never saved by more
// work). Parts no sample exercises are 0. Used by `pdq profile`; the
// workers' StepCostModel solves the same way.
StepCoefficients FitStepTime(const std::vector<StepSample>& samples);

// Weighted normal equations of a pass's time on its five parts, each sample
// counting by its relative error (weight / seconds^2).
struct NormalEquations {
  static constexpr int kParts = 5;
  double a[kParts][kParts] = {}, b[kParts] = {}, yy = 0;
  void Add(const StepWork& w, double seconds, double weight);
  void Scale(double f);
  void Plus(const NormalEquations& o);
  // The non-negative fit (FitStepTime).
  StepCoefficients Fit() const;
};

// A forward pass's time as a linear function of StepWork, fitted online:
// the non-negative fit (FitStepTime) of every pass observed, each weighing
// kForget times the next newer one (forgetting, so it follows the machine,
// other load and frequency, within tens of steps), plus the calibration
// passes a worker timed at start, kept at full weight for good. Steps under
// steady load are much alike and, alone, cannot tell a pass's fixed cost
// from its per-token cost; the calibration passes can. The fit is solved
// afresh from the accumulated normal equations after each pass (an earlier
// recursive least squares, the textbook online form, updated its inverse
// instead, and seeded with a few calibration passes it diverged on a
// monolithic worker: coefficients of 10^13 ms, bench/RESULTS.md).
// Deterministic.
class StepCostModel {
 public:
  // Seconds; 0 until something was observed.
  double Predict(const StepWork& w) const;
  void Observe(const StepWork& w, double seconds);
  // A start-up calibration pass: kept at full weight in every fit.
  void Calibrate(const StepWork& w, double seconds);
  int64_t observations() const { return n_; }
  // Passes (observed or calibration) that computed prompt tokens (until
  // one has, their cost is not known).
  int64_t prefill_observations() const { return n_prefill_; }
  const StepCoefficients& coefficients() const { return fit_; }
  // "2.1 ms + 0.40 ms/row + 0.52 ms/token + 31 ms/M pairs + 190 ms/M decode
  // pairs", for logs.
  std::string Describe() const;

 private:
  void Refit();
  NormalEquations recent_, calibration_;
  bool calibrated_ = false;
  StepCoefficients fit_;
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
  // (each step takes token_budget), unless prompt_share says otherwise.
  double tpot_target = 0;
  // With no tpot_target: the share of a step's time prompt work may take
  // while decode rows run (0: no bound). The step's other work (the decode
  // rows, and a prompt pass's fixed cost when it is a pass of its own) is
  // then (1 - share) of it: at 0.75, prompts keep three quarters of their
  // unbounded rate and a stream waits at most four times its decode step.
  // A bound relative to what the step costs anyway, so it needs no target
  // per machine (--tpot-target-ms auto).
  double prompt_share = 0;
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
  // The target the step was held to (tpot_target, or the one prompt_share
  // gave); 0: none.
  double target_seconds = 0;
};

// `prefill_cost` times the pass that computes prompts; `decode_cost` the
// decode pass (the same model when fused).
StepPlan PlanStep(const StepInput& in, const StepCostModel& prefill_cost,
                  const StepCostModel& decode_cost);

// The passes a worker times when it starts (when its steps are bounded), so
// that its cost models know a prompt pass's fixed cost apart from its cost
// per token before the first request: bounded steps under steady load are
// all alike, and from passes that are alike least squares cannot tell the
// two apart (bench/RESULTS.md, "Stall-free steps"). Each pass: `rows` decode
// rows over sequences of `context` tokens, and/or a prompt chunk of `chunk`
// tokens from the start of a sequence (the rows' sequences are filled to the
// longest context and cut to each pass's). A fused worker times all of them on
// its one model; otherwise the prompt chunks go to the prompt pass's model
// and the decode rows to the decode pass's.
struct CalibrationPass {
  int64_t rows = 0, context = 0, chunk = 0;
  StepWork Work() const;        // both, as one fused pass
  StepWork PromptWork() const;  // the prompt chunk alone
  StepWork RowWork() const;     // the decode rows alone
};
std::vector<CalibrationPass> CalibrationPasses(bool fused);
// Tokens of KV cache the calibration needs at once.
int64_t CalibrationKvTokens(bool fused, int64_t block_tokens);

}  // namespace pdq::policy
