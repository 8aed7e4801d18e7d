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
