// eval/code_eval.h: HumanEval's format is read strictly; solutions are
// scored token by token across a prefill/decode split; greedy completions
// equal the engine's own greedy generation and do not depend on the batch;
// and a completion is a pass only when its tests pass in the sandbox: one
// that opens a socket or runs past its limits is stopped and counted as a
// failure.
#include "eval/code_eval.h"

#include "engine/generate.h"
#include "engine/sampler.h"
#include "eval/perplexity.h"
#include "gtest/gtest.h"
#include "tests/test_models.h"

namespace pdq {
namespace {

using testing::LoadOrDie;

// Two problems in HumanEval's shape, with real tests.
const char kProblems[] =
    R"({"task_id": "T/0", "prompt": "def add(a, b):\n    \"\"\"Sum of a and b.\"\"\"\n", )"
    R"("canonical_solution": "    return a + b\n", )"
    R"("test": "def check(candidate):\n    assert candidate(2, 3) == 5\n", "entry_point": "add"})"
    "\n\n"
    R"({"task_id": "T/1", "prompt": "def first(xs):\n", )"
    R"("canonical_solution": "    return xs[0]\n", )"
    R"("test": "def check(candidate):\n    assert candidate([7, 8]) == 7\n", )"
    R"("entry_point": "first"})"
    "\n";

TEST(CodeEvalTest, ParsesHumanEvalLinesAndNamesTheBadOne) {
  auto problems = ParseCodeProblems(kProblems);
  ASSERT_TRUE(problems.ok()) << problems.status();
  ASSERT_EQ(problems->size(), 2u);
  EXPECT_EQ((*problems)[1].task_id, "T/1");
  EXPECT_EQ((*problems)[1].entry_point, "first");
  EXPECT_EQ((*problems)[0].solution, "    return a + b\n");

  for (const std::string& bad :
       {std::string(kProblems) + "{not json\n",
        std::string(kProblems) + R"({"task_id": "x", "prompt": "p", "test": "t"})" + "\n",
        std::string(kProblems) + R"({"task_id": "x", "prompt": 3, "canonical_solution": "",)" +
            R"( "test": "t", "entry_point": "f"})" + "\n"}) {
    auto r = ParseCodeProblems(bad);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("line 4"), std::string::npos) << r.status();
  }
  EXPECT_EQ(ParseCodeProblems("\n \n").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CodeEvalTest, TheCanonicalCompletionContinuesTheStrippedPrompt) {
  auto problems = ParseCodeProblems(kProblems);
  ASSERT_TRUE(problems.ok());
  const CodeProblem& p = (*problems)[0];
  EXPECT_EQ(CodePromptHead(p.prompt), "def add(a, b):\n    \"\"\"Sum of a and b.\"\"\"");
  EXPECT_EQ(CodePromptHead(p.prompt) + CanonicalCompletion(p), p.prompt + p.solution);
  EXPECT_EQ(CodeTestProgram(p, CanonicalCompletion(p)),
            p.prompt + p.solution + "\n\n" + p.test + "\n\ncheck(add)\n");
}

class CodeSandboxTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (system("command -v python3 >/dev/null 2>&1") != 0) GTEST_SKIP() << "no python3";
    auto problems = ParseCodeProblems(kProblems);
    ASSERT_TRUE(problems.ok());
    problem_ = (*problems)[0];
  }
  // Skips where no sandbox can be made here.
  SandboxResult Run(const std::string& completion, SandboxLimits limits = {}) {
    absl::StatusOr<SandboxResult> r = RunCodeTests(problem_, completion, limits);
    if (!r.ok() && r.status().code() == absl::StatusCode::kFailedPrecondition) {
      skipped_ = std::string(r.status().message());
      return {};
    }
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : SandboxResult{};
  }
  CodeProblem problem_;
  std::string skipped_;
};

TEST_F(CodeSandboxTest, OnlyCodeThatPassesItsTestsCounts) {
  const SandboxResult good = Run(CanonicalCompletion(problem_));
  if (!skipped_.empty()) GTEST_SKIP() << skipped_;
  EXPECT_TRUE(good.passed()) << good.output;
  const SandboxResult wrong = Run("\n    return a - b\n");
  EXPECT_FALSE(wrong.passed());
  EXPECT_NE(wrong.output.find("AssertionError"), std::string::npos) << wrong.output;
  const SandboxResult syntax = Run("\n    return (a +\n");
  EXPECT_FALSE(syntax.passed());
}

