// The evaluation report (harness/report.h): reads the inputs once, writes
// each section (report_*.cc) and the file.
#include "harness/report.h"

#include <ctime>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "harness/report_internal.h"

namespace pdq {

absl::StatusOr<std::string> WriteEvalReport(const nlohmann::json& config,
                                            const std::string& out_dir,
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
                  absl::StrFormat("Machine: %s, %d logical CPUs; the deployments share %.0f cores. "
                                  "Model: `%s`.\n\n",
                                  CpuModel(), (int)std::thread::hardware_concurrency(), in.cores,
                                  in.config.value("model", std::string("(default)"))));

  // What the config says the reader must know (the model, the machine).
  for (const json& n : in.config.value("notes", json::array())) {
    if (n.is_string()) absl::StrAppend(&md, "> ", n.get<std::string>(), "\n>\n");
  }
  if (in.config.contains("notes")) absl::StrAppend(&md, "\n");

  absl::StrAppend(&md, DeploymentsSection(in), GoodputSection(in, &summary), AimSection(in),
                  CostSection(in));
  for (const auto& [w, spec] : in.workloads.items()) {
    absl::StrAppend(&md, WorkloadSection(in, plot, w));
  }
  absl::StrAppend(&md, DualPrecisionSection(in), AbSplitSection(in),
                  ConversationSection(config, in.raw), StabilitySection(in, plot),
                  AccuracySection(in, plot));
  if (in.accuracy.contains("code")) {
    absl::StrAppend(&md, CodeSection(in.accuracy, in.raw, in.pairs));
  }
  if (in.accuracy.contains("conversation")) absl::StrAppend(&md, LongConversationSection(in, plot));
  if (config.contains("lowbit")) absl::StrAppend(&md, LowbitSection(config, in.raw));

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
