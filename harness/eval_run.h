// The evaluation behind `pdq eval`: for each deployment of a config it
// starts `pdq up`, runs `pdq bench` for the standard workloads over a
// concurrency sweep and, where asked, the alternating-load stability test
// and multi-turn conversations with the prefix cache on and off; then the
// accuracy suite (`pdq perplexity` on several texts, `pdq code-eval` on
// HumanEval, `pdq drift` on prompts and a conversation) for each precision
// pair against FP16, `pdq bench-engine` on each kernel path (where
// low-bit stops paying), and the cluster-scale projections (`pdq profile`,
// then `pdq plan --sim --cluster-nodes` per workload).
//
// Every step is a child process writing one JSON file under OUT/raw/, kept
// as soon as it is complete: an interrupted run keeps what it measured, and
// running again resumes, skipping the steps whose files exist. Progress,
// "[k/n] what", goes to stderr. SIGINT and SIGTERM stop the running step
// (harness/local_run.h).
#pragma once

#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "harness/eval_config.h"

namespace pdq {

struct EvalRunOptions {
  std::string out_dir;         // raw/ goes here
  std::string pdq;             // the `pdq` executable the steps run
  std::string default_model;   // where the config names no model
  std::set<std::string> only;  // the deployments to run; empty: all (each must exist)
  bool skip_serving = false, skip_stability = false, skip_accuracy = false, skip_lowbit = false;
  bool skip_cluster = false;
};

struct EvalRunOutcome {
  int failures = 0;          // steps that wrote no result (each said why on stderr)
  bool interrupted = false;  // SIGINT or SIGTERM arrived
};

// Runs every step whose result is missing under OUT/raw/ and writes
// OUT/config.json. An error when OUT cannot be written or `only` names no
// deployment; a step that fails is counted, and the others go on.
absl::StatusOr<EvalRunOutcome> RunEvaluation(const EvalConfig& config, const EvalRunOptions& o);

}  // namespace pdq