TEST_F(CodeSandboxTest, ACompletionThatReachesForTheNetworkFails) {
  // It returns the right answer only if a connection (to anything) works.
  const SandboxResult r =
      Run("\n    import socket\n"
          "    s = socket.create_connection(('1.1.1.1', 53), timeout=2)\n"
          "    return a + b\n");
  if (!skipped_.empty()) GTEST_SKIP() << skipped_;
  EXPECT_FALSE(r.passed());
  EXPECT_EQ(r.outcome, SandboxResult::Outcome::kFailed) << r.output;
  EXPECT_NE(r.output.find("OSError"), std::string::npos) << r.output;
}

TEST_F(CodeSandboxTest, ACompletionPastItsLimitsIsStoppedAndFails) {
  SandboxLimits limits;
  limits.cpu_seconds = 1;
  limits.wall = absl::Seconds(3);
  const SandboxResult spin = Run("\n    while True:\n        pass\n", limits);
  if (!skipped_.empty()) GTEST_SKIP() << skipped_;
  EXPECT_FALSE(spin.passed());
  EXPECT_EQ(spin.outcome, SandboxResult::Outcome::kKilled);
  const SandboxResult sleep = Run("\n    import time\n    time.sleep(60)\n", limits);
  EXPECT_FALSE(sleep.passed());
  EXPECT_EQ(sleep.outcome, SandboxResult::Outcome::kTimedOut);
  EXPECT_LT(sleep.seconds, 10);
}

