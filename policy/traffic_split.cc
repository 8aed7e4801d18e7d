#include "policy/traffic_split.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace pdq::policy {
namespace {

// A 64-bit hash of the id that does not change between runs or builds
// (absl::Hash is salted per process): FNV-1a, then a final mix.
uint64_t StableHash(std::string_view s) {
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

bool ValidPoolName(std::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

absl::StatusOr<TrafficSplit> TrafficSplit::Parse(const std::string& spec) {
  if (absl::StripAsciiWhitespace(spec).empty()) return TrafficSplit();
  std::vector<Arm> arms;
  for (absl::string_view part : absl::StrSplit(spec, ',')) {
    part = absl::StripAsciiWhitespace(part);
    const size_t eq = part.find('=');
    if (eq == absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("--split: '", part, "' is not POOL=WEIGHT (e.g. fp16=90,w8a8-w4a16=10)"));
    }
    Arm arm;
    arm.pool = std::string(absl::StripAsciiWhitespace(part.substr(0, eq)));
    if (!absl::SimpleAtod(absl::StripAsciiWhitespace(part.substr(eq + 1)), &arm.weight)) {
      arm.weight = -1;  // Make's error names it
    }
    arms.push_back(std::move(arm));
  }
  absl::StatusOr<TrafficSplit> out = Make(std::move(arms));
  if (!out.ok())
    return absl::InvalidArgumentError(absl::StrCat("--split: ", out.status().message()));
  return out;
}

absl::StatusOr<TrafficSplit> TrafficSplit::Make(std::vector<Arm> arms) {
  if (arms.empty()) return absl::InvalidArgumentError("a split needs at least one pool");
  TrafficSplit out;
  double total = 0;
  for (Arm& arm : arms) {
    if (!ValidPoolName(arm.pool)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "pool name '", arm.pool, "' must have 1 to 64 characters of A-Z a-z 0-9 . _ -"));
    }
    if (!(arm.weight > 0) || arm.weight > 1e9) {
      return absl::InvalidArgumentError(
          absl::StrCat("the weight of pool '", arm.pool, "' must be a number above 0"));
    }
    for (const Arm& a : out.arms_) {
      if (a.pool == arm.pool) {
        return absl::InvalidArgumentError(absl::StrCat("pool '", arm.pool, "' is named twice"));
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

int TrafficSplit::IndexAt(double u) const {
  for (size_t i = 0; i < arms_.size(); ++i) {
    if (u < cumulative_[i]) return (int)i;
  }
  return (int)arms_.size() - 1;
}

const std::string& TrafficSplit::At(double u) const { return arms_[IndexAt(u)].pool; }

const std::string& TrafficSplit::Choose(const std::string& client_id, bool sticky,
                                        absl::BitGen& rng) const {
  if (sticky && !client_id.empty()) return arms_[IndexOfClient(client_id)].pool;
  return At(absl::Uniform(rng, 0.0, 1.0));
}

int TrafficSplit::IndexOfClient(std::string_view client_id) const {
  // The top 53 bits as a fraction in [0, 1).
  return IndexAt((double)(StableHash(client_id) >> 11) * 0x1.0p-53);
}

}  // namespace pdq::policy
