// An A/B rollout: the share of requests each pool of workers gets. Workers
// join a pool with --pool NAME (one pool per precision pair, say "fp16" and
// "w8a8-w4a16"); the router sends each request to one pool, by weight, and
// labels its metrics with that pool, so the two arms can be compared live.
// The cluster simulator (sim/) draws each request's pool with the same
// function (At), so a simulated A/B rollout splits as the router does.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/random/random.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pdq::policy {

// A pool's name: 1 to 64 characters from [A-Za-z0-9._-].
bool ValidPoolName(std::string_view name);

class TrafficSplit {
 public:
  struct Arm {
    std::string pool;
    double weight = 0;  // > 0
  };

  // "fp16=90,w8a8-w4a16=10": pool names of 1 to 64 characters from
  // [A-Za-z0-9._-], positive weights (any scale; they are normalized),
  // each pool once. An empty spec is no split.
  static absl::StatusOr<TrafficSplit> Parse(const std::string& spec);
  // The same from pools and weights, checked as Parse checks them (its
  // errors without Parse's "--split: "). At least one arm.
  static absl::StatusOr<TrafficSplit> Make(std::vector<Arm> arms);

  bool empty() const { return arms_.empty(); }
  const std::vector<Arm>& arms() const { return arms_; }

  // The pool of one request. With `client_id` non-empty and `sticky`, a hash
  // of the id decides (the same client always lands in the same pool while
  // the split stays the same); otherwise a draw from `rng`. Never called
  // when empty(). Thread-safe given its own `rng`.
  const std::string& Choose(const std::string& client_id, bool sticky, absl::BitGen& rng) const;
  // The index in arms() of a client's sticky pool (Choose with `sticky` and
  // a non-empty id): a stable hash of the id, so the simulator's clients
  // land where the router sends the same ids.
  int IndexOfClient(std::string_view client_id) const;
  // The pool of a number uniform in [0, 1), and its index in arms().
  const std::string& At(double u) const;
  int IndexAt(double u) const;

 private:
  std::vector<Arm> arms_;
  std::vector<double> cumulative_;  // normalized, the last is 1
};

}  // namespace pdq::policy
