// HumanEval-style scoring and greedy completion over a split KV cache, and
// running a completion's tests in the sandbox.
#include "eval/code_eval.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "engine/sampler.h"
#include "eval/perplexity.h"
#include "nlohmann/json.hpp"

namespace pdq {
namespace {

// Where CodePromptHead ends.
size_t HeadLength(const std::string& prompt) {
  const size_t last = prompt.find_last_not_of(" \t\r\n");
  return last == std::string::npos ? 0 : last + 1;
}

// Appends `tokens` to `seq`, with logits for the last `rows` of them (each
// row predicts the token after its own).
absl::Status Append(Context& ctx, KvCache& kv, SeqId seq, std::span<const int32_t> tokens,
                    int64_t rows, Logits* logits) {
  BatchEntry e{seq, tokens, rows, /*prompt=*/true};
  return ctx.ForwardAll(kv, {&e, 1}, logits);
}

}  // namespace

absl::StatusOr<std::vector<CodeProblem>> ParseCodeProblems(const std::string& jsonl) {
  std::vector<CodeProblem> problems;
  size_t line_no = 0, begin = 0;
  while (begin < jsonl.size()) {
    size_t end = jsonl.find('\n', begin);
    if (end == std::string::npos) end = jsonl.size();
    const std::string line = jsonl.substr(begin, end - begin);
    begin = end + 1;
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat("line ", line_no, " is not a JSON object"));
    }
    CodeProblem p;
    const std::pair<const char*, std::string*> fields[] = {{"task_id", &p.task_id},
                                                           {"prompt", &p.prompt},
                                                           {"canonical_solution", &p.solution},
                                                           {"test", &p.test},
                                                           {"entry_point", &p.entry_point}};
    for (const auto& [key, out] : fields) {
      auto it = j.find(key);
      if (it == j.end() || !it->is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat("line ", line_no, ": \"", key, "\" is missing or not a string"));
      }
      *out = it->get<std::string>();
    }
    if (p.entry_point.empty() || p.prompt.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("line ", line_no, " (", p.task_id, "): empty prompt or entry_point"));
    }
    problems.push_back(std::move(p));
  }
  if (problems.empty()) return absl::InvalidArgumentError("no problems in the file");
  return problems;
}

