// pdq plan --sim: the smallest deployment that serves a workload within
// its targets, found by simulation on a measured profile (sim/sim.h), and
// how each deployment of that size compares. Every figure here is a
// projection from the profile.
//
// The search: for n = 1, 2, ... workers, every precision pair as n
// monolithic workers and as every xP+(n-x)D split; the first n at which one
// of them keeps at least `attainment` of the requests within both targets
// (the lower end of its 95% interval, none refused, at steady state:
// RunSteady) is the size, and the
// one of those with the most headroom (the lowest of TTFT p90 and TPOT p90
// over their targets, the larger of the two) the recommendation. Workers are
// priced alike (one node shape).
#pragma once

#include <array>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "sim/profile.h"
#include "sim/sim.h"

namespace pdq::sim {

struct PlanQuery {
  Workload workload;  // its rate is the load to serve
  Targets targets;
  double attainment = 0.9;  // fraction of requests that must meet both targets
  int max_workers = 16;
  int seeds = 3;
  // (prefill, decode) precisions; a monolithic worker of a pair computes
  // prompts at the first on a second model when they differ.
  std::vector<std::pair<std::string, std::string>> pairs = {{"fp16", "fp16"}, {"w8a8", "w4a16"}};
  bool monolithic = true, disaggregated = true;
  double worker_hour_price = 1;  // one worker's price an hour, in any currency
};

// An open-loop run of `w` on `d` long enough to measure its steady state.
// Its first requests find idle workers, so until the requests that arrive
// during one request's lifetime have ended, a run measures the ramp, not
// the load: 300 requests of 512-token answers at 2 a second end before
// the first of them leave, and a deployment that falls behind the load
// looks as if it kept up. So the warm-up (here the first requests sent, not
// the first to end: Workload::warmup_first_to_end) and the measured requests are each
// at least kSteadyLifetimes lifetimes of arrivals (a lifetime: the last
// run's TTFT p90 plus TPOT p90 per output token), run again until they
// are (at most three times more, kMaxSteadyRequests in all); a run that
// misses `attainment` already is not run longer (it started from idle
// workers: its steady state is no better). `ran`: the workload of the run
// returned. Closed loop and phased rates run as given.
inline constexpr double kSteadyLifetimes = 2;
inline constexpr int kMaxSteadyRequests = 40000;
absl::StatusOr<SeedSummary> RunSteady(const Deployment& d, Workload w, const Targets& t, int seeds,
                                      double attainment, Workload* ran = nullptr);

struct PlanOption {
  std::string deployment;  // "2P+6D", "4M"
  std::string prefill_precision, decode_precision;
  int workers = 0;
  Workload workload;  // as run (RunSteady: its warm-up and measured requests)
  SeedSummary result;
  bool meets = false;
  double cost_per_million_output_tokens = 0;
};

struct SimPlan {
  int workers = 0;  // the size searched last: the smallest that meets, or max_workers
  std::vector<PlanOption> options;  // every deployment of that size
  int best = -1;                    // index into options; -1: none meets at max_workers
};

absl::StatusOr<SimPlan> PlanBySimulation(const Profile& profile, const PlanQuery& query,
                                         const WorkerOptions& workers);

// One term of a profile: "prompt" (every pass's per-token and per-pair
// cost), "decode" (every pass's fixed and per-row cost, its decode
// attention, row steps and the loop's time around a step, and each split's
// decode step overhead) or "link" (the KV links' time).
inline constexpr const char* kProfileTerms[] = {"prompt", "decode", "link"};

// `profile` with `term` (one of kProfileTerms) taking `factor` times as long.
absl::StatusOr<Profile> ScaleProfileTerm(const Profile& profile, std::string_view term,
                                         double factor);

// The recommendation again with each of kProfileTerms changed by a factor.
struct Sensitivity {
  std::string term;
  double factor = 1;
  std::string recommendation;  // "2P+6D w8a8/w4a16", or "none"
  bool same = false;
};
absl::StatusOr<std::vector<Sensitivity>> PlanSensitivity(const Profile& profile,
                                                         const PlanQuery& query,
                                                         const WorkerOptions& workers,
                                                         const SimPlan& plan, double change);

std::string Describe(const PlanOption& o);

// Capacity at cluster scale, for the evaluation report: for each node count
// n (a node: one worker of the profile's threads), every precision pair as n
// monolithic workers and as xP+(n-x)D with x/n from `prefill_shares`, the
// highest open-loop rate each serves within the targets (Meets at steady
// state: RunSteady), bracketed by doubling and then bisected until the
// highest meeting and the lowest missing rates are within `tolerance` of
// each other. Goodput per core and the cost per million output tokens are
// taken at that rate: its output tokens a second times the share of
// requests within the targets, per core. Projections, all of it.
struct ClusterQuery {
  PlanQuery plan;  // workload (its rate is searched), targets, attainment, seeds, pairs, price
  std::vector<int> nodes = {8, 32, 128};
  std::vector<double> prefill_shares = {0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875};
  double tolerance = 0.05;
};
struct ClusterPoint {
  int nodes = 0;
  std::string deployment;  // "8M", "2P+6D"
  std::string prefill_precision, decode_precision;
  int prefill = 0, decode = 0;  // 0 and 0: monolithic
  double rate = 0;              // requests/s within the targets; 0: not even the lowest tried
  double missed_rate = 0;       // the lowest rate tried that missed them (0: none did)
  SeedSummary result;           // at `rate`
  double goodput_tokens_per_second = 0, tokens_per_second_per_core = 0;
  double cost_per_million_output_tokens = 0;  // 0 where rate is 0
  int runs = 0;                               // simulations the search took
};
// The worker threads (cores per node) the sweep's workers run with.
int ClusterCoresPerNode(const Profile& profile, const WorkerOptions& workers);
// `progress`, where given, hears of each point as it is found.
absl::StatusOr<std::vector<ClusterPoint>> SweepCluster(
    const Profile& profile, const ClusterQuery& query, const WorkerOptions& workers,
    const std::function<void(const ClusterPoint&, int, int)>& progress = nullptr);

// The autoscalers for a planned deployment, chosen by replaying it under
// them on a trace of rate phases (two cycles, from one pod a pool, every
// request measured, ramps included), against the fixed deployment on the
// same trace. Prefill workers (and monolithic ones) scale on
// pdq_queued_prompt_tokens, targeting the prompt tokens one computes in half
// the TTFT target; decode and monolithic workers on pdq_active_sequences,
// whose target is searched: of kSequenceTargets, the one that keeps the
// attainment (the lower end of its 95% interval, nothing refused) with the
// fewest workers on average. Streams per worker is a metric whose value
// falls as workers are added (each runs faster), so the proportional rule
// the HPA applies over- and undershoots; only a replay tells which target
// holds.
struct AutoscaleQuery {
  // Each pool's HPA but its pdq targets (behavior, other metrics, the sync
  // period), by Role; maxReplicas becomes twice the planned count (at
  // least 2), minReplicas 1.
  std::array<HpaSpec, 3> base;
  std::vector<Workload::Phase> phases = {{600, 0.25}, {600, 1}};  // rates: fractions of the plan's
  double pod_start_seconds = 30;
};
inline constexpr double kSequenceTargets[] = {2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64};
struct AutoscaleTry {
  double sequences = 0;  // the pdq_active_sequences target
  SeedSummary replay;
  bool meets = false;
};
struct AutoscalePlan {
  double queued_tokens = 0;  // the pdq_queued_prompt_tokens target (prefill or monolithic)
  std::vector<AutoscaleTry> tries;
  int chosen = -1;  // into tries: the fewest workers that meet; -1: none meets
  std::array<std::optional<HpaSpec>, 3> hpas;  // by Role: the chosen (else the best attaining)
  std::vector<Workload::Phase> phases;         // requests/s
  int requests = 0;
  SeedSummary fixed;  // the planned counts throughout
};
// `progress`, where given, hears of each try as it ends (index, of how many).
absl::StatusOr<AutoscalePlan> PlanAutoscaling(
    const Profile& profile, const PlanQuery& query, const WorkerOptions& workers,
    const PlanOption& option, const AutoscaleQuery& a,
    const std::function<void(const AutoscaleTry&, int, int)>& progress = nullptr);

}  // namespace pdq::sim
