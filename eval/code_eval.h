// Accuracy on code, HumanEval's way, under a prefill/decode precision pair:
// - the perplexity of each problem's reference solution given its prompt
//   (prompt prefilled by the prefill model, the solution read by the decode
//   model from that KV cache), with KL and top-1 agreement against a
//   reference model on the same positions;
// - greedy completions (the prompt prefilled and the first token chosen by
//   the prefill model, the rest decoded by the decode model, cut at
//   HumanEval's stop sequences), each run against the problem's tests in
//   the sandbox (eval/sandbox.h): pass@1.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/context.h"
#include "eval/sandbox.h"

namespace pdq {

struct CodeProblem {
  std::string task_id;
  std::string prompt;       // a function signature and docstring
  std::string solution;     // the canonical body that completes the prompt
  std::string test;         // defines check(candidate)
  std::string entry_point;  // the function check() is given
};

// HumanEval's JSONL: one object per line with task_id, prompt,
// canonical_solution, test and entry_point (strings). InvalidArgument
// naming the line for anything else; an empty file is an error.
absl::StatusOr<std::vector<CodeProblem>> ParseCodeProblems(const std::string& jsonl);

struct SolutionScoreOptions {
  Context* decode = nullptr;        // reads the solution; the prefill model when null
  Context* kl_reference = nullptr;  // also KL divergence and top-1 agreement
  // Called after each problem with (problems done, problems total).
  std::function<void(int64_t, int64_t)> progress;
};

struct SolutionScore {
  double ppl = 0;
  double nll_mean = 0;  // per solution token
  int64_t tokens_scored = 0;
  bool has_kl = false;
  double kl_mean = 0;
  double top1_agreement = 0;
};

// The prompt is encoded as a text of its own (with BOS when the model adds
// one) and the solution after it, so every solution token is scored,
// including the first. InvalidArgument for mismatched models, OutOfRange
// when a prompt and its solution exceed the context.
absl::StatusOr<SolutionScore> ScoreSolutions(Context& prefill,
                                             const std::vector<CodeProblem>& problems,
                                             const SolutionScoreOptions& options);

// HumanEval's stop sequences: a completion ends where the function ends.
std::vector<std::string> DefaultCodeStops();

struct CompletionOptions {
  int max_tokens = 256;
  std::vector<std::string> stop = DefaultCodeStops();
  int batch = 16;              // prompts decoded together
  bool parse_special = false;  // prompts hold control tokens (a chat template)
  // Called after each batch with (prompts done, prompts total).
  std::function<void(int64_t, int64_t)> progress;
};

struct Completion {
  std::string text;         // cut before the first stop sequence
  int64_t tokens = 0;       // generated, up to and including where it stopped
  std::string stop_reason;  // "stop_sequence", "eos" or "max_tokens"
};

// Greedy completions: `prefill` reads each prompt and picks the first token,
// `decode` continues from its KV cache. Deterministic; with a W4A16 or W8A8
// decode model loaded batch-invariant (`--batch-invariant`: decode steps of
// up to 64 rows on the int16 kernels, tests/forward_test.cc) the batch size
// does not change them either. By default, on CPUs with AMX-BF16, steps of
// 16 rows or more take the bf16 tiles, so a completion can differ in
// near-ties with its batch-mates, as FP16's can. InvalidArgument for an
// empty stop sequence.
absl::StatusOr<std::vector<Completion>> CompleteGreedy(Context& prefill, Context& decode,
                                                       const std::vector<std::string>& prompts,
                                                       const CompletionOptions& options);

// The prompt without its trailing whitespace: completions continue from
// here, and a solution is scored from here (the prompt's final newline is
// the solution's first character). A vocabulary that merges a newline with
// the next line's indent would otherwise be asked to continue from a token
// boundary its training text never had; bigcode's harness strips them too.
std::string CodePromptHead(const std::string& prompt);

// The canonical solution as a completion of CodePromptHead: the prompt's
// trailing whitespace, then the solution.
std::string CanonicalCompletion(const CodeProblem& problem);

// The program run for a completion: CodePromptHead, the completion, the
// tests, and check(entry_point).
std::string CodeTestProgram(const CodeProblem& problem, const std::string& completion);

// Runs CodeTestProgram with `python` (a path, or a name in /usr/bin or
// /bin) reading it from stdin, in the sandbox. A sandbox that cannot be set
// up is an error, never a failed test.
absl::StatusOr<SandboxResult> RunCodeTests(const CodeProblem& problem,
                                           const std::string& completion,
                                           const SandboxLimits& limits,
                                           const std::string& python = "python3");

}  // namespace pdq
