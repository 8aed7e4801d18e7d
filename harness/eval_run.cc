// The evaluation runner (harness/eval_run.h).
#include "harness/eval_run.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/check.h"
#include "harness/bench_result.h"
#include "harness/local_run.h"
#include "server/metrics.h"

namespace pdq {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// Keeps `tmp` as `final` only when the step finished and wrote JSON.
bool Keep(const std::string& tmp, const std::string& final) {
  std::ifstream in(tmp);
  const json j = json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    fs::remove(tmp);
    return false;
  }
  fs::rename(tmp, final);
  return true;
}

// The router's figures labelled by pool (an A/B split), from its /metrics:
// {pool: {series: value}} for the request counts by code, the TTFT and TPOT
// histograms' sums and counts, and the fallbacks. Empty when it does not
// answer.
PoolCounters PoolSeries(const std::string& metrics_address) {
  PoolCounters out;
  if (metrics_address.empty()) return out;
  absl::StatusOr<std::map<std::string, double>> samples = server::ScrapeMetrics(metrics_address);
  if (!samples.ok()) return out;
  for (const auto& [series, value] : *samples) {
    const size_t brace = series.find('{');
    if (brace == std::string::npos) continue;
    std::string name = series.substr(0, brace), pool, code;
    for (absl::string_view label :
         absl::StrSplit(absl::string_view(series).substr(brace + 1), ',', absl::SkipEmpty())) {
      const size_t eq = label.find('=');
      if (eq == absl::string_view::npos) continue;
      std::string v(label.substr(eq + 1));
      while (!v.empty() && (v.back() == '}' || v.back() == '"')) v.pop_back();
      if (!v.empty() && v.front() == '"') v.erase(0, 1);
      if (label.substr(0, eq) == "pool") pool = v;
      if (label.substr(0, eq) == "code") code = v;
    }
    if (pool.empty()) continue;
    if (name == "pdq_requests_total") {
      name = code == "OK" ? "requests_ok" : "requests_failed";
    } else if (name == "pdq_split_fallbacks_total") {
      name = "fallbacks";
    } else if (name == "pdq_ttft_seconds_sum" || name == "pdq_ttft_seconds_count" ||
               name == "pdq_tpot_seconds_sum" || name == "pdq_tpot_seconds_count") {
      name = name.substr(4);
    } else {
      continue;
    }
    out[pool][name] += value;
  }
  return out;
}

// after - before, series by series.
PoolCounters PoolDelta(const PoolCounters& before, const PoolCounters& after) {
  PoolCounters out;
  for (const auto& [pool, series] : after) {
    for (const auto& [name, v] : series) {
      double b = 0;
      if (auto p = before.find(pool); p != before.end()) {
        if (auto it = p->second.find(name); it != p->second.end()) b = it->second;
      }
      out[pool][name] = v - b;
    }
  }
  return out;
}

// Steps of one run: each knows whether its file exists, counts itself in
// the progress line, and counts a failure when it writes no result.
class EvalRunner {
 public:
  EvalRunner(const EvalConfig& config, const EvalRunOptions& o)
      : c_(config),
        o_(o),
        raw_(o.out_dir + "/raw"),
        model_(config.model.empty() ? o.default_model : config.model) {}

  int CountSteps();
  void MeasureDeployment(const EvalDeployment& d);
  void RunAccuracy();
  void RunLowbit();
  void RunCluster();
  int failures() const { return failures_; }

