// The evaluation report's parts (harness/report.h), shared by its files:
// the inputs read once from the config and OUT/raw/, the JSON helpers, and
// one function per section, each returning its markdown.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "harness/bench_result.h"
#include "harness/eval_config.h"
#include "harness/plot.h"

namespace pdq::report {

using json = nlohmann::json;

// The file's JSON, or null when it is missing or malformed (a step that did
// not run is reported as not measured).
json Load(const std::string& path);
// The number at `path` in `j`, NaN where it is missing.
double Num(const json& j, std::initializer_list<const char*> path);
// `v` with `digits` decimals, or "–" when it is not finite.
std::string F(double v, int digits = 2);
std::string Quote(const std::string& s);

// A deployment (as configured) and its measurements.
struct Dep : EvalDeployment {
  std::map<std::string, BenchResult> bench;  // by workload
  std::optional<BenchResult> stability;
  // The workload's result; null where it was not measured.
  const BenchResult* Bench(const std::string& workload) const {
    auto it = bench.find(workload);
    return it == bench.end() ? nullptr : &it->second;
  }
};

// What every section reads: the config and the deployments' results.
struct ReportInput {
  EvalConfig config;
  std::string raw;        // OUT/raw
  std::vector<Dep> deps;  // in the config's order
  size_t base_index = 0;  // the baseline's (the first unless one says so)
  const Dep& base() const { return deps[base_index]; }
  std::vector<std::pair<std::string, std::string>> pairs;  // prefill/decode precisions, once each
  std::vector<std::string> unreadable;  // results that exist but could not be read, with why
  // A bench result file: a missing one is NotFound (the step did not run);
  // one that cannot be read is also noted in `unreadable` for the report.
  absl::StatusOr<BenchResult> Read(const std::string& path);
};
ReportInput LoadReportInput(const EvalConfig& config, const std::string& out_dir);

// The highest concurrency whose p90 TTFT and p90 TPOT are within the targets
// with no request failed; 0 where none is.
int MaxConcurrencyWithinTargets(const BenchResult& bench);
double PeakResidentMiB(const Dep& d);
// What the deployment's processes reported holding, summed over them, the
// most at any level (MiB): weights, KV that held data (in use or kept by the
// prefix cache), workspaces. NaN where the workers did not report them.
struct HeldMiB {
  double weights = NAN, kv = NAN, workspaces = NAN;
};
HeldMiB MostHeldMiB(const Dep& d);
// One process running both phases at two precisions.
bool DualPrecision(const Dep& d);
std::string Processes(const json& workers);
// Threads that run `phase` ("prefill" or "decode"): its own workers' and
// those of workers doing both.
int Threads(const json& workers, const std::string& phase);
// One gnuplot data block: the empirical CDF of `values` (sorted here).
void AppendCdf(const std::string& name, std::vector<double> values, std::string* out);

// The sections, in the report's order (report_serving.cc, report_accuracy.cc,
// report_lowbit.cc, report_cluster.cc).
std::string DeploymentsSection(const ReportInput& in);
std::string GoodputSection(const ReportInput& in, std::string* summary_out);
std::string AimSection(const ReportInput& in);
std::string CostSection(const ReportInput& in);
std::string WorkloadSection(const ReportInput& in, Plotter& plot, const std::string& w);
std::string DualPrecisionSection(const ReportInput& in);
std::string AbSplitSection(const ReportInput& in);
std::string ConversationSection(const EvalConfig& config, const std::string& raw);
std::string StabilitySection(const ReportInput& in, Plotter& plot);
std::string AccuracySection(const ReportInput& in, Plotter& plot);
std::string CodeSection(const EvalAccuracy& acc, const std::string& raw,
                        const std::vector<std::pair<std::string, std::string>>& pairs);
std::string LongConversationSection(const ReportInput& in, Plotter& plot);
std::string LowbitSection(const EvalLowbit& lowbit, const std::string& raw);
// config.cluster must be set (report_cluster.cc).
std::string ClusterSection(const EvalConfig& config, const std::string& raw, Plotter& plot);

}  // namespace pdq::report
