// Open-loop (Poisson) arrival times, one definition for the load generator
// that sends them (`pdq bench --rate R --arrival-seed S`) and the simulator
// that predicts them (`pdq sim --rate R --seed S`), so a simulated run can
// be set beside a real one request for request.
#pragma once

#include <cstdint>
#include <random>
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

}  // namespace pdq