 private:
  bool Selected(const std::string& name) const {
    return !o_.skip_serving && (o_.only.empty() || o_.only.count(name));
  }
  bool Stable(const std::string& name) const {
    return !o_.skip_stability && c_.stability && c_.stability->deployment == name;
  }
  bool Conversing(const std::string& name) const {
    return c_.conversations && c_.conversations->Includes(name);
  }
  void Progress(const std::string& what) {
    std::fprintf(stderr, "pdq eval: [%d/%d] %s\n", ++step_, steps_, what.c_str());
  }
  // A step's child wrote `file`.tmp: kept as `file`, or a failure.
  void Keep(const std::string& file) {
    if (!pdq::Keep(file + ".tmp", file)) ++failures_;
  }
  json UpConfig(const EvalDeployment& d) const;
  using Flags = std::vector<std::pair<std::string, std::string>>;
  // `pdq bench` against `dep` on the config's text, writing `file`.tmp, with
  // these flags and values.
  std::vector<std::string> BenchArgs(const LocalDeployment& dep, const std::string& file,
                                     const Flags& flags) const;
  // `seed`: the workload's own prompts (pdq bench --prompt-seed), none of
  // which starts like another workload's, so the deployment's prefix cache
  // answers none of them from an earlier workload's.
  void RunWorkload(const LocalDeployment& dep, const EvalDeployment& d, const EvalWorkload& w,
                   int seed);
  void RunStability(const LocalDeployment& dep, const std::string& name);
  void Converse(const LocalDeployment& dep, const std::string& name, const std::string& file,
                const char* cache);
  void ConverseWithoutCache(const json& up, const std::string& name);
  std::string DriftPrompts();
  void AccuracyStep(const std::string& file, const std::string& input, const std::string& what,
                    const std::vector<std::string>& args);
  void PairAccuracy(const std::string& p, const std::string& d, const std::string& prompts);

  const EvalConfig& c_;
  const EvalRunOptions& o_;
  const std::string raw_, model_;
  int steps_ = 0, step_ = 0, failures_ = 0;
};

// The precision pairs of the deployments, once each (sorted).
std::set<std::pair<std::string, std::string>> Pairs(const EvalConfig& c) {
  std::set<std::pair<std::string, std::string>> pairs;
  for (const EvalDeployment& d : c.deployments)
    pairs.insert({d.prefill_precision, d.decode_precision});
  return pairs;
}

// The lowbit steps: W4A16 and W8A8 against FP16 on each kernel path
// (PDQ_ISA), at each thread count, in the engine alone.
struct LowbitRun {
  std::string isa, precision, threads, file;
};
std::vector<LowbitRun> LowbitRuns(const EvalConfig& c, const std::string& raw) {
  std::vector<LowbitRun> runs;
  if (!c.lowbit) return runs;
  for (const std::string& isa : c.lowbit->isas) {
    for (int t : c.lowbit->threads) {
      for (const char* p : {"w4a16", "w8a8"}) {
        runs.push_back({isa, p, std::to_string(t),
                        absl::StrCat(raw, "/lowbit/", isa, "-", p, "-t", t, ".json")});
      }
    }
  }
  return runs;
}

// The steps, counted first so progress can say "[k/n]".
int EvalRunner::CountSteps() {
  for (const EvalDeployment& d : c_.deployments) {
    if (!Selected(d.name)) continue;
    steps_ += (int)c_.workloads.size() + (Stable(d.name) ? 1 : 0) + (Conversing(d.name) ? 2 : 0);
  }
  const EvalAccuracy& a = c_.accuracy;
  if (!o_.skip_accuracy) {
    steps_ += (int)Pairs(c_).size() * ((int)a.texts.size() + 1 + (a.conversation.empty() ? 0 : 2) +
                                       (a.code.empty() ? 0 : 1));
  }
  if (!o_.skip_lowbit) steps_ += (int)LowbitRuns(c_, raw_).size();
  if (!o_.skip_cluster && c_.cluster) steps_ += 1 + (int)c_.cluster->workloads.size();
  return steps_;
}

json EvalRunner::UpConfig(const EvalDeployment& d) const {
  json up = {{"model", model_},
             {"listen", "127.0.0.1:0"},
             {"kv_transport", d.kv_transport.empty() ? c_.kv_transport : d.kv_transport},
             {"workers", d.workers}};
  if (!d.split.empty()) {
    up["split"] = d.split;
    up["split_sticky"] = d.split_sticky;
  }
  return up;
}

