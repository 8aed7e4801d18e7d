// `pdq eval`: the evaluation of a config (harness/eval_run.h), then its
// report (harness/report.h).
#include <cstdio>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "harness/eval_config.h"
#include "harness/eval_run.h"
#include "harness/local_run.h"
#include "harness/report.h"
#include "tools/commands.h"

namespace pdq {
namespace {

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
  bool skip_cluster = false;
  flags.Bool("skip-cluster", &skip_cluster,
             "no cluster-scale projection (a profile of this machine, then the simulator)");
  if (int rc = ParseOrExit(flags, argc, argv); rc >= 0) return rc;
  if (config_path.empty() || out_dir.empty()) {
    return Fail("eval", absl::InvalidArgumentError("--config and --out are required"));
  }
  absl::StatusOr<EvalConfig> config = ReadEvalConfig(config_path);
  if (!config.ok()) return Fail("eval", config.status());
  EvalRunOptions o;
  o.out_dir = out_dir;
  o.pdq = SelfPath();
  o.default_model = DefaultModelPath();
  for (absl::string_view n : absl::StrSplit(only, ',', absl::SkipEmpty())) {
    o.only.insert(std::string(n));
  }
  o.skip_serving = skip_serving;
  o.skip_stability = skip_stability;
  o.skip_accuracy = skip_accuracy;
  o.skip_lowbit = skip_lowbit;
  o.skip_cluster = skip_cluster;
  absl::StatusOr<EvalRunOutcome> run = RunEvaluation(*config, o);
  if (!run.ok()) return Fail("eval", run.status());
  absl::StatusOr<std::string> report = WriteEvalReport(
      *config, out_dir, absl::StrCat("pdq eval --config ", config_path, " --out ", out_dir));
  if (!report.ok()) return Fail("eval", report.status());
  std::printf("%s", report->c_str());
  std::printf("pdq eval: report at %s/report.md%s\n", out_dir.c_str(),
              run->interrupted ? " (interrupted: it holds what was measured; run again to resume)"
              : run->failures
                  ? absl::StrCat(" (", run->failures, " steps failed; see above)").c_str()
                  : "");
  return run->interrupted ? 130 : run->failures ? 1 : 0;
}

int RewriteReport(int argc, char** argv) {
  std::string config_path, out_dir;
  FlagParser flags("eval report", "Rewrites OUT/report.md from the JSON under OUT/raw/.");
  flags.String("out", &out_dir, "the folder of a pdq eval run");
  flags.String("config", &config_path, "the config (default: OUT/config.json)");
  if (int rc = ParseOrExit(flags, argc, argv, 3, "pdq eval report"); rc >= 0) return rc;
  if (out_dir.empty()) return Fail("eval report", absl::InvalidArgumentError("--out is required"));
  if (config_path.empty()) config_path = out_dir + "/config.json";
  absl::StatusOr<EvalConfig> config = ReadEvalConfig(config_path);
  if (!config.ok()) return Fail("eval report", config.status());
  absl::StatusOr<std::string> report =
      WriteEvalReport(*config, out_dir, absl::StrCat("pdq eval report --out ", out_dir));
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
