#include "serving_cluster.h"

#include <httplib.h>

namespace pdq::testing {

double Metric(const std::string& metrics_address, const std::string& series) {
  const size_t colon = metrics_address.rfind(':');
  httplib::Client client(metrics_address.substr(0, colon),
                         std::stoi(metrics_address.substr(colon + 1)));
  client.set_read_timeout(10);
  httplib::Result r = client.Get("/metrics");
  if (!r || r->status != 200) return -1;
  std::istringstream lines(r->body);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.size() > series.size() && line.compare(0, series.size(), series) == 0 &&
        line[series.size()] == ' ') {
      return std::stod(line.substr(series.size() + 1));
    }
  }
  return -1;
}

}  // namespace pdq::testing