std::vector<std::string> EvalRunner::BenchArgs(const LocalDeployment& dep, const std::string& file,
                                               const Flags& flags) const {
  std::vector<std::string> args = {o_.pdq,   "bench", "--router", dep.address(),
                                   "--text", c_.text, "--json",   file + ".tmp"};
  for (const auto& [flag, value] : flags) args.insert(args.end(), {flag, value});
  return args;
}

void EvalRunner::MeasureDeployment(const EvalDeployment& d) {
  const std::string& name = d.name;
  if (!Selected(name)) return;
  const std::string dir = raw_ + "/" + name;
  std::error_code ec;
  fs::create_directories(dir, ec);
  // What this deployment still has to run.
  bool bench_todo = false;
  for (const EvalWorkload& w : c_.workloads) {
    bench_todo = bench_todo || !fs::exists(dir + "/bench-" + w.name + ".json");
  }
  const bool stability_todo = Stable(name) && !fs::exists(dir + "/stability.json");
  const std::string conv_on = dir + "/conversation-cache-on.json",
                    conv_off = dir + "/conversation-cache-off.json";
  const bool conv_on_todo = Conversing(name) && !fs::exists(conv_on);
  const bool conv_off_todo = Conversing(name) && !fs::exists(conv_off);
  if (!bench_todo && !stability_todo && !conv_on_todo && !conv_off_todo) {
    step_ += (int)c_.workloads.size() + (Stable(name) ? 1 : 0) + (Conversing(name) ? 2 : 0);
    std::fprintf(stderr, "pdq eval: %s: measured already (%s)\n", name.c_str(), dir.c_str());
    return;
  }
  const json up = UpConfig(d);
  std::fprintf(stderr, "pdq eval: %s: starting (%zu workers)\n", name.c_str(), d.workers.size());
  {
    LocalDeployment dep;
    // Started only for the conversations: its files go beside, not over,
    // those of the runs that measured the workloads.
    const std::string dep_dir = bench_todo || stability_todo ? dir : dir + "/cache-on";
    fs::create_directories(dep_dir, ec);
    if (absl::Status s = dep.Start(up, dep_dir); !s.ok()) {
      std::fprintf(stderr, "pdq eval: %s: %s\n", name.c_str(), std::string(s.message()).c_str());
      ++failures_;
      return;
    }
    for (size_t i = 0; i < c_.workloads.size(); ++i) {
      if (interrupted()) break;
      RunWorkload(dep, d, c_.workloads[i], (int)i + 1);
    }
    if (stability_todo && !interrupted()) RunStability(dep, name);
    if (conv_on_todo && !interrupted()) {
      Converse(dep, name, conv_on, "on");
    } else if (Conversing(name)) {
      ++step_;
    }
  }  // stops the deployment
  if (interrupted()) return;
  if (conv_off_todo) {
    ConverseWithoutCache(up, name);
  } else if (Conversing(name)) {
    ++step_;
  }
}

