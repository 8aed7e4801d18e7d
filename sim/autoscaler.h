// A Kubernetes HorizontalPodAutoscaler (autoscaling/v2) as its controller
// computes it, so `pdq sim` can replay a deployment's own autoscalers
// (deploy/k8s/base) on a trace: every sync period each metric proposes
// ceil(ready pods x average / target) (within the tolerance, no change; a
// pod that reports no metric yet counts as 0 when scaling up and as the
// target when scaling down), the largest proposal wins, the stabilization
// windows keep the highest recommendation of the scale-down window and the
// lowest of the scale-up window, and the scaling policies limit how many
// pods a period may add or remove (kube-controller-manager's
// pkg/controller/podautoscaler, replica_calculator.go and horizontal.go).
// What it leaves out: the metrics pipeline's lag (Prometheus scrape and the
// adapter's rate windows: the controller here reads the pods' values at
// the sync), and resource (CPU) metrics, which pdq's manifests do not use.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace pdq::sim {

// The pod metrics pdq's workers export that an HPA can target.
enum class PodMetric {
  kQueuedPromptTokens,  // pdq_queued_prompt_tokens
  kActiveSequences,     // pdq_active_sequences
  kKvBlocksUsedRatio,   // pdq_kv_blocks_used_ratio
};
inline constexpr int kPodMetrics = 3;

struct MetricTarget {
  PodMetric metric = PodMetric::kActiveSequences;
  double average_value = 1;  // type AverageValue: per pod
};

struct ScalingPolicy {
  enum class Type { kPods, kPercent } type = Type::kPods;
  int value = 1;
  double period_seconds = 15;
};

// behavior.scaleUp or behavior.scaleDown.
struct ScalingRules {
  double stabilization_window_seconds = 0;
  enum class Select { kMax, kMin, kDisabled } select = Select::kMax;
  std::vector<ScalingPolicy> policies;
};

struct HpaSpec {
  int min_replicas = 1, max_replicas = 10;
  std::vector<MetricTarget> metrics;
  // Kubernetes' defaults: up at once by 100% or 4 pods (the more) per 15 s;
  // down by up to 100% per 15 s after a 300 s window.
  ScalingRules scale_up{
      0,
      ScalingRules::Select::kMax,
      {{ScalingPolicy::Type::kPercent, 100, 15}, {ScalingPolicy::Type::kPods, 4, 15}}};
  ScalingRules scale_down{
      300, ScalingRules::Select::kMax, {{ScalingPolicy::Type::kPercent, 100, 15}}};
  // The controller's flags: --horizontal-pod-autoscaler-sync-period and
  // --horizontal-pod-autoscaler-tolerance.
  double sync_seconds = 15;
  double tolerance = 0.1;
};

absl::Status ValidateHpa(const HpaSpec& h);

// What the controller reads at a sync: the pool's pods that report the
// metrics, each with its value of every PodMetric, and how many more pods
// the Deployment has that report none yet (starting).
struct PoolMetrics {
  std::vector<std::array<double, kPodMetrics>> ready;
  int missing = 0;
};

class HpaController {
 public:
  explicit HpaController(HpaSpec spec) : spec_(std::move(spec)) {}
  const HpaSpec& spec() const { return spec_; }
  // One sync at time `now` (seconds) of a Deployment of `current` replicas:
  // the replicas it sets (`current` when it leaves them).
  int Sync(double now, int current, const PoolMetrics& m);

 private:
  // One metric's proposal, or `current` where it has nothing to say.
  int Propose(const MetricTarget& t, int current, const PoolMetrics& m) const;
  int ScaleLimit(const ScalingRules& r, int current, double now, bool up) const;
  int ChangeWithin(double period, double now, bool up) const;

  HpaSpec spec_;
  struct Recommendation {
    double time;
    int replicas;
  };
  std::vector<Recommendation> recommendations_;
  bool synced_ = false;
  struct ScaleEvent {
    double time;
    int change;  // pods added (> 0) or removed (< 0)
  };
  std::vector<ScaleEvent> events_;
};

// One HorizontalPodAutoscaler object in Kubernetes' own JSON (as
// `kubectl get hpa -o json` or the rendered manifests give it): minReplicas,
// maxReplicas, Pods metrics with AverageValue targets (quantities such as
// "700m" or "32"), behavior. The pool it scales is its scaleTargetRef's
// name: one containing "prefill", "decode" or neither (monolithic).
struct PoolHpa {
  enum class Pool { kPrefill, kDecode, kMonolithic } pool = Pool::kMonolithic;
  std::string name;
  HpaSpec spec;
};
// A HorizontalPodAutoscaler, a List of objects or an array of them (other
// kinds skipped); errors name the field.
absl::StatusOr<std::vector<PoolHpa>> HpasFromJson(const std::string& text);
// The same from a file; errors name it.
absl::StatusOr<std::vector<PoolHpa>> ReadHpas(const std::string& path);
// "700m" -> 0.7, "32" -> 32, "1k" -> 1000.
absl::StatusOr<double> ParseQuantity(const std::string& q);

}  // namespace pdq::sim