absl::StatusOr<SolutionScore> ScoreSolutions(Context& prefill,
                                             const std::vector<CodeProblem>& problems,
                                             const SolutionScoreOptions& options) {
  const Model& model = prefill.model();
  Context& decode = options.decode ? *options.decode : prefill;
  PDQ_RETURN_IF_ERROR(CheckCompatible(model, decode.model(), "decode"));
  if (options.kl_reference) {
    PDQ_RETURN_IF_ERROR(CheckCompatible(model, options.kl_reference->model(), "reference", false));
  }
  if (problems.empty()) return absl::InvalidArgumentError("no problems to score");
  const Tokenizer& tok = model.tokenizer();
  const int vocab = model.config().vocab_size;
  std::vector<std::vector<int32_t>> prompts, solutions;
  int64_t longest = 0;
  for (const CodeProblem& p : problems) {
    prompts.push_back(tok.Encode(CodePromptHead(p.prompt), tok.add_bos(), /*parse_special=*/false));
    solutions.push_back(tok.EncodeContinuation(CanonicalCompletion(p)));
    if (prompts.back().empty() || solutions.back().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(p.task_id, ": the prompt or the solution has no tokens"));
    }
    const int64_t len = (int64_t)(prompts.back().size() + solutions.back().size());
    if (len > model.config().max_context) {
      return absl::OutOfRangeError(absl::StrCat(
          p.task_id, ": ", len, " tokens exceed the context of ", model.config().max_context));
    }
    longest = std::max(longest, len);
  }
  PDQ_ASSIGN_OR_RETURN(std::unique_ptr<KvCache> kv,
                       model.NewKvCache(model.kv_layout().SequenceTokens(longest)));
  std::unique_ptr<KvCache> ref_kv;
  if (options.kl_reference) {
    PDQ_ASSIGN_OR_RETURN(ref_kv, options.kl_reference->model().NewKvCache(
                                     model.kv_layout().SequenceTokens(longest)));
  }
  SolutionScore score;
  score.has_kl = options.kl_reference != nullptr;
  double nll = 0, kl = 0;
  int64_t agree = 0;
  Logits first, rest, ref_first, ref_rest;
  for (size_t i = 0; i < problems.size(); ++i) {
    const std::vector<int32_t>& s = solutions[i];
    const auto body = std::span<const int32_t>(s).first(s.size() - 1);
    // The prefill model predicts the first solution token; the decode model
    // the others, reading the prompt's KV from the prefill.
    const SeqId seq = kv->AddSequence();
    PDQ_RETURN_IF_ERROR(Append(prefill, *kv, seq, prompts[i], 1, &first));
    if (!body.empty()) PDQ_RETURN_IF_ERROR(Append(decode, *kv, seq, body, body.size(), &rest));
    PDQ_RETURN_IF_ERROR(kv->RemoveSequence(seq));
    if (ref_kv) {
      const SeqId rs = ref_kv->AddSequence();
      PDQ_RETURN_IF_ERROR(Append(*options.kl_reference, *ref_kv, rs, prompts[i], 1, &ref_first));
      if (!body.empty()) {
        PDQ_RETURN_IF_ERROR(
            Append(*options.kl_reference, *ref_kv, rs, body, body.size(), &ref_rest));
      }
      PDQ_RETURN_IF_ERROR(ref_kv->RemoveSequence(rs));
    }
    for (size_t j = 0; j < s.size(); ++j) {
      const float* row = j == 0 ? first.Row(0, 0) : rest.Row(0, j - 1);
      nll += TokenNll(row, vocab, s[j]);
      if (ref_kv) {
        const float* ref = j == 0 ? ref_first.Row(0, 0) : ref_rest.Row(0, j - 1);
        kl += KlFromLogits(ref, row, vocab);
        agree += Argmax(ref, vocab) == Argmax(row, vocab);
      }
    }
    score.tokens_scored += (int64_t)s.size();
    if (options.progress) options.progress((int64_t)i + 1, (int64_t)problems.size());
  }
  score.nll_mean = nll / (double)score.tokens_scored;
  score.ppl = std::exp(score.nll_mean);
  if (score.has_kl) {
    score.kl_mean = kl / (double)score.tokens_scored;
    score.top1_agreement = (double)agree / (double)score.tokens_scored;
  }
  return score;
}

std::vector<std::string> DefaultCodeStops() {
  return {"\nclass", "\ndef", "\n#", "\nif", "\nprint", "\n```"};
}

