// Batch formation (policy/batch.h) on its own: the rules the worker's
// scheduler and the simulator share.
#include <string>

#include "gtest/gtest.h"
#include "policy/batch.h"

namespace pdq::policy {
namespace {

using Stage = StreamView::Stage;

StreamView Decoding(int64_t kv) { return {Stage::kDecoding, false, 0, kv, kv}; }
StreamView Prompt(int64_t tokens, bool batch = false, int64_t prefilled = 0) {
  return {Stage::kPrompt, batch, prefilled, tokens, 0};
}

TEST(FormStepTest, RowsAreTheDecodingStreamsInOrderUpToTheBatchSize) {
  std::vector<StreamView> s = {Decoding(10), Prompt(40), {}, Decoding(20), Decoding(30)};
  BatchOptions o;
  o.max_decode_batch = 2;
  const StepComposition c = FormStep(s, o, StepCostModel(), StepCostModel());
  EXPECT_EQ(c.rows, (std::vector<size_t>{0, 3}));
  EXPECT_EQ(c.prompts, (std::vector<size_t>{1}));
  EXPECT_EQ(c.chunk, (std::vector<int64_t>{40}));
  EXPECT_EQ(c.plan.prefill_tokens, 40);
}

TEST(FormStepTest, InteractivePromptsComeFirstEachInArrivalOrder) {
  std::vector<StreamView> s = {Prompt(100, true), Prompt(50), Prompt(70, true), Prompt(60)};
  BatchOptions o;
  o.token_budget = 130;
  const StepComposition c = FormStep(s, o, StepCostModel(), StepCostModel());
  EXPECT_EQ(c.prompts, (std::vector<size_t>{1, 3, 0, 2}));
  // The budget: both interactive prompts whole, 20 tokens of the next.
  EXPECT_EQ(c.chunk, (std::vector<int64_t>{50, 60, 20, 0}));
}

TEST(FormStepTest, NothingToDoIsAnEmptyStep) {
  std::vector<StreamView> s = {{}, {}};
  EXPECT_TRUE(FormStep(s, {}, StepCostModel(), StepCostModel()).empty());
}

TEST(FormStepTest, AChunkContinuesWhereThePromptStopped) {
  std::vector<StreamView> s = {Prompt(100, false, 64)};
  const StepComposition c = FormStep(s, {}, StepCostModel(), StepCostModel());
  EXPECT_EQ(c.chunk, (std::vector<int64_t>{36}));
}

TEST(FormStepTest, TheTargetAndTheModelsReachThePlan) {
  // A machine whose pass costs 1 ms + 0.1 ms a prompt token: with decode
  // rows and a 5 ms target, a fused step takes what fits (a multiple of the
  // block), a step of two models leaves the decode pass its time too.
  StepCostModel cost;
  for (int i = 0; i < 300; ++i) {
    StepWork w;
    w.AddChunk(0, 16 * (1 + i % 16));
    if (i % 2) w.AddDecodeRow(100);
    cost.Observe(w, 1e-3 + 1e-4 * double(w.prefill_tokens) + 1e-4 * double(w.decode_rows));
  }
  std::vector<StreamView> s = {Decoding(100), Prompt(1000)};
  BatchOptions o;
  o.tpot_target = 5e-3;
  const StepComposition fused = FormStep(s, o, cost, cost);
  EXPECT_TRUE(fused.plan.bounded);
  EXPECT_EQ(fused.chunk[0] % 16, 0);
  EXPECT_GE(fused.chunk[0], 16);
  EXPECT_LE(fused.chunk[0], 40);
  o.fused = false;
  const StepComposition two = FormStep(s, o, cost, cost);
  EXPECT_TRUE(two.plan.bounded);
  EXPECT_LT(two.chunk[0], fused.chunk[0] + 1);
  o.tpot_target = 0;
  EXPECT_EQ(FormStep(s, o, cost, cost).chunk[0], 1000);
}

TEST(RanToBackTest, TheStreamsThatRanGoToTheBackInOrder) {
  std::vector<std::string> v = {"a", "b", "c", "d", "e"};
  const std::vector<size_t> rows = {1, 3};
  RanToBack(v, rows);
  EXPECT_EQ(v, (std::vector<std::string>{"a", "c", "e", "b", "d"}));
  RanToBack(v, std::vector<size_t>{});
  EXPECT_EQ(v, (std::vector<std::string>{"a", "c", "e", "b", "d"}));
  RanToBack(v, std::vector<size_t>{0, 1, 2, 3, 4});
  EXPECT_EQ(v, (std::vector<std::string>{"a", "c", "e", "b", "d"}));
}

}  // namespace
}  // namespace pdq::policy