void EvalRunner::RunWorkload(const LocalDeployment& dep, const EvalDeployment& d,
                             const EvalWorkload& w, int seed) {
  const std::string file = raw_ + "/" + d.name + "/bench-" + w.name + ".json";
  if (fs::exists(file)) {
    ++step_;
    return;
  }
  std::vector<std::string> levels;
  for (int l : w.concurrency) levels.push_back(std::to_string(l));
  Progress(absl::StrCat(
      d.name, ": ", w.name, " at concurrency ", absl::StrJoin(levels, ","),
      w.until_flat > 0 ? absl::StrCat(", then doubling while still rising, up to ", w.until_flat)
                       : ""));
  // The workload's name, or "custom" with other lengths (a short demo).
  const bool custom = w.input_tokens > 0 || w.output_tokens > 0;
  Flags flags = {{"--workload", custom ? "custom" : w.name},
                 {"--concurrency", absl::StrJoin(levels, ",")},
                 {"--warmup", std::to_string(w.warmup)},
                 {"--prompt-seed", std::to_string(seed)},
                 {"--ttft-target-ms", std::to_string(w.ttft_target_ms)},
                 {"--tpot-target-ms", std::to_string(w.tpot_target_ms)}};
  if (custom) {
    flags.push_back({"--input-tokens", std::to_string(w.input_tokens > 0 ? w.input_tokens : 128)});
    flags.push_back(
        {"--output-tokens", std::to_string(w.output_tokens > 0 ? w.output_tokens : 128)});
  }
  if (w.until_flat > 0) flags.push_back({"--until-flat", std::to_string(w.until_flat)});
  if (w.requests_per_client > 0) {
    flags.push_back({"--requests-per-client", std::to_string(w.requests_per_client)});
  } else if (w.requests > 0) {
    flags.push_back({"--requests", std::to_string(w.requests)});
  }
  const PoolCounters pools_before = PoolSeries(dep.metrics_address());
  RunChild(BenchArgs(dep, file, flags));
  if (!d.split.empty()) {
    // The router's own pool-labelled counts over this workload (warm-up
    // included), beside the per-request records the bench kept.
    absl::StatusOr<BenchResult> b = ReadBenchResult(file + ".tmp");
    if (b.ok()) {
      b->router_pools = PoolDelta(pools_before, PoolSeries(dep.metrics_address()));
      if (absl::Status s = WriteBenchResult(file + ".tmp", *b); !s.ok()) {
        std::fprintf(stderr, "pdq eval: %s\n", std::string(s.message()).c_str());
      }
    }
  }
  if (!pdq::Keep(file + ".tmp", file)) {
    std::fprintf(stderr, "pdq eval: %s: %s wrote no result\n", d.name.c_str(), w.name.c_str());
    ++failures_;
  }
}

void EvalRunner::RunStability(const LocalDeployment& dep, const std::string& name) {
  const EvalStability& s = *c_.stability;
  Progress(absl::StrCat(name, ": stability, ", s.cycles, " cycles of alternating load"));
  const std::string file = raw_ + "/" + name + "/stability.json";
  RunChild(BenchArgs(dep, file,
                     {{"--pattern", "alternate"},
                      {"--cycles", std::to_string(s.cycles)},
                      {"--high", std::to_string(s.high)},
                      {"--low", std::to_string(s.low)},
                      {"--workload", "custom"},
                      {"--input-tokens", std::to_string(s.input_tokens)},
                      {"--output-tokens", std::to_string(s.output_tokens)},
                      {"--max-rss-growth-mib", std::to_string(s.max_rss_growth_mib)}}));
  Keep(file);
}

// The conversation workload: the same for both runs (prefix cache on, off).
void EvalRunner::Converse(const LocalDeployment& dep, const std::string& name,
                          const std::string& file, const char* cache) {
  const EvalConversations& c = *c_.conversations;
  Progress(absl::StrCat(name, ": conversations, prefix cache ", cache, ", ", c.sessions,
                        " sessions x ", c.turns, " turns"));
  RunChild(BenchArgs(dep, file,
                     {{"--workload", "conversation"},
                      {"--sessions", std::to_string(c.sessions)},
                      {"--turns", std::to_string(c.turns)},
                      {"--first-tokens", std::to_string(c.first_tokens)},
                      {"--turn-tokens", std::to_string(c.turn_tokens)},
                      {"--output-tokens", std::to_string(c.output_tokens)}}));
  Keep(file);
}

