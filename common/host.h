// The machine a figure was measured on, for reports and JSON results.
#pragma once

#include <fstream>
#include <string>

#include "absl/strings/ascii.h"

namespace pdq {

// The CPU's model name as /proc/cpuinfo gives it ("AMD EPYC", "Intel(R)
// Xeon(R) Processor"); "unknown CPU" where there is none.
inline std::string CpuModelName() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon != std::string::npos) {
      return std::string(absl::StripAsciiWhitespace(line.substr(colon + 1)));
    }
  }
  return "unknown CPU";
}

}  // namespace pdq
