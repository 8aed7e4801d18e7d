// The report of a `pdq eval` run: report.md with tables, plots (SVG, drawn
// by gnuplot) and the study's interpretation, from the JSON under OUT/raw/.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "absl/status/statusor.h"
#include "harness/eval_config.h"

namespace pdq {

// Writes OUT/report.md and OUT/plots/; returns the short summary (the
// goodput table) for the terminal. Steps without a result are reported as
// missing, so a partial run still gets a report.
absl::StatusOr<std::string> WriteEvalReport(const EvalConfig& config, const std::string& out_dir,
                                            const std::string& command);

}  // namespace pdq