// The same deployment again with every worker's prefix cache off.
void EvalRunner::ConverseWithoutCache(const json& up, const std::string& name) {
  json off = up;
  for (json& w : off["workers"]) {
    json args = w.value("args", json::array());
    args.insert(args.end(), {"--prefix-cache", "off"});
    w["args"] = args;
  }
  std::fprintf(stderr, "pdq eval: %s: starting again with the prefix cache off\n", name.c_str());
  const std::string dir = raw_ + "/" + name;
  std::error_code ec;
  fs::create_directories(dir + "/cache-off", ec);
  LocalDeployment without;
  if (absl::Status s = without.Start(off, dir + "/cache-off"); !s.ok()) {
    std::fprintf(stderr, "pdq eval: %s: %s\n", name.c_str(), std::string(s.message()).c_str());
    ++failures_;
    ++step_;
    return;
  }
  Converse(without, name, dir + "/conversation-cache-off.json", "off");
}

// The first drift_prompt_count lines of the drift prompts, in raw/ (so a
// resumed run uses the same); empty when they cannot be read (no drift
// steps; counted as a failure).
std::string EvalRunner::DriftPrompts() {
  const std::string prompts = raw_ + "/accuracy/drift_prompts.txt";
  if (fs::exists(prompts)) return prompts;
  std::ifstream in(c_.accuracy.drift_prompts);
  if (!in) {
    std::fprintf(stderr, "pdq eval: cannot read drift_prompts '%s'\n",
                 c_.accuracy.drift_prompts.c_str());
    ++failures_;
    return "";
  }
  std::ofstream f(prompts);
  int n = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    if (n++ == c_.accuracy.drift_prompt_count) break;
    f << line << "\n";
  }
  return prompts;
}

// One accuracy step into `file`: skipped when the file exists (a resumed
// run), left out with a message when its `input` file is missing, else run
// as a child.
void EvalRunner::AccuracyStep(const std::string& file, const std::string& input,
                              const std::string& what, const std::vector<std::string>& args) {
  if (fs::exists(file)) {
    ++step_;
    return;
  }
  if (!input.empty() && !fs::exists(input)) {
    ++step_;
    ++failures_;
    std::fprintf(stderr, "pdq eval: %s is missing%s; its rows are left out\n", input.c_str(),
                 absl::StartsWith(input, "build/eval-texts/") ? " (make eval-texts makes it)" : "");
    return;
  }
  Progress(what);
  RunChild(args, file + ".tmp");
  Keep(file);
}

