// `pdq eval`: the evaluation harness in one command. For each deployment of
// a config (deploy/eval/*.json) it starts `pdq up`, runs `pdq bench` for the
// standard workloads over a concurrency sweep and, where asked, the
// alternating-load stability test; then the accuracy suite (`pdq perplexity`
// on several texts, `pdq code-eval` on HumanEval and `pdq drift`) for each
// precision pair against FP16;
// then writes report.md with tables and plots (harness/report.h).
//
// Every step is a child process writing one JSON file under OUT/raw/, kept
// as soon as it is complete: an interrupted run keeps what it measured and
// its report is written from that, and running the same command again
// resumes, skipping the steps whose files exist.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "server/metrics.h"
#include "tools/commands.h"
#include "harness/bench_result.h"
#include "harness/report.h"
#include "tools/local_run.h"

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

std::string Levels(const json& levels) {
  std::vector<std::string> v;
  for (const json& l : levels) v.push_back(std::to_string(l.get<int>()));
  return absl::StrJoin(v, ",");
}

absl::Status CheckConfig(const json& c) {
  if (!c.is_object()) return absl::InvalidArgumentError("the config must be a JSON object");
  if (!c.contains("deployments") || !c["deployments"].is_array() || c["deployments"].empty()) {
    return absl::InvalidArgumentError("the config needs a non-empty 'deployments' array");
  }
  std::set<std::string> names;
  for (const json& d : c["deployments"]) {
    if (!d.is_object() || !d.contains("name") || !d["name"].is_string() || !d.contains("workers") ||
        !d["workers"].is_array() || d["workers"].empty()) {
      return absl::InvalidArgumentError(
          "each deployment needs a 'name' and a non-empty 'workers' array (as in deploy/local/)");
    }
    const std::string name = d["name"];
    if (name.empty() || name.find_first_of("/ ") != std::string::npos ||
        !names.insert(name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("deployment names must be unique, without '/' or spaces: '", name, "'"));
    }
    for (const char* k : {"prefill_precision", "decode_precision"}) {
      if (!d.contains(k) || !d[k].is_string()) {
        return absl::InvalidArgumentError(absl::StrCat("deployment ", name, " needs '", k,
                                                       "' (its precision pair, for accuracy)"));
      }
    }
    for (const json& w : d["workers"]) {
      if (!w.is_object() || (w.contains("pool") && !w["pool"].is_string())) {
        return absl::InvalidArgumentError(absl::StrCat(
            "deployment ", name, ": each worker must be an object, its 'pool' a string"));
      }
    }
    if (d.contains("split_sticky") && !d["split_sticky"].is_boolean()) {
      return absl::InvalidArgumentError(
          absl::StrCat("deployment ", name, ": 'split_sticky' must be true or false"));
    }
    if (d.contains("split")) {
      // Each pool the split names needs a worker in it.
      if (!d["split"].is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat("deployment ", name, ": 'split' must be a string (POOL=WEIGHT,...)"));
      }
      for (absl::string_view arm : absl::StrSplit(d["split"].get<std::string>(), ',')) {
        const std::string pool(arm.substr(0, arm.find('=')));
        bool found = false;
        for (const json& w : d["workers"])
          found = found || (w.is_object() && w.value("pool", "") == pool);
        if (!found) {
          return absl::InvalidArgumentError(absl::StrCat(
              "deployment ", name, ": the split names pool '", pool, "', which no worker is in"));
        }
      }
    }
  }
  if (c.contains("lowbit")) {
    const json& l = c["lowbit"];
    const bool arrays = l.is_object() && (!l.contains("isas") || l["isas"].is_array()) &&
                        (!l.contains("threads") || l["threads"].is_array());
    bool ok = arrays;
    if (arrays) {
      for (const json& i : l.value("isas", json::array())) ok = ok && i.is_string();
      for (const json& t : l.value("threads", json::array())) {
        ok = ok && t.is_number_integer() && t.get<int>() >= 1;
      }
    }
    if (!ok) {
      return absl::InvalidArgumentError(
          "'lowbit' must be an object: {\"isas\": [\"scalar\", \"avx2\", ...], \"threads\": "
          "[1, 2], \"prompt_tokens\", \"gen_tokens\", \"repetitions\"}");
    }
  }
  if (c.contains("stability")) {
    const std::string d = c["stability"].value("deployment", "");
    if (!names.count(d)) {
      return absl::InvalidArgumentError(
          absl::StrCat("stability.deployment '", d, "' is not one of the deployments"));
    }
  }
  if (c.contains("workloads")) {
    if (!c["workloads"].is_object())
      return absl::InvalidArgumentError("'workloads' must be an object");
    for (const auto& [w, spec] : c["workloads"].items()) {
      if (w != "chat" && w != "summarize" && w != "analysis") {
        return absl::InvalidArgumentError(
            absl::StrCat("workload '", w, "' is not chat, summarize or analysis"));
      }
      if (!spec.is_object() || !spec.contains("concurrency") || !spec["concurrency"].is_array() ||
          spec["concurrency"].empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("workload ", w, " needs a 'concurrency' array"));
      }
      for (const json& l : spec["concurrency"]) {
        if (!l.is_number_integer() || l.get<int>() < 1) {
          return absl::InvalidArgumentError(
              absl::StrCat("workload ", w, ": concurrency levels are integers >= 1"));
        }
      }
    }
  }
  return absl::OkStatus();
}

