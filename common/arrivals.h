// What the load generator sends and the simulator predicts, defined once so
// that a simulated run can be set beside a real one request for request:
// open-loop (Poisson) arrival times (`pdq bench --rate R --arrival-seed S`,
// `pdq sim --rate R --seed S`) and the closed-loop clients' ids (`pdq bench
// --client-ids`, `pdq sim --split-sticky --client-ids`).
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace pdq {

// `n` arrival times in seconds from the start: the first at 0, then gaps of
// an exponential distribution of mean 1 / rate drawn from mt19937_64(seed).
inline std::vector<double> PoissonArrivalTimes(double rate, int64_t n, uint64_t seed) {
  std::vector<double> times;
  times.reserve(n > 0 ? (size_t)n : 0);
  std::mt19937_64 rng(seed);
  std::exponential_distribution<double> gap(rate);
  double t = 0;
  for (int64_t i = 0; i < n; ++i) {
    times.push_back(t);
    t += gap(rng);
  }
  return times;
}

// The client id closed-loop client `client` (from 0) sends with every
// request: a router splitting an A/B rollout sticky per client
// (--split-sticky) then sends all of one client's requests to one pool, the
// one the simulator's client of the same number lands in.
inline std::string BenchClientId(int client) { return "bench-client-" + std::to_string(client); }

}  // namespace pdq
