// The simulator's HPA controller (sim/autoscaler.h) against the rules of
// Kubernetes' horizontal pod autoscaler, worked by hand: the proposal
// ceil(pods x average / target), the tolerance, pods without metrics, the
// stabilization windows and the scaling policies.
#include "sim/autoscaler.h"

#include "gtest/gtest.h"

namespace pdq::sim {
namespace {

HpaSpec OnSequences(double target, int max_replicas = 10) {
  HpaSpec h;
  h.max_replicas = max_replicas;
  h.metrics = {{PodMetric::kActiveSequences, target}};
  return h;
}

// Ready pods with these active sequences (other metrics 0).
PoolMetrics Sequences(std::initializer_list<double> values, int missing = 0) {
  PoolMetrics m;
  for (double v : values) m.ready.push_back({0, v, 0});
  m.missing = missing;
  return m;
}

TEST(HpaTest, ProposesTheCeilingOfPodsTimesAverageOverTarget) {
  HpaController c(OnSequences(16));
  // (40 + 30) / 2 / 16 = 2.19 of the target: ceil(2 x 2.19) = 5 pods.
  EXPECT_EQ(c.Sync(15, 2, Sequences({40, 30})), 5);
}

TEST(HpaTest, WithinTheToleranceNothingChanges) {
  HpaController c(OnSequences(16));
  EXPECT_EQ(c.Sync(15, 2, Sequences({17, 18})), 2);  // 1.09 of the target
  EXPECT_EQ(c.Sync(30, 2, Sequences({18, 18})), 3);  // 1.125: ceil(2.25)
}

TEST(HpaTest, PodsWithoutMetricsCountAsZeroWhenScalingUp) {
  HpaController c(OnSequences(16));
  // One ready pod at 1.25x the target and two starting: counted as 0, the
  // average is 0.42x, which would reverse the direction: no change (left
  // alone, the ready pod alone would have proposed 2 and removed a
  // starting pod).
  EXPECT_EQ(c.Sync(15, 3, Sequences({20}, 2)), 3);
  // At 4x with one starting pod: (64 + 0) / 2 = 2x: ceil(2 x 2) = 4.
  EXPECT_EQ(c.Sync(30, 2, Sequences({64}, 1)), 4);
}

TEST(HpaTest, PodsWithoutMetricsCountAsTheTargetWhenScalingDown) {
  HpaSpec h = OnSequences(16);
  h.scale_down.stabilization_window_seconds = 0;
  HpaController c(h);
  // One idle ready pod and one starting: (0 + 16) / 2 = 0.5x: ceil(1) = 1.
  EXPECT_EQ(c.Sync(15, 2, Sequences({0}, 1)), 1);
}

TEST(HpaTest, ScaleDownWaitsOutItsStabilizationWindow) {
  HpaController c(OnSequences(16));  // the default 300 s window
  // Idle from the first sync: the window starts from the current 4 pods.
  for (double t = 15; t <= 300; t += 15) {
    EXPECT_EQ(c.Sync(t, 4, Sequences({0, 0, 0, 0})), 4) << "at " << t << " s";
  }
  // The 4 leaves the window 300 s after it; 100% may go at once, down to
  // minReplicas.
  EXPECT_EQ(c.Sync(315, 4, Sequences({0, 0, 0, 0})), 1);
}

TEST(HpaTest, TheHighestRecommendationOfTheWindowHolds) {
  HpaSpec h = OnSequences(16);
  h.scale_down.stabilization_window_seconds = 60;
  HpaController c(h);
  EXPECT_EQ(c.Sync(0, 4, Sequences({16, 16, 16, 16})), 4);
  EXPECT_EQ(c.Sync(15, 4, Sequences({32, 0, 0, 0})), 4);  // proposes 2
  EXPECT_EQ(c.Sync(30, 4, Sequences({0, 0, 0, 0})), 4);   // proposes 0
  // At 61 s the 4 recorded at 0 s has left the window; 2 (15 s) is the
  // highest left.
  EXPECT_EQ(c.Sync(61, 4, Sequences({0, 0, 0, 0})), 2);
}

TEST(HpaTest, ScaleUpPoliciesLimitEachPeriod) {
  // deploy/k8s/base: double, or +2, per 30 s (whichever is more).
  HpaSpec h = OnSequences(16, 20);
  h.scale_up.policies = {{ScalingPolicy::Type::kPercent, 100, 30},
                         {ScalingPolicy::Type::kPods, 2, 30}};
  HpaController c(h);
  const PoolMetrics flooded = Sequences({1000});
  EXPECT_EQ(c.Sync(0, 1, flooded), 3);  // max(2 x 1, 1 + 2)
  // 15 s later the period still started at 1 pod: no more.
  EXPECT_EQ(c.Sync(15, 3, Sequences({1000}, 2)), 3);
  // A new period from 3: max(6, 5), then from 6: max(12, 8), then the cap.
  EXPECT_EQ(c.Sync(30, 3, Sequences({1000, 1000, 1000})), 6);
  EXPECT_EQ(c.Sync(60, 6, Sequences({1000, 1000, 1000, 1000, 1000, 1000})), 12);
  EXPECT_EQ(
      c.Sync(90, 12,
             Sequences({1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000})),
      20);
}

TEST(HpaTest, ScaleDownPoliciesWithSelectMinRemoveTheLeast) {
  // deploy/k8s/base's decode HPA: one pod per 120 s after its window.
  HpaSpec h = OnSequences(16);
  h.scale_down = {0, ScalingRules::Select::kMin, {{ScalingPolicy::Type::kPods, 1, 120}}};
  HpaController c(h);
  EXPECT_EQ(c.Sync(0, 5, Sequences({0, 0, 0, 0, 0})), 4);
  EXPECT_EQ(c.Sync(60, 4, Sequences({0, 0, 0, 0})), 4);  // within the 120 s period
  EXPECT_EQ(c.Sync(121, 4, Sequences({0, 0, 0, 0})), 3);
}

TEST(HpaTest, TheLargestProposalOfItsMetricsWinsWithinMaxReplicas) {
  HpaSpec h = OnSequences(16, 4);
  h.metrics.push_back({PodMetric::kQueuedPromptTokens, 100});
  HpaController c(h);
  PoolMetrics m;
  m.ready = {{500, 16, 0}};  // sequences on target; 5x the queue target
  EXPECT_EQ(c.Sync(15, 1, m), 4);
  // Out of bounds to start with: clamped at once.
  HpaController d(OnSequences(16, 3));
  EXPECT_EQ(d.Sync(15, 7, Sequences({16, 16, 16, 16, 16, 16, 16})), 3);
}

TEST(HpaTest, NoMetricsNoChange) {
  HpaController c(OnSequences(16));
  EXPECT_EQ(c.Sync(15, 2, Sequences({}, 2)), 2);
}

TEST(HpaTest, ReadsKubernetesObjects) {
  // The decode HPA of deploy/k8s/base, as `kubectl get hpa -o json` gives it.
  const char* kList = R"({"kind": "List", "items": [
    {"kind": "HorizontalPodAutoscaler", "metadata": {"name": "pdq-decode"},
     "spec": {"scaleTargetRef": {"kind": "Deployment", "name": "pdq-decode"},
              "minReplicas": 1, "maxReplicas": 8,
              "metrics": [
                {"type": "Pods", "pods": {"metric": {"name": "pdq_kv_blocks_used_ratio"},
                                          "target": {"type": "AverageValue", "averageValue": "700m"}}},
                {"type": "Pods", "pods": {"metric": {"name": "pdq_active_sequences"},
                                          "target": {"type": "AverageValue", "averageValue": "32"}}}],
              "behavior": {"scaleDown": {"stabilizationWindowSeconds": 600, "selectPolicy": "Min",
                                         "policies": [{"type": "Pods", "value": 1, "periodSeconds": 120}]}}}},
    {"kind": "Service", "metadata": {"name": "pdq-router"}}, null]})";
  absl::StatusOr<std::vector<PoolHpa>> hpas = HpasFromJson(kList);
  ASSERT_TRUE(hpas.ok()) << hpas.status();
  ASSERT_EQ(hpas->size(), 1u);
  const PoolHpa& h = (*hpas)[0];
  EXPECT_EQ(h.pool, PoolHpa::Pool::kDecode);
  EXPECT_EQ(h.spec.max_replicas, 8);
  ASSERT_EQ(h.spec.metrics.size(), 2u);
  EXPECT_EQ(h.spec.metrics[0].metric, PodMetric::kKvBlocksUsedRatio);
  EXPECT_DOUBLE_EQ(h.spec.metrics[0].average_value, 0.7);
  EXPECT_DOUBLE_EQ(h.spec.metrics[1].average_value, 32);
  EXPECT_EQ(h.spec.scale_down.stabilization_window_seconds, 600);
  EXPECT_EQ(h.spec.scale_down.select, ScalingRules::Select::kMin);
  ASSERT_EQ(h.spec.scale_down.policies.size(), 1u);
  EXPECT_EQ(h.spec.scale_down.policies[0].period_seconds, 120);
  // Unset: Kubernetes' default scale-up (100% or 4 pods per 15 s).
  EXPECT_EQ(h.spec.scale_up.policies.size(), 2u);
}