// Every accuracy step of one precision pair (prefill `p`, decode `d`).
void EvalRunner::PairAccuracy(const std::string& p, const std::string& d,
                              const std::string& prompts) {
  const EvalAccuracy& a = c_.accuracy;
  const std::string pair = p + "-" + d, acc = raw_ + "/accuracy/";
  const std::string on = absl::StrCat(", ", p, " prefill / ", d, " decode");
  const std::string threads = std::to_string(a.threads);
  const std::vector<std::string> common = {o_.pdq,
                                           "",
                                           "--model",
                                           model_,
                                           "--threads",
                                           threads,
                                           "--prefill-precision",
                                           p,
                                           "--decode-precision",
                                           d};
  auto args = [&](const char* command, std::vector<std::string> more) {
    std::vector<std::string> v = common;
    v[1] = command;
    v.insert(v.end(), more.begin(), more.end());
    return v;
  };
  for (const std::string& path : a.texts) {
    if (interrupted()) return;
    AccuracyStep(
        absl::StrCat(acc, "ppl-", pair, "-", fs::path(path).stem().string(), ".json"), path,
        absl::StrCat("perplexity", on, ", ", path),
        args("perplexity", {"--text", path, "--ctx", std::to_string(a.ctx), "--chunks",
                            std::to_string(a.chunks), "--kl-reference", "fp16", "--json"}));
  }
  if (!a.conversation.empty() && !interrupted()) {
    const std::vector<std::string> conversation = {
        "--conversation", a.conversation,  "--reference",
        "fp16",           "--turn-tokens", std::to_string(a.conversation_turn_tokens),
        "--json"};
    AccuracyStep(absl::StrCat(acc, "conversation-", pair, ".json"), "",
                 absl::StrCat("conversation drift", on), args("drift", conversation));
    // The same conversation reading the KV of earlier turns, as a prefix
    // cache that reuses any precision's KV would.
    std::vector<std::string> reuse = conversation;
    reuse.insert(reuse.end() - 1, "--reuse-kv");
    AccuracyStep(absl::StrCat(acc, "conversation-reuse-", pair, ".json"), "",
                 absl::StrCat("conversation drift reusing earlier turns' KV", on),
                 args("drift", reuse));
    // With two precisions, also as a decode worker that prefills each
    // follow-up's new tokens itself, at its own precision.
    if (p != d) {
      std::vector<std::string> local = reuse;
      local.insert(local.end() - 1, "--follow-ups-at-decode");
      AccuracyStep(absl::StrCat(acc, "conversation-local-", pair, ".json"), "",
                   absl::StrCat("conversation drift with follow-ups prefilled at ", d, on),
                   args("drift", local));
    }
  }
  if (!a.code.empty() && !interrupted()) {
    AccuracyStep(absl::StrCat(acc, "code-", pair, ".json"), a.code, absl::StrCat("HumanEval", on),
                 args("code-eval", {"--problems", a.code, "--kl-reference", "fp16", "--max-tokens",
                                    std::to_string(a.code_max_tokens), "--completions",
                                    absl::StrCat(acc, "code-", pair, ".jsonl"), "--json"}));
  }
  if (interrupted()) return;
  if (prompts.empty()) {  // the prompts could not be read: counted as a failure already
    ++step_;
    return;
  }
  AccuracyStep(absl::StrCat(acc, "drift-", pair, ".json"), "", absl::StrCat("drift", on),
               args("drift", {"--prompts", prompts, "--chat", "--reference", "fp16", "--max-tokens",
                              std::to_string(a.drift_tokens), "--json"}));
}

void EvalRunner::RunAccuracy() {
  if (o_.skip_accuracy || interrupted()) return;
  const std::string prompts = DriftPrompts();
  for (const auto& [p, d] : Pairs(c_)) {
    PairAccuracy(p, d, prompts);
    if (interrupted()) return;
  }
}

void EvalRunner::RunLowbit() {
  if (o_.skip_lowbit) return;
  const std::vector<LowbitRun> runs = LowbitRuns(c_, raw_);
  if (!runs.empty()) {
    std::error_code ec;
    fs::create_directories(raw_ + "/lowbit", ec);
  }
  for (const LowbitRun& r : runs) {
    if (interrupted()) break;
    if (fs::exists(r.file) || fs::exists(r.file + ".absent")) {
      ++step_;
      continue;
    }
    Progress(absl::StrCat("low-bit on the ", r.isa, " path: ", r.precision, " against fp16, ",
                          r.threads, " thread(s)"));
    RunChild({"/usr/bin/env", "PDQ_ISA=" + r.isa, o_.pdq, "bench-engine", "--model", model_,
              "--precision", r.precision, "--baseline", "fp16", "--threads", r.threads,
              "--prompt-tokens", std::to_string(c_.lowbit->prompt_tokens), "--gen-tokens",
              std::to_string(c_.lowbit->gen_tokens), "--repetitions",
              std::to_string(c_.lowbit->repetitions), "--json"},
             r.file + ".tmp");
    std::ifstream in(r.file + ".tmp");
    const json j = json::parse(in, nullptr, false);
    if (j.is_object() && j.value("isa", "") != r.isa) {
      // PDQ_ISA forces only a lower path: this machine has no such kernels.
      std::fprintf(stderr, "pdq eval: no %s kernels on this machine (it ran %s); left out\n",
                   r.isa.c_str(), j.value("isa", "?").c_str());
      fs::remove(r.file + ".tmp");
      std::ofstream(r.file + ".absent") << j.value("isa", "?") << "\n";
      continue;
    }
    Keep(r.file);
  }
}

