// The report's inputs and JSON helpers (harness/report_internal.h).
#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "harness/report_internal.h"

namespace pdq::report {

json Load(const std::string& path) {
  std::ifstream in(path);
  if (!in) return json();
  json j = json::parse(in, nullptr, false);
  return j.is_discarded() ? json() : j;
}

double Num(const json& j, std::initializer_list<const char*> path) {
  const json* at = &j;
  for (const char* k : path) {
    if (!at->is_object() || !at->contains(k)) return NAN;
    at = &(*at)[k];
  }
  return at->is_number() ? at->get<double>() : NAN;
}

std::string F(double v, int digits) {
  return std::isfinite(v) ? absl::StrFormat("%.*f", digits, v) : "–";
}

int MaxConcurrencyWithinTargets(const BenchResult& bench) {
  int best = 0;
  const double ttft = bench.ttft_target_ms / 1e3, tpot = bench.tpot_target_ms / 1e3;
  for (const LevelResult& l : bench.levels) {
    const bool ok = l.requests_failed == 0 && (!(ttft > 0) || l.ttft_s.p90 <= ttft) &&
                    (!(tpot > 0) || l.tpot_s.p90 <= tpot);
    if (ok) best = std::max(best, l.concurrency);
  }
  return best;
}

double PeakResidentMiB(const Dep& d) {
  double peak = 0;
  for (const auto& [w, b] : d.bench) {
    for (const LevelResult& l : b.levels) {
      double sum = 0;
      for (const WorkerUsage& u : l.workers) sum += u.peak_resident_bytes;
      peak = std::max(peak, sum / 1048576);
    }
  }
  return peak > 0 ? peak : NAN;
}

HeldMiB MostHeldMiB(const Dep& d) {
  HeldMiB most;  // NaN until a level reports them: std::fmax takes the number
  for (const auto& [w, b] : d.bench) {
    for (const LevelResult& l : b.levels) {
      HeldMiB sum{0, 0, 0};
      for (const WorkerUsage& u : l.workers) {
        sum.weights += u.weight_bytes / 1048576;
        sum.kv += u.kv_used_peak_bytes / 1048576;
        sum.workspaces += u.workspace_bytes / 1048576;
      }
      if (l.workers.empty() || !std::isfinite(sum.weights)) continue;  // not reported
      most.weights = std::fmax(most.weights, sum.weights);
      most.kv = std::fmax(most.kv, sum.kv);
      most.workspaces = std::fmax(most.workspaces, sum.workspaces);
    }
  }
  return most;
}

// One process running both phases at two precisions.
bool DualPrecision(const Dep& d) {
  return d.workers.size() == 1 && d.workers[0].value("role", "both") == "both" &&
         d.workers[0].contains("prefill_precision") &&
         d.workers[0]["prefill_precision"] != d.workers[0].value("precision", "fp16");
}

std::string Processes(const json& workers) {
  std::vector<std::string> v;
  for (const json& w : workers) {
    v.push_back(absl::StrFormat("%s %s (%d thr, cpus %s)", w.value("role", "both"),
                                w.value("precision", "fp16"), w.value("threads", 0),
                                w.value("cpus", "any")));
  }
  return absl::StrJoin(v, " + ");
}

// Threads that run `phase` ("prefill" or "decode"): its own workers' and
// those of workers doing both.
int Threads(const json& workers, const std::string& phase) {
  int n = 0;
  for (const json& w : workers) {
    const std::string role = w.value("role", "both");
    if (role == phase || role == "both") n += w.value("threads", 0);
  }
  return n;
}

// One gnuplot data block: the empirical CDF of `values` (sorted here).
void AppendCdf(const std::string& name, std::vector<double> values, std::string* out) {
  std::sort(values.begin(), values.end());
  absl::StrAppendFormat(out, "# %s\n", name);
  for (size_t i = 0; i < values.size(); ++i) {
    absl::StrAppendFormat(out, "%g %g\n", values[i], (i + 1.0) / values.size());
  }
  absl::StrAppend(out, "\n\n");
}

std::string Quote(const std::string& s) { return absl::StrCat("\"", s, "\""); }

absl::StatusOr<BenchResult> ReportInput::Read(const std::string& path) {
  absl::StatusOr<BenchResult> r = ReadBenchResult(path);
  if (!r.ok() && !absl::IsNotFound(r.status())) unreadable.emplace_back(r.status().message());
  return r;
}

ReportInput LoadReportInput(const EvalConfig& config, const std::string& out_dir) {
  ReportInput in;
  in.config = config;
  in.raw = out_dir + "/raw";
  const std::string& raw = in.raw;
  for (const EvalDeployment& c : config.deployments) {
    Dep d;
    static_cast<EvalDeployment&>(d) = c;
    for (const char* w : {"chat", "summarize", "analysis"}) {
      absl::StatusOr<BenchResult> b =
          in.Read(absl::StrCat(raw, "/", d.name, "/bench-", w, ".json"));
      if (b.ok()) d.bench[w] = std::move(*b);
    }
    absl::StatusOr<BenchResult> stability =
        in.Read(absl::StrCat(raw, "/", d.name, "/stability.json"));
    if (stability.ok()) d.stability = std::move(*stability);
    in.deps.push_back(std::move(d));
  }
  for (size_t i = 0; i < in.deps.size(); ++i) {
    const Dep& d = in.deps[i];
    if (d.baseline) in.base_index = i;
    if (std::find(in.pairs.begin(), in.pairs.end(),
                  std::make_pair(d.prefill_precision, d.decode_precision)) == in.pairs.end()) {
      in.pairs.push_back({d.prefill_precision, d.decode_precision});
    }
  }
  return in;
}

}  // namespace pdq::report
