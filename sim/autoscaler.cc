#include "sim/autoscaler.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace pdq::sim {

using nlohmann::json;

absl::Status ValidateHpa(const HpaSpec& h) {
  if (h.min_replicas < 1 || h.max_replicas < h.min_replicas) {
    return absl::InvalidArgumentError("an HPA needs 1 <= minReplicas <= maxReplicas");
  }
  if (h.metrics.empty()) return absl::InvalidArgumentError("an HPA needs a metric");
  for (const MetricTarget& m : h.metrics) {
    if (!(m.average_value > 0) || !std::isfinite(m.average_value)) {
      return absl::InvalidArgumentError("an HPA metric's averageValue must be > 0");
    }
  }
  for (const ScalingRules* r : {&h.scale_up, &h.scale_down}) {
    if (!(r->stabilization_window_seconds >= 0)) {
      return absl::InvalidArgumentError("stabilizationWindowSeconds must be >= 0");
    }
    if (r->select != ScalingRules::Select::kDisabled && r->policies.empty()) {
      return absl::InvalidArgumentError(
          "scaling rules need a policy unless selectPolicy is Disabled");
    }
    for (const ScalingPolicy& p : r->policies) {
      if (p.value < 1 || !(p.period_seconds > 0)) {
        return absl::InvalidArgumentError(
            "a scaling policy needs value >= 1 and periodSeconds > 0");
      }
    }
  }
  if (!(h.sync_seconds > 0) || !(h.tolerance >= 0)) {
    return absl::InvalidArgumentError("the HPA sync period must be > 0 and the tolerance >= 0");
  }
  return absl::OkStatus();
}

// replica_calculator.go, calcPlainMetricReplicas: pods without the metric
// are "missing"; they count as the target on a scale-down and as 0 on a
// scale-up, and a recount that flips the direction or lands within the
// tolerance changes nothing.
int HpaController::Propose(const MetricTarget& t, int current, const PoolMetrics& m) const {
  const int n = (int)m.ready.size();
  if (n == 0) return current;  // no metrics: the HPA cannot compute a proposal
  double sum = 0;
  for (const auto& pod : m.ready) sum += pod[static_cast<int>(t.metric)];
  const double ratio = sum / n / t.average_value;
  if (m.missing == 0) {
    if (std::abs(1 - ratio) <= spec_.tolerance) return current;
    return (int)std::ceil(ratio * n);
  }
  if (ratio < 1) sum += m.missing * t.average_value;
  const int all = n + m.missing;
  const double recount = sum / all / t.average_value;
  if (std::abs(1 - recount) <= spec_.tolerance || (ratio < 1 && recount > 1) ||
      (ratio > 1 && recount < 1)) {
    return current;
  }
  const int proposal = (int)std::ceil(recount * all);
  if ((recount < 1 && proposal > current) || (recount > 1 && proposal < current)) return current;
  return proposal;
}

// Pods added (up) or removed (down) by this HPA in the last `period`.
int HpaController::ChangeWithin(double period, double now, bool up) const {
  int change = 0;
  for (const ScaleEvent& e : events_) {
    if (e.time > now - period && (e.change > 0) == up) change += std::abs(e.change);
  }
  return change;
}

// horizontal.go, calculateScaleUpLimitWithScalingRules and
// calculateScaleDownLimitWithBehaviors: each policy counts from the
// replicas the Deployment had at the start of its period.
int HpaController::ScaleLimit(const ScalingRules& r, int current, double now, bool up) const {
  using Select = ScalingRules::Select;
  if (r.select == Select::kDisabled) return current;
  // Max picks the policy allowing the most change, Min the least.
  const bool most_change = r.select == Select::kMax;
  int result =
      (most_change == up) ? std::numeric_limits<int>::min() : std::numeric_limits<int>::max();
  for (const ScalingPolicy& p : r.policies) {
    const int start = current - ChangeWithin(p.period_seconds, now, true) +
                      ChangeWithin(p.period_seconds, now, false);
    int proposed;
    if (p.type == ScalingPolicy::Type::kPods) {
      proposed = up ? start + p.value : start - p.value;
    } else if (up) {
      proposed = (int)std::ceil(start * (1 + p.value / 100.0));
    } else {
      proposed = (int)(start * (1 - p.value / 100.0));
    }
    result = (most_change == up) ? std::max(result, proposed) : std::min(result, proposed);
  }
  return result;
}