absl::StatusOr<std::vector<Completion>> CompleteGreedy(Context& prefill, Context& decode,
                                                       const std::vector<std::string>& prompts,
                                                       const CompletionOptions& options) {
  const Model& model = prefill.model();
  PDQ_RETURN_IF_ERROR(CheckCompatible(model, decode.model(), "decode"));
  if (options.max_tokens < 1) return absl::InvalidArgumentError("max tokens must be >= 1");
  if (options.batch < 1) return absl::InvalidArgumentError("batch must be >= 1");
  for (const std::string& stop : options.stop) {
    if (stop.empty()) return absl::InvalidArgumentError("a stop sequence is empty");
  }
  const Tokenizer& tok = model.tokenizer();
  const int vocab = model.config().vocab_size;
  std::vector<std::vector<int32_t>> encoded;
  for (size_t i = 0; i < prompts.size(); ++i) {
    encoded.push_back(tok.Encode(prompts[i], tok.add_bos(), options.parse_special));
    if (encoded.back().empty()) {
      return absl::InvalidArgumentError(absl::StrCat("prompt ", i + 1, " has no tokens"));
    }
    const int64_t need = (int64_t)encoded.back().size() + options.max_tokens;
    if (need > model.config().max_context) {
      return absl::OutOfRangeError(absl::StrCat("prompt ", i + 1, " plus ", options.max_tokens,
                                                " tokens exceeds the context of ",
                                                model.config().max_context));
    }
  }
  std::vector<Completion> out(prompts.size());
  Logits logits;
  for (size_t b0 = 0; b0 < prompts.size(); b0 += options.batch) {
    const size_t nb = std::min(prompts.size() - b0, (size_t)options.batch);
    int64_t capacity = 0;
    for (size_t i = b0; i < b0 + nb; ++i) {
      capacity += model.kv_layout().SequenceTokens((int64_t)encoded[i].size() + options.max_tokens);
    }
    PDQ_ASSIGN_OR_RETURN(std::unique_ptr<KvCache> kv, model.NewKvCache(capacity));
    std::vector<SeqId> seqs(nb);
    std::vector<BatchEntry> batch;
    for (size_t k = 0; k < nb; ++k) {
      seqs[k] = kv->AddSequence();
      batch.push_back({seqs[k], encoded[b0 + k], 1});
    }
    PDQ_RETURN_IF_ERROR(prefill.ForwardAll(*kv, batch, &logits));
    std::vector<int32_t> next(nb);
    std::vector<std::vector<int32_t>> generated(nb);
    std::vector<size_t> active;  // indices into the batch, in order
    for (size_t k = 0; k < nb; ++k) {
      next[k] = Argmax(logits.Row(k, 0), vocab);
      active.push_back(k);
    }
    while (!active.empty()) {
      std::vector<size_t> still;
      for (size_t k : active) {
        Completion& c = out[b0 + k];
        ++c.tokens;
        if (tok.IsEndOfGeneration(next[k])) {
          c.stop_reason = "eos";
          continue;
        }
        generated[k].push_back(next[k]);
        PDQ_ASSIGN_OR_RETURN(c.text, tok.Decode(generated[k]));
        size_t cut = std::string::npos;
        for (const std::string& stop : options.stop) cut = std::min(cut, c.text.find(stop));
        if (cut != std::string::npos) {
          c.text.resize(cut);
          c.stop_reason = "stop_sequence";
        } else if ((int)generated[k].size() == options.max_tokens) {
          c.stop_reason = "max_tokens";
        } else {
          still.push_back(k);
        }
      }
      active = std::move(still);
      if (active.empty()) break;
      batch.clear();
      for (size_t k : active) batch.push_back({seqs[k], {&next[k], 1}, 1});
      PDQ_RETURN_IF_ERROR(decode.ForwardAll(*kv, batch, &logits));
      for (size_t e = 0; e < active.size(); ++e) {
        next[active[e]] = Argmax(logits.Row(e, 0), vocab);
      }
    }
    if (options.progress) options.progress((int64_t)(b0 + nb), (int64_t)prompts.size());
  }
  return out;
}

std::string CodePromptHead(const std::string& prompt) {
  return prompt.substr(0, HeadLength(prompt));
}

std::string CanonicalCompletion(const CodeProblem& problem) {
  return problem.prompt.substr(HeadLength(problem.prompt)) + problem.solution;
}

std::string CodeTestProgram(const CodeProblem& problem, const std::string& completion) {
  return absl::StrCat(CodePromptHead(problem.prompt), completion, "\n\n", problem.test,
                      "\n\ncheck(", problem.entry_point, ")\n");
}

absl::StatusOr<SandboxResult> RunCodeTests(const CodeProblem& problem,
                                           const std::string& completion,
                                           const SandboxLimits& limits, const std::string& python) {
  return RunSandboxed({python, "-"}, CodeTestProgram(problem, completion), limits);
}

}  // namespace pdq
