#include "router/traffic_split.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "server/metrics.h"

namespace pdq::router {
namespace {

// A 64-bit hash of the id that does not change between runs or builds
// (absl::Hash is salted per process): FNV-1a, then a final mix.
uint64_t StableHash(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return h;
}

}  // namespace

absl::StatusOr<TrafficSplit> TrafficSplit::Parse(const std::string& spec) {
  TrafficSplit out;
  if (absl::StripAsciiWhitespace(spec).empty()) return out;
  double total = 0;
  for (absl::string_view part : absl::StrSplit(spec, ',')) {
    part = absl::StripAsciiWhitespace(part);
    const size_t eq = part.find('=');
    if (eq == absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("--split: '", part, "' is not POOL=WEIGHT (e.g. fp16=90,w8a8-w4a16=10)"));
    }
    Arm arm;
    arm.pool = std::string(absl::StripAsciiWhitespace(part.substr(0, eq)));
    if (!server::ValidPoolName(arm.pool)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--split: pool name '", arm.pool, "' must have 1 to 64 characters of A-Z a-z 0-9 . _ -"));
    }
    if (!absl::SimpleAtod(absl::StripAsciiWhitespace(part.substr(eq + 1)), &arm.weight) ||
        !(arm.weight > 0) || arm.weight > 1e9) {
      return absl::InvalidArgumentError(
          absl::StrCat("--split: the weight of pool '", arm.pool, "' must be a number above 0"));
    }
    for (const Arm& a : out.arms_) {
      if (a.pool == arm.pool) {
        return absl::InvalidArgumentError(
            absl::StrCat("--split: pool '", arm.pool, "' is named twice"));
      }
    }
    total += arm.weight;
    out.arms_.push_back(std::move(arm));
  }
  double running = 0;
  for (const Arm& a : out.arms_) {
    running += a.weight;
    out.cumulative_.push_back(running / total);
  }
  out.cumulative_.back() = 1.0;
  return out;
}

const std::string& TrafficSplit::At(double u) const {
  for (size_t i = 0; i < arms_.size(); ++i) {
    if (u < cumulative_[i]) return arms_[i].pool;
  }
  return arms_.back().pool;
}

const std::string& TrafficSplit::Choose(const std::string& client_id, bool sticky,
                                        absl::BitGen& rng) const {
  if (sticky && !client_id.empty()) {
    // The top 53 bits as a fraction in [0, 1).
    return At((double)(StableHash(client_id) >> 11) * 0x1.0p-53);
  }
  return At(absl::Uniform(rng, 0.0, 1.0));
}

}  // namespace pdq::router
