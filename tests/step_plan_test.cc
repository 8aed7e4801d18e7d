// The scheduler's step planning (policy/step_plan.h) on its own, with step
// costs from a known linear machine instead of a clock; and the scheduler
// in-process on a synthetic model, checked in tokens per step.
#include "policy/step_plan.h"

#include <memory>
#include <mutex>
#include <thread>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "test_models.h"
#include "worker/scheduler.h"

namespace pdq::worker {
namespace {

using policy::PlanStep;
using policy::PrefillNeed;
using policy::StepCostModel;
using policy::StepInput;
using policy::StepPlan;
using policy::StepWork;

// A machine whose step takes 2 ms + 0.5 ms a decode row + 0.1 ms a prompt
// token + 1 us per 1000 prompt attention pairs + 6 us per 1000 decode ones
// (a decode row reads its KV alone, a prompt's tokens share theirs).
double TrueCost(const StepWork& w) {
  return 2e-3 + 0.5e-3 * double(w.decode_rows) + 0.1e-3 * double(w.prefill_tokens) +
         1e-9 * w.attention + 6e-9 * w.decode_attention;
}

// A model trained on a mix of steps like the scheduler's.
StepCostModel Trained() {
  StepCostModel m;
  for (int i = 0; i < 200; ++i) {
    StepWork w;
    for (int r = 0; r < 1 + i % 9; ++r) w.AddDecodeRow(100 + 37 * i % 500);
    if (i % 3 != 0) w.AddChunk(64 * (i % 5), 16 * (1 + i % 20));
    m.Observe(w, TrueCost(w));
  }
  return m;
}

TEST(StepCostModelTest, LearnsALinearMachine) {
  const StepCostModel m = Trained();
  for (int rows : {0, 1, 8, 32}) {
    for (int tokens : {0, 16, 256, 1024}) {
      StepWork w;
      for (int r = 0; r < rows; ++r) w.AddDecodeRow(300);
      if (tokens > 0) w.AddChunk(128, tokens);
      EXPECT_NEAR(m.Predict(w), TrueCost(w), 0.02 * TrueCost(w) + 1e-5)
          << rows << " rows, " << tokens << " tokens";
    }
  }
  // Each part's price, the two attention pairs' apart.
  const policy::StepCoefficients& c = m.coefficients();
  EXPECT_NEAR(c.fixed, 2e-3, 1e-5);
  EXPECT_NEAR(c.per_row, 0.5e-3, 1e-6);
  EXPECT_NEAR(c.per_token, 0.1e-3, 1e-7);
  EXPECT_NEAR(c.per_pair, 1e-9, 1e-11);
  EXPECT_NEAR(c.per_decode_pair, 6e-9, 6e-11);
}

TEST(StepCostModelTest, FollowsAMachineThatSlowsDown) {
  StepCostModel m = Trained();
  StepWork w;
  for (int r = 0; r < 4; ++r) w.AddDecodeRow(200);
  w.AddChunk(0, 128);
  // Another tenant halves the machine: within 100 steps the model knows.
  for (int i = 0; i < 100; ++i) {
    StepWork v;
    for (int r = 0; r < 1 + i % 6; ++r) v.AddDecodeRow(200);
    if (i % 2) v.AddChunk(0, 32 * (1 + i % 8));
    m.Observe(v, 2 * TrueCost(v));
  }
  EXPECT_NEAR(m.Predict(w), 2 * TrueCost(w), 0.05 * TrueCost(w));
}

TEST(StepCostModelTest, StaysFiniteAfterHoursOfIdenticalSteps) {
  StepCostModel m = Trained();
  StepWork w;
  w.AddDecodeRow(10);
  for (int i = 0; i < 1000000; ++i) m.Observe(w, TrueCost(w));
  StepWork big;
  for (int r = 0; r < 8; ++r) big.AddDecodeRow(300);
  big.AddChunk(0, 512);
  EXPECT_TRUE(std::isfinite(m.Predict(big)));
  EXPECT_NEAR(m.Predict(w), TrueCost(w), 1e-5);
}

TEST(StepCoefficientsTest, RowStepsInterpolateBetweenRowCountsAndHoldBeyond) {
  policy::StepCoefficients c{1e-3, 1e-4, 1e-5, 0, 0, {{1, 2e-4}, {4, -1e-4}, {8, 5e-4}}};
  EXPECT_TRUE(c.RowStepsValid());
  EXPECT_DOUBLE_EQ(c.RowStep(0.5), 2e-4);
  EXPECT_DOUBLE_EQ(c.RowStep(1), 2e-4);
  EXPECT_DOUBLE_EQ(c.RowStep(2), 1e-4);
  EXPECT_DOUBLE_EQ(c.RowStep(6), 2e-4);
  EXPECT_DOUBLE_EQ(c.RowStep(100), 5e-4);
  // Decode rows and prompt tokens alike are rows of the pass's products.
  StepWork w;
  for (int i = 0; i < 2; ++i) w.AddDecodeRow(0);
  w.AddChunk(0, 4);
  EXPECT_DOUBLE_EQ(c.Seconds(w), 1e-3 + 2e-4 + 4e-5 + 2e-4);
  c.row_steps.clear();
  EXPECT_DOUBLE_EQ(c.Seconds(w), 1e-3 + 2e-4 + 4e-5);
  for (const auto& bad : std::vector<std::vector<std::pair<double, double>>>{
           {{2, 0}, {2, 1e-3}}, {{4, 0}, {2, 0}}, {{0, 0}}, {{1, NAN}}, {{INFINITY, 0}}}) {
    c.row_steps = bad;
    EXPECT_FALSE(c.RowStepsValid()) << bad[0].first;
  }
}

TEST(PlanStepTest, WithoutDecodeRowsAStepTakesTheWholeBudgetAcrossPrompts) {
  const StepCostModel m = Trained();
  StepInput in;
  in.tpot_target = 0.01;
  in.token_budget = 1000;
  in.prefill = {{0, 300}, {0, 500}, {0, 400}};
  const StepPlan p = PlanStep(in, m, m);
  EXPECT_EQ(p.chunk, (std::vector<int64_t>{300, 500, 200}));
  EXPECT_EQ(p.prefill_tokens, 1000);
  EXPECT_FALSE(p.bounded);
}

TEST(PlanStepTest, WithoutATargetDecodeWaitsForTheWholeBudget) {
  const StepCostModel m = Trained();
  StepInput in;
  in.tpot_target = 0;
  in.decode_rows = 8;
  in.prefill = {{0, 2048}};
  EXPECT_EQ(PlanStep(in, m, m).prefill_tokens, 2048);
}

TEST(PlanStepTest, FusedStepsKeepTheTargetUnderAStreamOfLongPrompts) {
  const StepCostModel m = Trained();
  // 8 streams decode while 2048-token prompts keep arriving; each step
  // must fit 20 ms, and every prompt must still finish.
  std::vector<PrefillNeed> queue;
  int arrived = 0, finished = 0;
  int64_t steps = 0, most = 0;
  for (; steps < 2000 && finished < 10; ++steps) {
    if (steps % 20 == 0 && arrived < 10) {
      queue.push_back({0, 2048});
      ++arrived;
    }
    StepInput in;
    in.fused = true;
    in.tpot_target = 0.020;
    in.decode_rows = 8;
    for (int r = 0; r < 8; ++r) in.decode_attention += 400.5;
    in.prefill = queue;
    const StepPlan p = PlanStep(in, m, m);
    StepWork actual;
    for (int r = 0; r < 8; ++r) actual.AddDecodeRow(400);
    for (size_t i = 0; i < queue.size(); ++i) {
      if (p.chunk[i] == 0) continue;
      actual.AddChunk(queue[i].past, p.chunk[i]);
      queue[i].past += p.chunk[i];
      queue[i].remaining -= p.chunk[i];
    }
    // The plan's prediction is what the machine does, within the fit.
    EXPECT_LE(TrueCost(actual), 0.020 * 1.02) << "step " << steps;
    EXPECT_NEAR(p.predicted_seconds, TrueCost(actual), 0.02 * TrueCost(actual));
    most = std::max(most, p.prefill_tokens);
    finished += (int)std::erase_if(queue, [](const PrefillNeed& n) { return n.remaining == 0; });
  }
  EXPECT_EQ(finished, 10);
  // 20 ms - 2 ms - 8 x 0.5 ms leaves about 140 prompt tokens a step.
  EXPECT_GT(most, 96);
  EXPECT_LT(most, 145);
}

TEST(PlanStepTest, TwoModelsShareTheTargetBetweenTheirPasses) {
  const StepCostModel prefill = Trained();
  StepCostModel decode;  // a decode pass three times as dear per row
  for (int i = 0; i < 100; ++i) {
    StepWork w;
    for (int r = 0; r < 1 + i % 16; ++r) w.AddDecodeRow(300);
    decode.Observe(w, 3e-3 + 1.5e-3 * double(w.decode_rows));
  }
  StepInput in;
  in.fused = false;
  in.tpot_target = 0.030;
  in.decode_rows = 10;  // 18 ms of decode
  for (int r = 0; r < 10; ++r) in.decode_attention += 300.5;
  in.prefill = {{0, 4096}};
  const StepPlan p = PlanStep(in, prefill, decode);
  ASSERT_TRUE(p.bounded);
  // 12 ms left for the prompt pass: (12 - 2) / 0.1 = 100 tokens, cut to 96.
  EXPECT_EQ(p.chunk[0], 96);
  EXPECT_LE(p.predicted_seconds, 0.030);
}

TEST(PlanStepTest, PromptsProgressWhateverTheTarget) {
  const StepCostModel m = Trained();
  StepInput in;
  in.fused = true;
  in.tpot_target = 1e-6;  // nothing fits
  in.decode_rows = 64;
  in.prefill = {{0, 100}, {0, 100}};
  const StepPlan p = PlanStep(in, m, m);
  EXPECT_EQ(p.chunk, (std::vector<int64_t>{16, 0}));
  EXPECT_TRUE(p.bounded);
}

TEST(PlanStepTest, APassOfItsOwnIsNeverSpentOnAHandfulOfTokens) {
  // A prompt model whose pass costs 10 ms before any token and 0.05 ms a
  // token: below 200 tokens a pass is mostly its fixed cost.
  StepCostModel prefill, decode;
  for (int i = 0; i < 200; ++i) {
    StepWork w;
    w.AddChunk(0, 16 * (1 + i % 32));
    prefill.Observe(w, 10e-3 + 0.05e-3 * double(w.prefill_tokens));
    StepWork d;
    for (int r = 0; r < 1 + i % 16; ++r) d.AddDecodeRow(100);
    decode.Observe(d, 5e-3 + 2e-3 * double(d.decode_rows));
  }
  StepInput in;
  in.fused = false;
  in.tpot_target = 0.030;
  in.decode_rows = 16;  // 37 ms of decode: the target leaves nothing
  for (int r = 0; r < 16; ++r) in.decode_attention += 100.5;
  in.prefill = {{0, 1000}};
  const StepPlan p = PlanStep(in, prefill, decode);
  EXPECT_TRUE(p.bounded);
  EXPECT_EQ(p.chunk[0], 208);  // 200 rounded up to whole blocks
  // Fused, the rows share the pass: one block is enough.
  StepCostModel both;
  for (int i = 0; i < 200; ++i) {
    StepWork w;
    for (int r = 0; r < 1 + i % 16; ++r) w.AddDecodeRow(100);
    if (i % 2) w.AddChunk(0, 16 * (1 + i % 32));
    both.Observe(w, 10e-3 + 2e-3 * double(w.decode_rows) + 0.05e-3 * double(w.prefill_tokens));
  }
  in.fused = true;
  EXPECT_EQ(PlanStep(in, both, both).chunk[0], 16);
}

TEST(PlanStepTest, BeforeAnyTimingABoundedStepTakesAFewBlocks) {
  const StepCostModel fresh;
  StepInput in;
  in.fused = true;
  in.tpot_target = 0.05;
  in.decode_rows = 2;
  in.prefill = {{0, 1000}};
  EXPECT_EQ(PlanStep(in, fresh, fresh).chunk[0], 64);
}

// A prompt pass with a large fixed cost (reading every weight; 50 ms) and
// 0.5 ms a token, as a W8A8 pass of its own is on some machines.
double DearPass(const StepWork& w) {
  return 50e-3 + 0.5e-3 * double(w.prefill_tokens) + 1e-9 * w.attention;
}

// The calibration's decode rows alone price a row and a decode attention
// pair: a worker knows a long-context step's cost before it serves one.
TEST(CalibrationTest, PricesDecodeRowsAndTheirAttention) {
  for (bool fused : {false, true}) {
    StepCostModel m;
    for (const policy::CalibrationPass& p : policy::CalibrationPasses(fused)) {
      const StepWork w = fused ? p.Work() : p.RowWork();
      if (w.decode_rows > 0) m.Calibrate(w, TrueCost(w));
    }
    for (int64_t context : {16, 300, 2000}) {
      StepWork w;
      for (int r = 0; r < 8; ++r) w.AddDecodeRow(context);
      EXPECT_NEAR(m.Predict(w), TrueCost(w), 0.01 * TrueCost(w)) << context << " " << fused;
    }
    EXPECT_NEAR(m.coefficients().per_decode_pair, 6e-9, 0.3e-9) << fused;
  }
}

TEST(CalibrationTest, TellsAPassesFixedCostFromItsCostPerToken) {
  StepCostModel m;
  for (const policy::CalibrationPass& p : policy::CalibrationPasses(/*fused=*/false)) {
    if (p.chunk == 0) continue;
    const StepWork w = p.PromptWork();
    m.Calibrate(w, DearPass(w));
  }
  StepWork chunk;
  chunk.AddChunk(0, 256);
  EXPECT_NEAR(m.Predict(StepWork{}), 50e-3, 2.5e-3);
  EXPECT_NEAR((m.Predict(chunk) - m.Predict(StepWork{})) / 256, 0.5e-3, 0.025e-3);
  // Then hours of identical bounded chunks (the steps least squares cannot
  // split by themselves) leave the split where it was.
  for (int i = 0; i < 20000; ++i) {
    StepWork w;
    w.AddChunk(16 * (i % 100), 48);
    m.Observe(w, DearPass(w));
  }
  EXPECT_NEAR(m.Predict(StepWork{}), 50e-3, 5e-3);
  EXPECT_NEAR((m.Predict(chunk) - m.Predict(StepWork{})) / 256, 0.5e-3, 0.05e-3);
}

TEST(CalibrationTest, NeedsTheKvItSays) {
  for (bool fused : {false, true}) {
    int64_t rows = 0, chunk = 0, context = 0;
    for (const policy::CalibrationPass& p : policy::CalibrationPasses(fused)) {
      rows = std::max(rows, p.rows);
      chunk = std::max(chunk, p.chunk);
      context = std::max(context, p.context);
    }
    // Every row's sequence (one token past its context while timed) and
    // the prompt's, in whole blocks.
    EXPECT_EQ(policy::CalibrationKvTokens(fused, 16),
              rows * ((context + 1 + 15) / 16 * 16) + (chunk + 15) / 16 * 16);
    EXPECT_GE(policy::CalibrationKvTokens(fused, 1), rows * (context + 1) + chunk);
  }
}

// A prompt share holds its proportion under a stream of long prompts: each
// bounded step's prompt work costs share / (1 - share) of the step's other
// work, within one block, and every prompt finishes.
void ExpectShareHolds(bool fused, const StepCostModel& prefill, const StepCostModel& decode,
                      double (*prompt_cost)(const StepWork&),
                      double (*rest_cost)(const StepWork&)) {
  std::vector<PrefillNeed> queue;
  int arrived = 0, finished = 0, bounded = 0;
  for (int64_t step = 0; step < 5000 && finished < 6; ++step) {
    if (step % 30 == 0 && arrived < 6) {
      queue.push_back({0, 2048});
      ++arrived;
    }
    StepInput in;
    in.fused = fused;
    in.prompt_share = 0.75;
    in.decode_rows = 6;
    for (int r = 0; r < 6; ++r) in.decode_attention += 300.5;
    in.prefill = queue;
    const StepPlan p = PlanStep(in, prefill, decode);
    StepWork rows, chunks;
    for (int r = 0; r < 6; ++r) rows.AddDecodeRow(300);
    for (size_t i = 0; i < queue.size(); ++i) {
      if (p.chunk[i] == 0) continue;
      chunks.AddChunk(queue[i].past, p.chunk[i]);
      queue[i].past += p.chunk[i];
      queue[i].remaining -= p.chunk[i];
    }
    // What the prompt tokens add to the step, against what the step costs
    // without them.
    const double rest = rest_cost(rows);
    const double prompt = prompt_cost(chunks);
    StepWork block;
    block.AddChunk(chunks.prefill_tokens, 16);
    const double one_block = prompt_cost(block);
    if (p.bounded) {
      ++bounded;
      EXPECT_NEAR(prompt, 3 * rest, one_block) << "step " << step;
      EXPECT_NEAR(p.target_seconds, 4 * rest, 0.05 * rest) << "step " << step;
    }
    finished += (int)std::erase_if(queue, [](const PrefillNeed& n) { return n.remaining == 0; });
  }
  EXPECT_EQ(finished, 6);
  EXPECT_GT(bounded, 20);
}

TEST(PlanStepTest, APromptShareHoldsItsProportionInOnePass) {
  // Fused: the rows' step (2 ms + 6 x 0.5 ms) is the rest; prompt tokens
  // at 0.1 ms each take three times that.
  ExpectShareHolds(
      /*fused=*/true, Trained(), Trained(),
      [](const StepWork& w) { return 0.1e-3 * double(w.prefill_tokens) + 1e-9 * w.attention; },
      [](const StepWork& w) { return TrueCost(w); });
}

TEST(PlanStepTest, APromptShareHoldsItsProportionBesideADecodePass) {
  // Two passes: the rest is the decode pass and the prompt pass's fixed
  // cost (50 ms), so a bounded step's prompt tokens cost three times both.
  StepCostModel prefill, decode;
  for (const policy::CalibrationPass& p : policy::CalibrationPasses(/*fused=*/false)) {
    if (p.chunk > 0) {
      const StepWork w = p.PromptWork();
      prefill.Calibrate(w, DearPass(w));
    }
    if (p.rows > 0) {
      const StepWork w = p.RowWork();
      decode.Calibrate(w, TrueCost(w));
    }
  }
  ExpectShareHolds(
      /*fused=*/false, prefill, decode,
      [](const StepWork& w) { return DearPass(w) - DearPass(StepWork{}); },
      [](const StepWork& w) { return TrueCost(w) + DearPass(StepWork{}); });
}

// ---- The scheduler, in-process ----------------------------------------------

class Collect : public TokenStream {
 public:
  void Send(const std::vector<int32_t>& ids, const std::string&) override {
    std::lock_guard lock(mu_);
    tokens.insert(tokens.end(), ids.begin(), ids.end());
  }
  void Finish(const absl::Status& st, const Summary&) override {
    status = st;
    done.Notify();
  }
  int64_t Unsent() const override { return 0; }
  bool Cancelled() const override { return false; }
  std::mutex mu_;
  std::vector<int32_t> tokens;
  absl::Status status;
  absl::Notification done;
};

struct Served {
  std::vector<std::vector<int32_t>> answers;
  int64_t max_prefill_with_decode = 0, bounded_steps = 0;
  std::string calibration;
};

// Four streams decode while long prompts arrive, on one synthetic model
// (fused steps) or a W8A8 prompt model beside it (two passes).
Served Serve(absl::Duration target, bool two_models, double share = 0) {
  testing::TestModel decode = testing::LoadOrDie("synthetic:tiny", 1);
  testing::TestModel prefill = testing::LoadOrDie("synthetic:tiny@w8a8", 1);
  SchedulerOptions o;
  o.tpot_target = target;
  o.prompt_share = share;
  o.calibrate_step_costs = share > 0;
  o.prefix_cache = false;
  // The long prompts are sent from the step observer, on the scheduler's
  // thread, at the second decode step: a test thread polling for it may
  // wake, on a loaded machine, after the short streams have ended.
  std::mutex mu;
  std::vector<std::shared_ptr<Collect>> streams;  // guarded by mu
  absl::Notification prompts_sent;
  Scheduler* sched_ptr = nullptr;
  int64_t decode_steps = 0;
  const int vocab = decode->config().vocab_size;
  auto start = [&](int n, int salt, int max_tokens) {  // mu held
    GenerationParams p;
    p.request_id = absl::StrCat("r", salt);
    p.max_tokens = max_tokens;
    p.ignore_eos = true;
    auto s = std::make_shared<Collect>();
    streams.push_back(s);
    sched_ptr->Generate(testing::Tokens(n, vocab, salt), p, s);
  };
  o.step_observer = [&](const worker::StepTrace& t) {
    std::lock_guard lock(mu);
    if (t.rows.empty() || ++decode_steps != 2) return;
    for (int i = 0; i < 3; ++i) start(400, 10 + i, 4);
    prompts_sent.Notify();
  };
  auto kv = decode.ctx->NewKvCache(1 << 14);
  EXPECT_TRUE(kv.ok());
  Served run;
  {
    Scheduler sched(o, two_models ? prefill.ctx.get() : decode.ctx.get(), decode.ctx.get(),
                    std::move(*kv), nullptr);
    sched_ptr = &sched;
    run.calibration = sched.calibration();
    {
      // Long enough answers that they still decode when the prompts arrive.
      std::lock_guard lock(mu);
      for (int i = 0; i < 4; ++i) start(8, i, 480);
    }
    prompts_sent.WaitForNotification();
    std::vector<std::shared_ptr<Collect>> all;
    {
      std::lock_guard lock(mu);
      all = streams;
    }
    for (auto& s : all) {
      s->done.WaitForNotification();
      EXPECT_TRUE(s->status.ok()) << s->status;
      run.answers.push_back(s->tokens);
    }
    run.max_prefill_with_decode = sched.step_stats().max_prefill_tokens_with_decode.load();
    run.bounded_steps = sched.step_stats().bounded_steps.load();
  }
  return run;
}

TEST(SchedulerStepsTest, ATightTargetLeavesOneBlockOfPromptPerDecodeStep) {
  // 1 us fits no prompt work: every step that decodes takes one KV block.
  const Served tight = Serve(absl::Microseconds(1), /*two_models=*/false);
  EXPECT_LE(tight.max_prefill_with_decode, 16);
  EXPECT_GT(tight.bounded_steps, 0);
  // Without a target the long prompts run whole beside the decoding streams,
  // and chunking changes no answer.
  const Served off = Serve(absl::ZeroDuration(), /*two_models=*/false);
  EXPECT_GE(off.max_prefill_with_decode, 400);
  EXPECT_EQ(off.bounded_steps, 0);
  EXPECT_EQ(tight.answers, off.answers);
}

TEST(SchedulerStepsTest, TwoPrecisionsInOneProcessHoldTheSameRule) {
  // The prompt pass of its own takes at least what its fixed cost is worth
  // (measured on this machine, so no fixed count here: PlanStepTest checks
  // the rule); prompts interleave with the decode pass, and answers do not
  // change.
  const Served tight = Serve(absl::Microseconds(1), /*two_models=*/true);
  const Served off = Serve(absl::ZeroDuration(), /*two_models=*/true);
  EXPECT_GE(off.max_prefill_with_decode, 400);
  EXPECT_EQ(tight.answers, off.answers);
}

TEST(SchedulerStepsTest, ACalibratedShareChangesNoAnswer) {
  // The calibration passes run on the serving KV cache before the first
  // request and leave nothing behind: the answers are those of unbounded
  // steps, with one model or two.
  for (bool two_models : {false, true}) {
    SCOPED_TRACE(two_models ? "two models" : "one model");
    const Served share = Serve(absl::ZeroDuration(), two_models, 0.75);
    const Served off = Serve(absl::ZeroDuration(), two_models);
    EXPECT_NE(share.calibration.find(two_models ? "prompt pass" : "one pass"), std::string::npos)
        << share.calibration;
    EXPECT_EQ(off.calibration, "");
    EXPECT_EQ(share.answers, off.answers);
  }
}

TEST(SchedulerStepsTest, AWorkerThatPrefillsKnowsItsRateBeforeItsFirstPrompt) {
  // The router's admission predicts time to first token from this rate: a
  // worker measures it on one prompt before serving, and leaves no KV held.
  testing::TestModel decode = testing::LoadOrDie("synthetic:tiny", 1);
  testing::TestModel prefill = testing::LoadOrDie("synthetic:tiny@w8a8", 1);
  SchedulerOptions o;
  o.prefix_cache = false;
  for (bool two_models : {false, true}) {
    SCOPED_TRACE(two_models ? "two models" : "one model");
    auto kv = decode.ctx->NewKvCache(1 << 12);
    ASSERT_TRUE(kv.ok());
    Scheduler sched(o, two_models ? prefill.ctx.get() : decode.ctx.get(), decode.ctx.get(),
                    std::move(*kv), nullptr);
    const SchedulerLoad l = sched.load();
    EXPECT_GT(l.prefill_tokens_per_second, 0);
    EXPECT_EQ(l.kv_blocks_free, l.kv_blocks_total);
  }
  // A KV cache too small for the prompt: not measured, and still serving.
  auto small = decode.ctx->NewKvCache(64);
  ASSERT_TRUE(small.ok());
  Scheduler sched(o, decode.ctx.get(), decode.ctx.get(), std::move(*small), nullptr);
  EXPECT_EQ(sched.load().prefill_tokens_per_second, 0);
  GenerationParams p;
  p.request_id = "after";
  p.max_tokens = 4;
  p.ignore_eos = true;
  auto out = std::make_shared<Collect>();
  sched.Generate(testing::Tokens(8, decode->config().vocab_size, 1), p, out);
  out->done.WaitForNotification();
  EXPECT_TRUE(out->status.ok()) << out->status;
  EXPECT_EQ(out->tokens.size(), 4u);
}

}  // namespace
}  // namespace pdq::worker
