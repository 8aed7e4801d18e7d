// The evaluation report (harness/report.h): reads the inputs once, writes
// each section (report_*.cc) and the file.
#include "harness/report.h"

#include <ctime>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/host.h"
#include "harness/report_internal.h"

namespace pdq {

absl::StatusOr<std::string> WriteEvalReport(const EvalConfig& config, const std::string& out_dir,
                                            const std::string& command) {
  using namespace report;
  const ReportInput in = LoadReportInput(config, out_dir);
  Plotter plot(out_dir + "/plots");
  std::string md, summary;
  char date[64];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  absl::StrAppend(&md, "# pdq evaluation: does phase-specific quantization pay?\n\n", "Written ",
                  date, " by `", command, "`.\n\n",
                  absl::StrFormat("Written on: %s, %d logical CPUs (the machines the runs "
                                  "took, where they differ, are in the notes below); the "
                                  "deployments share %.0f cores. Model: `%s`.\n\n",
                                  CpuModelName(), (int)std::thread::hardware_concurrency(),
                                  config.cores, config.model.empty() ? "(default)" : config.model));

  // What the config says the reader must know (the model, the machine).
  for (const std::string& n : config.notes) absl::StrAppend(&md, "> ", n, "\n>\n");
  if (!config.notes.empty()) absl::StrAppend(&md, "\n");

  absl::StrAppend(&md, DeploymentsSection(in), GoodputSection(in, &summary), AimSection(in),
                  CostSection(in));
  for (const EvalWorkload& w : config.workloads) {
    absl::StrAppend(&md, WorkloadSection(in, plot, w.name));
  }
  absl::StrAppend(&md, DualPrecisionSection(in), AbSplitSection(in),
                  ConversationSection(config, in.raw), StabilitySection(in, plot),
                  AccuracySection(in, plot));
  if (!config.accuracy.code.empty()) {
    absl::StrAppend(&md, CodeSection(config.accuracy, in.raw, in.pairs));
  }
  if (!config.accuracy.conversation.empty()) {
    absl::StrAppend(&md, LongConversationSection(in, plot));
  }
  if (config.lowbit) absl::StrAppend(&md, LowbitSection(*config.lowbit, in.raw));
  if (config.cluster) absl::StrAppend(&md, ClusterSection(config, in.raw, plot));

  absl::StrAppend(
      &md,
      "## Raw data\n\nEvery step's JSON is under `raw/` (per deployment: `bench-<workload>.json` "
      "with every request's record and per-level worker resources, `stability.json`, the `pdq up` "
      "config and log; `accuracy/`: `pdq perplexity` and `pdq drift` output). `pdq eval report "
      "--out DIR` rewrites this file from them.\n");
  for (const std::string& why : in.unreadable) {
    absl::StrAppend(&md, "\nNot in this report (unreadable): ", why, "\n");
  }
  if (!plot.available()) {
    absl::StrAppend(&md,
                    "\nPlots were not drawn: gnuplot is not installed (scripts/install_deps.sh "
                    "installs gnuplot-nox); their data and scripts are in plots/.\n");
  }
  std::ofstream f(out_dir + "/report.md");
  f << md;
  if (!f) return absl::UnavailableError(absl::StrCat("cannot write ", out_dir, "/report.md"));
  return summary;
}

}  // namespace pdq