int Progress(int step, int steps, const std::string& what) {
  std::fprintf(stderr, "pdq eval: [%d/%d] %s\n", step, steps, what.c_str());
  return step;
}

int RunEval(int argc, char** argv) {
  std::string config_path, out_dir, only;
  bool skip_accuracy = false, skip_stability = false, skip_serving = false;
  FlagParser flags("eval",
                   "Runs the evaluation of a config (deploy/eval/*.json): every deployment under "
                   "the standard workloads, the stability test, and the accuracy suite against "
                   "FP16, then writes OUT/report.md with tables and plots. Each step's JSON is "
                   "kept under OUT/raw/ as soon as it completes; an interrupted run keeps them, "
                   "and running again resumes.\n\n"
                   "Also: pdq eval report --config F --out DIR (rewrite the report), pdq eval "
                   "blind-ab ..., pdq eval tally ... (each with --help).");
  flags.String("config", &config_path, "the evaluation (JSON; see deploy/eval/)");
  flags.String("out", &out_dir, "where raw/, plots/ and report.md go");
  flags.String("only", &only, "comma-separated deployment names to run (default: all)");
  flags.Bool("skip-serving", &skip_serving, "no deployments: only accuracy (and the report)");
  flags.Bool("skip-accuracy", &skip_accuracy, "no perplexity, KL or drift");
  flags.Bool("skip-stability", &skip_stability, "no alternating-load test");
  bool skip_lowbit = false;
  flags.Bool("skip-lowbit", &skip_lowbit,
             "no per-kernel-path measurement of where low-bit weights stop paying");
  if (int rc = ParseOrExit(flags, argc, argv); rc >= 0) return rc;
  if (config_path.empty() || out_dir.empty()) {
    return Fail("eval", absl::InvalidArgumentError("--config and --out are required"));
  }
  absl::StatusOr<std::string> text = ReadTextFile(config_path, "--config");
  if (!text.ok()) return Fail("eval", text.status());
  const json config = json::parse(*text, nullptr, false);
  if (config.is_discarded()) {
    return Fail("eval", absl::InvalidArgumentError(absl::StrCat(config_path, " is not JSON")));
  }
  if (absl::Status s = CheckConfig(config); !s.ok()) {
    return Fail("eval", absl::InvalidArgumentError(absl::StrCat(config_path, ": ", s.message())));
  }
  std::set<std::string> selected;
  for (absl::string_view n : absl::StrSplit(only, ',', absl::SkipEmpty())) {
    selected.insert(std::string(n));
  }
  for (const std::string& n : selected) {
    bool found = false;
    for (const json& d : config["deployments"]) found = found || d["name"] == n;
    if (!found) {
      return Fail("eval", absl::InvalidArgumentError(
                              absl::StrCat("--only: no deployment named '", n, "'")));
    }
  }
  const std::string model = config.value("model", DefaultModelPath());
  const std::string bench_text =
      config.value("text", std::string("../shared/data/wikitext-2-raw/wiki.test.raw"));
  const std::string raw = out_dir + "/raw";
  std::error_code ec;
  fs::create_directories(raw + "/accuracy", ec);
  if (ec) {
    return Fail("eval",
                absl::UnavailableError(absl::StrCat("cannot create ", raw, ": ", ec.message())));
  }
  std::ofstream(out_dir + "/config.json") << config.dump(1) << "\n";
  CatchInterrupts();

  const json workloads = config.value("workloads", json::object());
  const json stability = config.value("stability", json::object());
  // Multi-turn conversations on some deployments, with their prefix caches
  // on (as deployed) and off.
  const json conv = config.value("conversation_bench", json::object());
  auto conversing = [&](const std::string& name) {
    for (const json& n : conv.value("deployments", json::array())) {
      if (n == name) return true;
    }
    return false;
  };
  const json accuracy = config.value("accuracy", json::object());
  // The steps, counted first so progress can say "[k/n]".
  int steps = 0, step = 0;
  for (const json& d : config["deployments"]) {
    if (skip_serving || (!selected.empty() && !selected.count(d["name"]))) continue;
    steps += (int)workloads.size();
    if (!skip_stability && stability.value("deployment", "") == d["name"]) ++steps;
    if (conversing(d["name"])) steps += 2;
  }
  std::set<std::pair<std::string, std::string>> pairs;
  for (const json& d : config["deployments"]) {
    pairs.insert(
        {d["prefill_precision"].get<std::string>(), d["decode_precision"].get<std::string>()});
  }
  const json texts = accuracy.value("texts", json::array({bench_text}));
  // A scripted multi-turn conversation, where low-bit decode errors would
  // accumulate over a long dialogue.
  const std::string conversation = accuracy.value("conversation", std::string());
  // HumanEval (make eval-texts fetches it): solution perplexity and pass@1.
  const std::string code = accuracy.value("code", std::string());
  if (!skip_accuracy) {
    steps += (int)pairs.size() *
             ((int)texts.size() + 1 + (conversation.empty() ? 0 : 2) + (code.empty() ? 0 : 1));
  }
  // Where low-bit stops paying: W4A16 and W8A8 against FP16 on each kernel
  // path (PDQ_ISA), at each thread count, in the engine alone.
  const json lowbit = config.value("lowbit", json::object());
  struct LowbitRun {
    std::string isa, precision, threads, file;
  };
  std::vector<LowbitRun> lowbit_runs;
  if (!skip_lowbit && config.contains("lowbit")) {
    fs::create_directories(raw + "/lowbit", ec);
    const json all_paths = json::array({"scalar", "avx2", "avx2+vnni", "avx512", "avx512+amx"});
    for (const json& isa : lowbit.value("isas", all_paths)) {
      for (const json& t : lowbit.value("threads", json::array({1}))) {
        for (const char* p : {"w4a16", "w8a8"}) {
          const std::string threads = std::to_string(t.get<int>());
          lowbit_runs.push_back({isa.get<std::string>(), p, threads,
                                 absl::StrCat(raw, "/lowbit/", isa.get<std::string>(), "-", p, "-t",
                                              threads, ".json")});
        }
      }
    }
    steps += (int)lowbit_runs.size();
  }

  int failures = 0;
  for (const json& d : config["deployments"]) {
    const std::string name = d["name"];
    if (skip_serving || (!selected.empty() && !selected.count(name))) continue;
    const std::string dir = raw + "/" + name;
    fs::create_directories(dir, ec);
    // What this deployment still has to run.
    bool bench_todo = false;
    for (const auto& [w, spec] : workloads.items()) {
      bench_todo = bench_todo || !fs::exists(dir + "/bench-" + w + ".json");
    }
    const bool stable = !skip_stability && stability.value("deployment", "") == name;
    const bool stability_todo = stable && !fs::exists(dir + "/stability.json");
    const std::string conv_on = dir + "/conversation-cache-on.json",
                      conv_off = dir + "/conversation-cache-off.json";
    const bool conv_on_todo = conversing(name) && !fs::exists(conv_on);
    const bool conv_off_todo = conversing(name) && !fs::exists(conv_off);
    // The conversation workload: the same for both runs.
    auto converse = [&](const LocalDeployment& at, const std::string& file, const char* cache) {
      Progress(++step, steps,
               absl::StrCat(name, ": conversations, prefix cache ", cache, ", ",
                            conv.value("sessions", 4), " sessions x ", conv.value("turns", 8),
                            " turns"));
      RunChild({SelfPath(), "bench", "--router", at.address(), "--workload", "conversation",
                "--text", bench_text, "--sessions", std::to_string(conv.value("sessions", 4)),
                "--turns", std::to_string(conv.value("turns", 8)), "--first-tokens",
                std::to_string(conv.value("first_tokens", 512)), "--turn-tokens",
                std::to_string(conv.value("turn_tokens", 64)), "--output-tokens",
                std::to_string(conv.value("output_tokens", 64)), "--json", file + ".tmp"});
      if (!Keep(file + ".tmp", file)) ++failures;
    };
    if (!bench_todo && !stability_todo && !conv_on_todo && !conv_off_todo) {
      step += (int)workloads.size() + (stable ? 1 : 0) + (conversing(name) ? 2 : 0);
      std::fprintf(stderr, "pdq eval: %s: measured already (%s)\n", name.c_str(), dir.c_str());
      continue;
    }
    json up = {{"model", model},
               {"listen", "127.0.0.1:0"},
               {"kv_transport", d.value("kv_transport", config.value("kv_transport", "tcp"))},
               {"workers", d["workers"]}};
    if (d.contains("split")) {
      up["split"] = d["split"];
      up["split_sticky"] = d.value("split_sticky", false);
    }
    std::fprintf(stderr, "pdq eval: %s: starting (%zu workers)\n", name.c_str(),
                 d["workers"].size());
    LocalDeployment dep;
    // Started only for the conversations: its files go beside, not over,
    // those of the runs that measured the workloads.
    const std::string dep_dir = bench_todo || stability_todo ? dir : dir + "/cache-on";
    fs::create_directories(dep_dir, ec);
    if (absl::Status s = dep.Start(up, dep_dir); !s.ok()) {
      std::fprintf(stderr, "pdq eval: %s: %s\n", name.c_str(), std::string(s.message()).c_str());
      ++failures;
      if (interrupted()) break;
      continue;
    }
    for (const auto& [w, spec] : workloads.items()) {
      if (interrupted()) break;
      const std::string file = dir + "/bench-" + w + ".json";
      if (fs::exists(file)) {
        ++step;
        continue;
      }
      Progress(++step, steps,
               absl::StrCat(name, ": ", w, " at concurrency ", Levels(spec["concurrency"])));
      std::vector<std::string> args = {
          SelfPath(),         "bench",
          "--router",         dep.address(),
          "--workload",       w,
          "--text",           bench_text,
          "--concurrency",    Levels(spec["concurrency"]),
          "--warmup",         std::to_string(spec.value("warmup", 1)),
          "--ttft-target-ms", std::to_string(spec.value("ttft_target_ms", 0.0)),
          "--tpot-target-ms", std::to_string(spec.value("tpot_target_ms", 0.0)),
          "--json",           file + ".tmp"};
      if (spec.contains("input_tokens") || spec.contains("output_tokens")) {
        // The workload's name with other lengths (a short demo).
        args[5] = "custom";
        args.insert(args.end(),
                    {"--input-tokens", std::to_string(spec.value("input_tokens", 128)),
                     "--output-tokens", std::to_string(spec.value("output_tokens", 128))});
      }
      if (spec.contains("requests_per_client")) {
        args.insert(args.end(), {"--requests-per-client",
                                 std::to_string(spec["requests_per_client"].get<int>())});
      } else if (spec.contains("requests")) {
        args.insert(args.end(), {"--requests", std::to_string(spec["requests"].get<int>())});
      }
      const PoolCounters pools_before = PoolSeries(dep.metrics_address());
      RunChild(args);
      if (d.contains("split")) {
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
      if (!Keep(file + ".tmp", file)) {
        std::fprintf(stderr, "pdq eval: %s: %s wrote no result\n", name.c_str(), w.c_str());
        ++failures;
      }
    }
    if (stability_todo && !interrupted()) {
      Progress(++step, steps,
               absl::StrCat(name, ": stability, ", stability.value("cycles", 10),
                            " cycles of alternating load"));
      const std::string file = dir + "/stability.json";
      RunChild({SelfPath(),
                "bench",
                "--router",
                dep.address(),
                "--pattern",
                "alternate",
                "--text",
                bench_text,
                "--cycles",
                std::to_string(stability.value("cycles", 10)),
                "--high",
                std::to_string(stability.value("high", 8)),
                "--low",
                std::to_string(stability.value("low", 1)),
                "--workload",
                "custom",
                "--input-tokens",
                std::to_string(stability.value("input_tokens", 256)),
                "--output-tokens",
                std::to_string(stability.value("output_tokens", 64)),
                "--max-rss-growth-mib",
                std::to_string(stability.value("max_rss_growth_mib", 64.0)),
                "--json",
                file + ".tmp"});
      if (!Keep(file + ".tmp", file)) ++failures;
    }
    if (conv_on_todo && !interrupted()) {
      converse(dep, conv_on, "on");
    } else if (conversing(name)) {
      ++step;
    }
    dep.Stop();
    if (interrupted()) break;
    if (conv_off_todo) {
      // The same deployment again with every worker's prefix cache off.
      json off = up;
      for (json& w : off["workers"]) {
        json args = w.value("args", json::array());
        args.insert(args.end(), {"--prefix-cache", "off"});
        w["args"] = args;
      }
      std::fprintf(stderr, "pdq eval: %s: starting again with the prefix cache off\n",
                   name.c_str());
      LocalDeployment without;
      fs::create_directories(dir + "/cache-off", ec);
      if (absl::Status s = without.Start(off, dir + "/cache-off"); !s.ok()) {
        std::fprintf(stderr, "pdq eval: %s: %s\n", name.c_str(), std::string(s.message()).c_str());
        ++failures;
        ++step;
      } else {
        converse(without, conv_off, "off");
        without.Stop();
      }
    } else if (conversing(name)) {
      ++step;
    }
    if (interrupted()) break;
  }

  if (!skip_accuracy && !interrupted()) {
    const std::string threads = std::to_string(accuracy.value("threads", 0));
    std::string prompts = raw + "/accuracy/drift_prompts.txt";
    if (!fs::exists(prompts)) {
      // The first drift_prompt_count lines of the prompts file.
      absl::StatusOr<std::string> all = ReadTextFile(
          accuracy.value("drift_prompts", std::string("bench/drift_prompts.txt")), "drift_prompts");
      if (!all.ok()) {
        std::fprintf(stderr, "pdq eval: %s\n", std::string(all.status().message()).c_str());
        prompts.clear();  // no drift; the rest goes on
        ++failures;
      } else {
        std::ofstream f(prompts);
        int n = 0;
        for (absl::string_view line : absl::StrSplit(*all, '\n', absl::SkipEmpty())) {
          if (n++ == accuracy.value("drift_prompt_count", 4)) break;
          f << line << "\n";
        }
      }
    }
    // One accuracy step into `file`: skipped when the file exists (a resumed
    // run), left out with a message when its `input` file is missing, else
    // run as a child.
    auto accuracy_step = [&](const std::string& file, const std::string& input,
                             const std::string& what, const std::vector<std::string>& args) {
      if (fs::exists(file)) {
        ++step;
        return;
      }
      if (!input.empty() && !fs::exists(input)) {
        ++step;
        ++failures;
        std::fprintf(
            stderr, "pdq eval: %s is missing%s; its rows are left out\n", input.c_str(),
            absl::StartsWith(input, "build/eval-texts/") ? " (make eval-texts makes it)" : "");
        return;
      }
      Progress(++step, steps, what);
      RunChild(args, file + ".tmp");
      if (!Keep(file + ".tmp", file)) ++failures;
    };
    for (const auto& [p, dprec] : pairs) {
      const std::string pair = p + "-" + dprec;
      const std::string on = absl::StrCat(", ", p, " prefill / ", dprec, " decode");
      for (const json& t : texts) {
        if (interrupted()) break;
        const std::string path = t.get<std::string>();
        accuracy_step(
            absl::StrCat(raw, "/accuracy/ppl-", pair, "-", fs::path(path).stem().string(), ".json"),
            path, absl::StrCat("perplexity", on, ", ", path),
            {SelfPath(), "perplexity", "--model", model, "--threads", threads, "--text", path,
             "--ctx", std::to_string(accuracy.value("ctx", 512)), "--chunks",
             std::to_string(accuracy.value("chunks", 8)), "--prefill-precision", p,
             "--decode-precision", dprec, "--kl-reference", "fp16", "--json"});
      }
      if (!conversation.empty() && !interrupted()) {
        accuracy_step(absl::StrCat(raw, "/accuracy/conversation-", pair, ".json"), "",
                      absl::StrCat("conversation drift", on),
                      {SelfPath(), "drift", "--model", model, "--threads", threads,
                       "--conversation", conversation, "--prefill-precision", p,
                       "--decode-precision", dprec, "--reference", "fp16", "--turn-tokens",
                       std::to_string(accuracy.value("conversation_turn_tokens", 96)), "--json"});
        // The same conversation reading the KV of earlier turns, as a
        // prefix cache that reuses any precision's KV would.
        accuracy_step(absl::StrCat(raw, "/accuracy/conversation-reuse-", pair, ".json"), "",
                      absl::StrCat("conversation drift reusing earlier turns' KV", on),
                      {SelfPath(), "drift", "--model", model, "--threads", threads,
                       "--conversation", conversation, "--prefill-precision", p,
                       "--decode-precision", dprec, "--reference", "fp16", "--reuse-kv",
                       "--turn-tokens",
                       std::to_string(accuracy.value("conversation_turn_tokens", 96)), "--json"});
      }
      if (!code.empty() && !interrupted()) {
        accuracy_step(
            absl::StrCat(raw, "/accuracy/code-", pair, ".json"), code,
            absl::StrCat("HumanEval", on),
            {SelfPath(), "code-eval", "--model", model, "--threads", threads, "--problems", code,
             "--prefill-precision", p, "--decode-precision", dprec, "--kl-reference", "fp16",
             "--max-tokens", std::to_string(accuracy.value("code_max_tokens", 256)),
             "--completions", absl::StrCat(raw, "/accuracy/code-", pair, ".jsonl"), "--json"});
      }
      if (interrupted()) break;
      if (prompts.empty()) {  // the prompts could not be read: counted as a failure above
        ++step;
        continue;
      }
      accuracy_step(
          absl::StrCat(raw, "/accuracy/drift-", pair, ".json"), "", absl::StrCat("drift", on),
          {SelfPath(), "drift", "--model", model, "--threads", threads, "--prompts", prompts,
           "--chat", "--prefill-precision", p, "--decode-precision", dprec, "--reference", "fp16",
           "--max-tokens", std::to_string(accuracy.value("drift_tokens", 512)), "--json"});
    }
  }

  for (const LowbitRun& r : lowbit_runs) {
    if (interrupted()) break;
    if (fs::exists(r.file) || fs::exists(r.file + ".absent")) {
      ++step;
      continue;
    }
    Progress(++step, steps,
             absl::StrCat("low-bit on the ", r.isa, " path: ", r.precision, " against fp16, ",
                          r.threads, " thread(s)"));
    RunChild({"/usr/bin/env", "PDQ_ISA=" + r.isa, SelfPath(), "bench-engine", "--model", model,
              "--precision", r.precision, "--baseline", "fp16", "--threads", r.threads,
              "--prompt-tokens", std::to_string(lowbit.value("prompt_tokens", 128)), "--gen-tokens",
              std::to_string(lowbit.value("gen_tokens", 32)), "--repetitions",
              std::to_string(lowbit.value("repetitions", 2)), "--json"},
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
    if (!Keep(r.file + ".tmp", r.file)) ++failures;
  }

  absl::StatusOr<std::string> report =
      WriteEvalReport(config, out_dir, /*command=*/
                      absl::StrCat("pdq eval --config ", config_path, " --out ", out_dir));
  if (!report.ok()) return Fail("eval", report.status());
  std::printf("%s", report->c_str());
  std::printf("pdq eval: report at %s/report.md%s\n", out_dir.c_str(),
              interrupted() ? " (interrupted: it holds what was measured; run again to resume)"
              : failures    ? absl::StrCat(" (", failures, " steps failed; see above)").c_str()
                            : "");
  return interrupted() ? 130 : failures ? 1 : 0;
}

int RewriteReport(int argc, char** argv) {
  std::string config_path, out_dir;
  FlagParser flags("eval report", "Rewrites OUT/report.md from the JSON under OUT/raw/.");
  flags.String("out", &out_dir, "the folder of a pdq eval run");
  flags.String("config", &config_path, "the config (default: OUT/config.json)");
  if (int rc = ParseOrExit(flags, argc, argv, 3, "pdq eval report"); rc >= 0) return rc;
  if (out_dir.empty()) return Fail("eval report", absl::InvalidArgumentError("--out is required"));
  if (config_path.empty()) config_path = out_dir + "/config.json";
  absl::StatusOr<std::string> text = ReadTextFile(config_path, "--config");
  if (!text.ok()) return Fail("eval report", text.status());
  const json config = json::parse(*text, nullptr, false);
  if (absl::Status s = CheckConfig(config); !s.ok()) return Fail("eval report", s);
  absl::StatusOr<std::string> report =
      WriteEvalReport(config, out_dir, absl::StrCat("pdq eval report --out ", out_dir));
  if (!report.ok()) return Fail("eval report", report.status());
  std::printf("%spdq eval: report at %s/report.md\n", report->c_str(), out_dir.c_str());
  return 0;
}

}  // namespace

int EvalCommand(int argc, char** argv) {
  if (argc > 2 && std::string(argv[2]) == "report") return RewriteReport(argc, argv);
  if (argc > 2 && std::string(argv[2]) == "blind-ab") return BlindAbCommand(argc, argv);
  if (argc > 2 && std::string(argv[2]) == "tally") return TallyCommand(argc, argv);
  return RunEval(argc, argv);
}

}  // namespace pdq