int HpaController::Sync(double now, int current, const PoolMetrics& m) {
  int desired;
  if (current > spec_.max_replicas) {
    desired = spec_.max_replicas;
  } else if (current < spec_.min_replicas) {
    desired = spec_.min_replicas;
  } else {
    // Every metric proposes; the largest wins.
    int proposal = 0;
    for (const MetricTarget& t : spec_.metrics)
      proposal = std::max(proposal, Propose(t, current, m));
    // A new HPA starts its scale-down window from the current replicas
    // (maybeInitScaleDownStabilizationWindow).
    if (!synced_ && spec_.scale_down.stabilization_window_seconds > 0) {
      recommendations_.push_back({now, current});
    }
    synced_ = true;
    // Stabilization: the lowest recommendation of the scale-up window and
    // the highest of the scale-down window bound this one.
    int up = proposal, down = proposal;
    const double up_cutoff = now - spec_.scale_up.stabilization_window_seconds;
    const double down_cutoff = now - spec_.scale_down.stabilization_window_seconds;
    for (const Recommendation& r : recommendations_) {
      if (r.time > up_cutoff) up = std::min(up, r.replicas);
      if (r.time > down_cutoff) down = std::max(down, r.replicas);
    }
    std::erase_if(recommendations_, [&](const Recommendation& r) {
      return r.time < up_cutoff && r.time < down_cutoff;
    });
    recommendations_.push_back({now, proposal});
    desired = std::min(std::max(current, up), down);
    // The policies' rate limits, then minReplicas and maxReplicas.
    if (desired > current) {
      const int limit = std::max(current, ScaleLimit(spec_.scale_up, current, now, true));
      desired = std::min({desired, limit, spec_.max_replicas});
    } else if (desired < current) {
      const int limit = std::min(current, ScaleLimit(spec_.scale_down, current, now, false));
      desired = std::max({desired, limit, spec_.min_replicas});
    }
  }
  if (desired != current) {
    events_.push_back({now, desired - current});
    double longest = 0;
    for (const ScalingRules* r : {&spec_.scale_up, &spec_.scale_down})
      for (const ScalingPolicy& p : r->policies) longest = std::max(longest, p.period_seconds);
    std::erase_if(events_, [&](const ScaleEvent& e) { return e.time <= now - longest; });
  }
  return desired;
}

absl::StatusOr<double> ParseQuantity(const std::string& q) {
  static constexpr std::pair<const char*, double> kSuffixes[] = {
      {"Ki", 1024.0}, {"Mi", 1048576.0}, {"Gi", 1073741824.0}, {"m", 1e-3}, {"k", 1e3},
      {"M", 1e6},     {"G", 1e9}};
  std::string number = q;
  double scale = 1;
  for (const auto& [suffix, factor] : kSuffixes) {
    const std::string s = suffix;
    if (q.size() > s.size() && q.compare(q.size() - s.size(), s.size(), s) == 0) {
      number = q.substr(0, q.size() - s.size());
      scale = factor;
      break;
    }
  }
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(number, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != number.size() || !std::isfinite(v)) {
    return absl::InvalidArgumentError(absl::StrCat("not a quantity: '", q, "'"));
  }
  return v * scale;
}