// The prompt is read by the prefill model, the solution by the decode
// model from that KV cache, and KL is taken against the reference: done
// here by hand with three different precisions, so a swap would show.
TEST(CodeEvalTest, ScoringReadsThePromptAtPrefillAndTheSolutionAtDecode) {
  auto prefill = LoadOrDie("synthetic:tiny@w8a8");
  auto decode = LoadOrDie("synthetic:tiny@w4a16");
  auto reference = LoadOrDie("synthetic:tiny");
  ASSERT_TRUE(prefill && decode && reference);
  auto problems = ParseCodeProblems(kProblems);
  ASSERT_TRUE(problems.ok());
  SolutionScoreOptions o;
  o.decode = decode.ctx.get();
  o.kl_reference = reference.ctx.get();
  auto s = ScoreSolutions(*prefill.ctx, *problems, o);
  ASSERT_TRUE(s.ok()) << s.status();

  const Tokenizer& tok = prefill->tokenizer();
  const int vocab = prefill->config().vocab_size;
  double nll = 0, kl = 0;
  int64_t n = 0, agree = 0;
  for (const CodeProblem& p : *problems) {
    const std::vector<int32_t> head = tok.Encode(CodePromptHead(p.prompt), tok.add_bos(), false);
    const std::vector<int32_t> sol = tok.EncodeContinuation(CanonicalCompletion(p));
    std::vector<int32_t> all = head;
    all.insert(all.end(), sol.begin(), sol.end() - 1);
    // Split: the head at W8A8 (its last row predicts sol[0]), then the
    // solution but its last token at W4A16 over the same cache.
    auto kv = prefill->NewKvCache(256);
    ASSERT_TRUE(kv.ok());
    const SeqId seq = (*kv)->AddSequence();
    BatchEntry e1{seq, head, 1};
    Logits first, rest;
    ASSERT_TRUE(prefill.ctx->ForwardAll(**kv, {&e1, 1}, &first).ok());
    const std::span<const int32_t> body(sol.data(), sol.size() - 1);
    BatchEntry e2{seq, body, (int64_t)body.size()};
    ASSERT_TRUE(decode.ctx->ForwardAll(**kv, {&e2, 1}, &rest).ok());
    // The reference reads everything itself.
    auto rkv = reference->NewKvCache(256);
    ASSERT_TRUE(rkv.ok());
    BatchEntry er{(*rkv)->AddSequence(), all, (int64_t)sol.size()};
    Logits ref;
    ASSERT_TRUE(reference.ctx->ForwardAll(**rkv, {&er, 1}, &ref).ok());
    for (size_t j = 0; j < sol.size(); ++j) {
      const float* row = j == 0 ? first.Row(0, 0) : rest.Row(0, j - 1);
      nll += TokenNll(row, vocab, sol[j]);
      kl += KlFromLogits(ref.Row(0, j), row, vocab);
      agree += Argmax(ref.Row(0, j), vocab) == Argmax(row, vocab);
    }
    n += (int64_t)sol.size();
  }
  EXPECT_EQ(s->tokens_scored, n);
  EXPECT_NEAR(s->nll_mean, nll / (double)n, 1e-9);
  ASSERT_TRUE(s->has_kl);
  EXPECT_NEAR(s->kl_mean, kl / (double)n, 1e-9);
  EXPECT_GT(s->kl_mean, 1e-6) << "W8A8/W4A16 should differ from FP16 here";
  EXPECT_DOUBLE_EQ(s->top1_agreement, (double)agree / (double)n);

  EXPECT_EQ(ScoreSolutions(*prefill.ctx, {}, o).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Greedy decoding by hand: the first token from the prefill model's logits,
// each later one from the decode model's.
std::vector<int32_t> ByHand(Context& prefill, Context& decode, const std::vector<int32_t>& prompt,
                            int max_tokens) {
  const int vocab = prefill.model().config().vocab_size;
  auto kv = prefill.model().NewKvCache(256);
  EXPECT_TRUE(kv.ok());
  const SeqId seq = (*kv)->AddSequence();
  BatchEntry e{seq, prompt, 1};
  Logits l;
  EXPECT_TRUE(prefill.ForwardAll(**kv, {&e, 1}, &l).ok());
  std::vector<int32_t> out = {Argmax(l.Row(0, 0), vocab)};
  while ((int)out.size() < max_tokens &&
         !prefill.model().tokenizer().IsEndOfGeneration(out.back())) {
    BatchEntry step{seq, {&out.back(), 1}, 1};
    EXPECT_TRUE(decode.ForwardAll(**kv, {&step, 1}, &l).ok());
    out.push_back(Argmax(l.Row(0, 0), vocab));
  }
  if (prefill.model().tokenizer().IsEndOfGeneration(out.back())) out.pop_back();
  return out;
}

TEST(CodeEvalTest, GreedyCompletionsFollowThePrefillThenTheDecodeModel) {
  auto prefill = LoadOrDie("synthetic:tiny@w8a8");
  auto decode = LoadOrDie("synthetic:tiny@w4a16");
  ASSERT_TRUE(prefill && decode);
  const Tokenizer& tok = prefill->tokenizer();
  const std::vector<std::string> prompts = {"def f(x):\n", "abc", "class A:\n  pass\n", "x = 1"};
  CompletionOptions o;
  o.max_tokens = 12;
  o.stop.clear();
  o.batch = 1;
  auto one = CompleteGreedy(*prefill.ctx, *decode.ctx, prompts, o);
  ASSERT_TRUE(one.ok()) << one.status();
  o.batch = 4;  // W4A16 decode steps are batch-invariant
  auto four = CompleteGreedy(*prefill.ctx, *decode.ctx, prompts, o);
  ASSERT_TRUE(four.ok()) << four.status();
  int swapped_differs = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ((*one)[i].text, (*four)[i].text) << i;
    const std::vector<int32_t> ids = tok.Encode(prompts[i], tok.add_bos(), false);
    const std::vector<int32_t> want = ByHand(*prefill.ctx, *decode.ctx, ids, 12);
    EXPECT_EQ((*one)[i].text, *tok.Decode(want)) << i;
    EXPECT_EQ((*one)[i].stop_reason, want.size() == 12u ? "max_tokens" : "eos") << i;
    swapped_differs += want != ByHand(*decode.ctx, *prefill.ctx, ids, 12);
  }
  EXPECT_GT(swapped_differs, 0) << "the check cannot tell prefill from decode here";

  // With one model, the same as the engine's own greedy generation.
  o.batch = 2;
  auto same = CompleteGreedy(*decode.ctx, *decode.ctx, prompts, o);
  ASSERT_TRUE(same.ok());
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerateOptions g;
    g.max_tokens = 12;
    auto r = Generate(*decode.ctx, tok.Encode(prompts[i], tok.add_bos(), false), g);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ((*same)[i].text, r->text) << i;
  }

  // A stop sequence cuts the text before it and ends that completion only.
  const std::string& text = (*one)[0].text;
  ASSERT_GE(text.size(), 4u);
  o.stop = {text.substr(2, 2)};
  auto cut = CompleteGreedy(*prefill.ctx, *decode.ctx, prompts, o);
  ASSERT_TRUE(cut.ok());
  EXPECT_EQ((*cut)[0].stop_reason, "stop_sequence");
  EXPECT_EQ((*cut)[0].text, text.substr(0, text.find(o.stop[0])));
  EXPECT_LE((*cut)[0].tokens, (*one)[0].tokens);

  o.stop = {""};
  EXPECT_EQ(CompleteGreedy(*prefill.ctx, *decode.ctx, prompts, o).status().code(),
            absl::StatusCode::kInvalidArgument);
  o.stop.clear();
  o.max_tokens = 0;
  EXPECT_EQ(CompleteGreedy(*prefill.ctx, *decode.ctx, prompts, o).status().code(),
            absl::StatusCode::kInvalidArgument);
  o.max_tokens = 1 << 20;
  EXPECT_EQ(CompleteGreedy(*prefill.ctx, *decode.ctx, prompts, o).status().code(),
            absl::StatusCode::kOutOfRange);
  auto other = LoadOrDie("synthetic:tiny-qwen2");
  o.max_tokens = 4;
  EXPECT_EQ(CompleteGreedy(*prefill.ctx, *other.ctx, prompts, o).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pdq
