#include "serving_cluster.h"

#include "server/metrics.h"

namespace pdq::testing {

double Metric(const std::string& metrics_address, const std::string& series) {
  absl::StatusOr<std::map<std::string, double>> samples = server::ScrapeMetrics(metrics_address);
  if (!samples.ok()) return -1;
  auto it = samples->find(series);
  return it == samples->end() ? -1 : it->second;
}

}  // namespace pdq::testing