namespace {

absl::StatusOr<PodMetric> MetricNamed(const std::string& name) {
  if (name == "pdq_queued_prompt_tokens") return PodMetric::kQueuedPromptTokens;
  if (name == "pdq_active_sequences") return PodMetric::kActiveSequences;
  if (name == "pdq_kv_blocks_used_ratio") return PodMetric::kKvBlocksUsedRatio;
  return absl::InvalidArgumentError(
      absl::StrCat("metric '", name,
                   "': the simulator knows pdq_queued_prompt_tokens, pdq_active_sequences and "
                   "pdq_kv_blocks_used_ratio"));
}

absl::Status RulesFromJson(const json& j, const std::string& where, ScalingRules* r) {
  if (j.contains("stabilizationWindowSeconds")) {
    r->stabilization_window_seconds = j.at("stabilizationWindowSeconds").get<double>();
  }
  if (j.contains("selectPolicy")) {
    const std::string s = j.at("selectPolicy").get<std::string>();
    if (s == "Max") {
      r->select = ScalingRules::Select::kMax;
    } else if (s == "Min") {
      r->select = ScalingRules::Select::kMin;
    } else if (s == "Disabled") {
      r->select = ScalingRules::Select::kDisabled;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(where, ".selectPolicy: unknown '", s, "'"));
    }
  }
  if (j.contains("policies")) {
    r->policies.clear();
    for (const json& p : j.at("policies")) {
      ScalingPolicy sp;
      const std::string type = p.at("type").get<std::string>();
      if (type == "Pods") {
        sp.type = ScalingPolicy::Type::kPods;
      } else if (type == "Percent") {
        sp.type = ScalingPolicy::Type::kPercent;
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ".policies: unknown type '", type, "'"));
      }
      sp.value = p.at("value").get<int>();
      sp.period_seconds = p.at("periodSeconds").get<double>();
      r->policies.push_back(sp);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<PoolHpa> HpaFromJson(const json& o) {
  PoolHpa h;
  h.name = o.value("/metadata/name"_json_pointer, std::string("hpa"));
  const std::string where = "HorizontalPodAutoscaler " + h.name;
  if (!o.contains("spec")) return absl::InvalidArgumentError(where + ": no spec");
  const json& s = o.at("spec");
  const std::string target = s.value("/scaleTargetRef/name"_json_pointer, std::string());
  h.pool = target.find("prefill") != std::string::npos  ? PoolHpa::Pool::kPrefill
           : target.find("decode") != std::string::npos ? PoolHpa::Pool::kDecode
                                                        : PoolHpa::Pool::kMonolithic;
  h.spec.min_replicas = s.value("minReplicas", 1);
  if (!s.contains("maxReplicas")) return absl::InvalidArgumentError(where + ": no maxReplicas");
  h.spec.max_replicas = s.at("maxReplicas").get<int>();
  for (const json& m : s.value("metrics", json::array())) {
    if (m.value("type", std::string()) != "Pods") {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": only Pods metrics are simulated (pdq's worker metrics)"));
    }
    const json& pods = m.at("pods");
    absl::StatusOr<PodMetric> metric = MetricNamed(pods.at("metric").at("name").get<std::string>());
    if (!metric.ok())
      return absl::InvalidArgumentError(absl::StrCat(where, ": ", metric.status().message()));
    const json& t = pods.at("target");
    if (t.value("type", std::string()) != "AverageValue") {
      return absl::InvalidArgumentError(where + ": Pods targets are AverageValue");
    }
    const json& v = t.at("averageValue");
    absl::StatusOr<double> value = v.is_number() ? absl::StatusOr<double>(v.get<double>())
                                                 : ParseQuantity(v.get<std::string>());
    if (!value.ok())
      return absl::InvalidArgumentError(absl::StrCat(where, ": ", value.status().message()));
    h.spec.metrics.push_back({*metric, *value});
  }
  if (s.contains("behavior")) {
    const json& b = s.at("behavior");
    if (b.contains("scaleUp")) {
      if (absl::Status st = RulesFromJson(b.at("scaleUp"), where + ".scaleUp", &h.spec.scale_up);
          !st.ok())
        return st;
    }
    if (b.contains("scaleDown")) {
      if (absl::Status st =
              RulesFromJson(b.at("scaleDown"), where + ".scaleDown", &h.spec.scale_down);
          !st.ok())
        return st;
    }
  }
  if (absl::Status st = ValidateHpa(h.spec); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", st.message()));
  }
  return h;
}

}  // namespace

absl::StatusOr<std::vector<PoolHpa>> HpasFromJson(const std::string& text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError("the HPA file is not JSON");
  json items = j.is_array() ? j : j.contains("items") ? j.at("items") : json::array({j});
  std::vector<PoolHpa> out;
  try {
    for (const json& o : items) {
      if (!o.is_object() || o.value("kind", std::string()) != "HorizontalPodAutoscaler") continue;
      absl::StatusOr<PoolHpa> h = HpaFromJson(o);
      if (!h.ok()) return h.status();
      for (const PoolHpa& other : out) {
        if (other.pool == h->pool) {
          return absl::InvalidArgumentError(
              absl::StrCat("two HPAs (", other.name, ", ", h->name, ") scale the same pool"));
        }
      }
      out.push_back(std::move(*h));
    }
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("the HPA file: ", e.what()));
  }
  if (out.empty()) return absl::InvalidArgumentError("the file holds no HorizontalPodAutoscaler");
  return out;
}

absl::StatusOr<std::vector<PoolHpa>> ReadHpas(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read the HPA file ", path));
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<std::vector<PoolHpa>> h = HpasFromJson(text.str());
  if (!h.ok())
    return absl::Status(h.status().code(), absl::StrCat(path, ": ", h.status().message()));
  return h;
}

}  // namespace pdq::sim