void EvalRunner::RunCluster() {
  if (o_.skip_cluster || !c_.cluster || interrupted()) return;
  const EvalCluster& cl = *c_.cluster;
  const std::string dir = raw_ + "/cluster", profile = dir + "/profile.json";
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (fs::exists(profile)) {
    ++step_;
  } else {
    Progress("cluster scale: pdq profile of this machine");
    RunChild({o_.pdq, "profile", "--model", model_, "--out", profile + ".tmp"});
    Keep(profile);
  }
  for (const std::string& name : cl.workloads) {
    if (interrupted()) return;
    const std::string file = absl::StrCat(dir, "/", name, ".json");
    if (fs::exists(file)) {
      ++step_;
      continue;
    }
    if (!fs::exists(profile)) {  // no profile: counted as failed above
      std::fprintf(stderr, "pdq eval: cluster scale: no profile, so no projection of %s\n",
                   name.c_str());
      ++step_;
      continue;
    }
    const EvalWorkload* w = nullptr;
    for (const EvalWorkload& x : c_.workloads) {
      if (x.name == name) w = &x;
    }
    Progress(absl::StrCat("cluster scale: ", name, " at ", absl::StrJoin(cl.nodes, ", "),
                          " nodes, projected"));
    // A node is one worker of the profile's most threads, priced as that
    // many cores.
    std::vector<std::string> args = {o_.pdq,
                                     "plan",
                                     "--sim",
                                     profile,
                                     "--workload",
                                     name,
                                     "--cluster-nodes",
                                     absl::StrJoin(cl.nodes, ","),
                                     "--pairs",
                                     absl::StrJoin(cl.pairs, ","),
                                     "--seeds",
                                     std::to_string(cl.seeds),
                                     "--core-hour-price",
                                     absl::StrCat(c_.price_per_core_hour),
                                     "--json",
                                     file + ".tmp"};
    if (w != nullptr && w->ttft_target_ms > 0) {
      args.insert(args.end(), {"--ttft-target-ms", absl::StrCat(w->ttft_target_ms)});
    }
    if (w != nullptr && w->tpot_target_ms > 0) {
      args.insert(args.end(), {"--tpot-target-ms", absl::StrCat(w->tpot_target_ms)});
    }
    if (w != nullptr && w->input_tokens > 0) {
      args.insert(args.end(), {"--input-tokens", std::to_string(w->input_tokens)});
    }
    if (w != nullptr && w->output_tokens > 0) {
      args.insert(args.end(), {"--output-tokens", std::to_string(w->output_tokens)});
    }
    RunChild(args, absl::StrCat(dir, "/", name, ".txt"));  // its table, as printed
    Keep(file);
  }
}

}  // namespace

absl::StatusOr<EvalRunOutcome> RunEvaluation(const EvalConfig& config, const EvalRunOptions& o) {
  for (const std::string& n : o.only) {
    if (config.Deployment(n) == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("--only: no deployment named '", n, "'"));
    }
  }
  const std::string raw = o.out_dir + "/raw";
  std::error_code ec;
  fs::create_directories(raw + "/accuracy", ec);
  if (ec) {
    return absl::UnavailableError(absl::StrCat("cannot create ", raw, ": ", ec.message()));
  }
  PDQ_RETURN_IF_ERROR(WriteEvalConfigCopy(config, o.out_dir + "/config.json"));
  CatchInterrupts();
  EvalRunner runner(config, o);
  runner.CountSteps();
  for (const EvalDeployment& d : config.deployments) {
    runner.MeasureDeployment(d);
    if (interrupted()) break;
  }
  runner.RunAccuracy();
  runner.RunLowbit();
  runner.RunCluster();
  return EvalRunOutcome{runner.failures(), interrupted()};
}

}  // namespace pdq
