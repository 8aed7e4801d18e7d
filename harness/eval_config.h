// A `pdq eval` config (deploy/eval/*.json), read and checked once into
// types: the evaluation runner (harness/eval_run.h) and the report
// (harness/report.h) read these, not the JSON. Omitted fields take the
// defaults written here; a field of the wrong type or a value out of range
// is an error naming it.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace pdq {

// One of the standard workloads (chat, summarize, analysis) over a sweep.
struct EvalWorkload {
  std::string name;
  std::vector<int> concurrency;                   // levels, each >= 1
  int64_t requests_per_client = 0, requests = 0;  // 0: pdq bench's default
  int64_t warmup = 1;
  double ttft_target_ms = 0, tpot_target_ms = 0;  // goodput's targets
  // Other lengths than the workload's own (a short demo); 0: its own.
  int64_t input_tokens = 0, output_tokens = 0;
  // > 0: past `concurrency`, each deployment's sweep doubles its top level
  // while output tokens/s still rises, up to this many streams (pdq bench
  // --until-flat), so every deployment gets a level past saturation without
  // the fast ones running levels only the slow ones need.
  int until_flat = 0;
};

// A deployment started with `pdq up`.
struct EvalDeployment {
  std::string name;  // unique, no '/' or spaces: its folder under raw/
  std::string prefill_precision, decode_precision;  // the pair its accuracy rows are
  bool baseline = false;   // the one the others are compared with (else the first)
  nlohmann::json workers;  // `pdq up`'s workers, passed through
  std::string split;       // an A/B split between worker pools ("a=50,b=50"); empty: none
  bool split_sticky = false;
  std::string kv_transport;  // empty: the config's
};

// The alternating-load test on one deployment.
struct EvalStability {
  std::string deployment;
  int cycles = 10, high = 8, low = 1;
  int64_t input_tokens = 256, output_tokens = 64;
  double max_rss_growth_mib = 64;
};

// Multi-turn conversations with each named deployment's prefix cache on
// (as deployed) and off.
struct EvalConversations {
  std::vector<std::string> deployments;
  int sessions = 4, turns = 8;
  int64_t first_tokens = 512, turn_tokens = 64, output_tokens = 64;
  bool Includes(const std::string& deployment) const;
};

// The accuracy suite, per precision pair against FP16.
struct EvalAccuracy {
  std::vector<std::string> texts;  // default: the config's text
  int ctx = 512, chunks = 8, threads = 0;
  std::string drift_prompts = "bench/drift_prompts.txt";
  int drift_prompt_count = 4, drift_tokens = 512;
  std::string conversation;  // a scripted conversation; empty: none
  int conversation_turn_tokens = 96;
  std::string code;  // HumanEval problems (JSONL); empty: none
  int code_max_tokens = 256;
};

// Where low-bit stops paying: bench-engine per kernel path and thread count.
struct EvalLowbit {
  std::vector<std::string> isas = {"scalar", "avx2", "avx2+vnni", "avx512", "avx512+amx"};
  std::vector<int> threads = {1};
  int prompt_tokens = 128, gen_tokens = 32, repetitions = 2;
};

// Cluster scale, projected: a profile of this machine (`pdq profile`), then
// for each workload `pdq plan --sim --cluster-nodes` (sim/plan.h
// SweepCluster) at the workload's targets: each precision pair as n
// monolithic nodes and at P:D splits, the most goodput per core.
struct EvalCluster {
  std::vector<int> nodes = {8, 32, 128};
  std::vector<std::string> pairs = {"fp16/fp16", "fp16/w4a16", "w8a8/w4a16"};  // PREFILL/DECODE
  std::vector<std::string> workloads;  // empty: every workload of the config
  int seeds = 3;
};

// A goodput ratio the report checks: deployment against the baseline.
struct EvalAim {
  std::string deployment;
  std::map<std::string, double> goodput_ratio;  // by workload
};

struct EvalConfig {
  std::string model;                                                 // empty: pdq's default model
  std::string text = "../shared/data/wikitext-2-raw/wiki.test.raw";  // prompts come from here
  double cores = 0;  // the machine's share, for cost; 0: every core here
  double price_per_core_hour = 0;
  std::string kv_transport = "tcp";
  std::vector<std::string> notes;  // what a reader must know, quoted at the top of the report
  std::optional<EvalAim> aim;
  std::vector<EvalWorkload> workloads;      // by name
  std::vector<EvalDeployment> deployments;  // non-empty
  std::optional<EvalStability> stability;
  std::optional<EvalConversations> conversations;
  EvalAccuracy accuracy;
  std::optional<EvalLowbit> lowbit;
  std::optional<EvalCluster> cluster;
  nlohmann::json source;  // as given: written beside the results
  // The file's own text when read from one (ReadEvalConfig), so the copy
  // written beside the results keeps its layout; empty otherwise.
  std::string source_text;

  const EvalDeployment* Deployment(const std::string& name) const;
};

// InvalidArgument naming the field or the deployment when `j` is not a
// valid config.
absl::StatusOr<EvalConfig> ParseEvalConfig(const nlohmann::json& j);
// ParseEvalConfig of a file; errors start with its path.
absl::StatusOr<EvalConfig> ReadEvalConfig(const std::string& path);
// Writes the config beside the results: its own text when it has one (a
// config read from OUT/config.json rewrites that file unchanged), else its
// JSON with two-space indents.
absl::Status WriteEvalConfigCopy(const EvalConfig& config, const std::string& path);

}  // namespace pdq