TEST(HpaTest, RefusesWhatItCannotSimulate) {
  auto error = [](const std::string& metric, const std::string& type) {
    const std::string text =
        R"({"kind": "HorizontalPodAutoscaler", "metadata": {"name": "x"}, "spec": {"maxReplicas": 3,
            "scaleTargetRef": {"name": "pdq-prefill"}, "metrics": [{"type": ")" +
        type + R"(", "pods": {"metric": {"name": ")" + metric +
        R"("}, "target": {"type": "AverageValue", "averageValue": "10"}}}]}})";
    absl::StatusOr<std::vector<PoolHpa>> h = HpasFromJson(text);
    return h.ok() ? std::string("ok") : std::string(h.status().message());
  };
  EXPECT_EQ(error("pdq_queued_prompt_tokens", "Pods"), "ok");
  EXPECT_NE(error("cpu_seconds", "Pods").find("pdq_queued_prompt_tokens"), std::string::npos);
  EXPECT_NE(error("pdq_active_sequences", "Resource").find("only Pods metrics"), std::string::npos);
  EXPECT_FALSE(HpasFromJson("{not json").ok());
  EXPECT_FALSE(HpasFromJson(R"({"kind": "Service"})").ok());
}

TEST(HpaTest, ParsesQuantities) {
  EXPECT_DOUBLE_EQ(*ParseQuantity("700m"), 0.7);
  EXPECT_DOUBLE_EQ(*ParseQuantity("32"), 32);
  EXPECT_DOUBLE_EQ(*ParseQuantity("1.5k"), 1500);
  EXPECT_DOUBLE_EQ(*ParseQuantity("2Ki"), 2048);
  EXPECT_FALSE(ParseQuantity("").ok());
  EXPECT_FALSE(ParseQuantity("m").ok());
  EXPECT_FALSE(ParseQuantity("12x").ok());
}

}  // namespace
}  // namespace pdq::sim
