// `pdq plan`: how many prefill and decode workers a request rate needs, and
// the autoscaler thresholds that hold that ratio, from a `pdq bench --json`
// run against one prefill and one decode worker (harness/plan.h has the
// arithmetic); or, with --sim, by simulating deployments on a measured
// profile (sim/plan.h).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "harness/bench_result.h"
#include "harness/load_generator.h"
#include "harness/plan.h"
#include "nlohmann/json.hpp"
#include "sim/plan.h"
#include "tools/commands.h"

namespace pdq {
namespace {

struct SimPlanFlags {
  std::string profile, workload = "chat", pairs = "fp16/fp16,w8a8/w4a16";
  std::string autoscale_phases = "600:0.25,600:1", hpa, shapes = "both";
  std::string cluster_nodes, prefill_shares = "0.125,0.25,0.375,0.5,0.625,0.75,0.875";
  int64_t max_workers = 16, seeds = 3, requests = 300, threads = 0;
  int64_t kv_blocks = 1 << 20;
  double attainment = 0.9, price = 1, core_price = 0, sensitivity = 0.2, pod_start_seconds = -1;
  bool price_given = false, core_price_given = false;  // on the command line
  bool idle_passes = false;
  void Register(FlagParser& flags) {
    flags.String("sim", &profile,
                 "plan by simulation on this pdq profile (pdq sim) instead of from --bench");
    flags.String("workload", &workload, "--sim: chat, summarize or analysis (or the token flags)");
    flags.String("pairs", &pairs, "--sim: prefill/decode precision pairs to consider");
    flags.String("shapes", &shapes,
                 "--sim: deployments to consider: both, monolithic (nM) or disaggregated "
                 "(xP+yD)");
    flags.Int("threads", &threads, 0, 1024,
              "--sim: each worker's threads, as measured in the profile (0: the most measured)");
    flags.Bool(
        "idle-passes", &idle_passes,
        "--sim: forward passes as the profile timed them alone, not times its measured "
        "served_factor (the router, gRPC and clients sharing the cores), served_prompt_factor "
        "or served_row_factors, "
        "and no stepping-loop time outside them (its step_overhead and stream_finish_seconds)");
    flags.Int("max-workers", &max_workers, 1, 1024, "--sim: the largest deployment to try");
    flags.Int("seeds", &seeds, 1, 100, "--sim: runs per deployment");
    flags.Int("requests", &requests, 10, 1 << 20, "--sim: measured requests per run");
    flags.Float("attainment", &attainment, 0.01, 1,
                "--sim: fraction of requests that must meet both targets");
    flags.Float("worker-hour-price", &price, 0, 1e9, "--sim: one worker's price an hour");
    flags.Float("core-hour-price", &core_price, 0, 1e9,
                "--sim: instead of --worker-hour-price, one core's price an hour: a worker "
                "costs it times its threads (--threads, else the profile's most measured)");
    flags.Int("kv-blocks", &kv_blocks, 1, 1LL << 40,
              "--sim: KV blocks per decode or monolithic worker (the workers' cache size)");
    flags.Float("sensitivity", &sensitivity, 0, 0.9,
                "--sim: replan with each profile term changed by this fraction (0: skip)");
    flags.String("autoscale-phases", &autoscale_phases,
                 "--sim: the trace the recommendation's autoscalers are replayed on, "
                 "SECONDS:FRACTION of --rate,... (two cycles); empty: no autoscaling plan");
    flags.String("hpa", &hpa,
                 "--sim: Kubernetes HPAs (JSON, as pdq sim --hpa) whose behavior and other "
                 "metrics the planned autoscalers keep (default: Kubernetes' defaults)");
    flags.Float("pod-start-seconds", &pod_start_seconds, -1, 1e6,
                "--sim: a new worker's time to serve in the replay (-1: the profile's model "
                "load and start-up probe, else 30)");
    flags.String("cluster-nodes", &cluster_nodes,
                 "--sim: instead of a plan for --rate, the capacity at these node counts "
                 "(8,32,128): each pair as n monolithic workers and at each --prefill-shares "
                 "P:D split, the highest rate served within the targets, its goodput per core "
                 "and cost per million output tokens");
    flags.String("prefill-shares", &prefill_shares,
                 "--cluster-nodes: the prefill workers' shares of the nodes to try");
  }
};

// The query and the profile of `pdq plan --sim` (the rate as given).
absl::Status SimQuery(const SimPlanFlags& f, double rate, int64_t input_tokens,
                      int64_t output_tokens, double ttft_ms, double tpot_ms, sim::PlanQuery* q,
                      sim::Profile* profile) {
  if (f.shapes != "both" && f.shapes != "monolithic" && f.shapes != "disaggregated") {
    return absl::InvalidArgumentError(
        absl::StrCat("--shapes: unknown '", f.shapes, "' (both, monolithic or disaggregated)"));
  }
  if (const WorkloadShape* shape = StandardWorkload(f.workload)) {
    if (input_tokens == 0) input_tokens = shape->input;
    if (output_tokens == 0) output_tokens = shape->output;
  } else if (input_tokens == 0 || output_tokens == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--workload: unknown '", f.workload,
        "' (chat, summarize or analysis), or give --input-tokens and --output-tokens"));
  }
  absl::StatusOr<sim::Profile> read = sim::ReadProfile(f.profile);
  if (!read.ok()) return read.status();
  *profile = *std::move(read);
  if (f.core_price_given && f.price_given) {
    return absl::InvalidArgumentError("give --worker-hour-price or --core-hour-price, not both");
  }
  sim::WorkerOptions wo;
  wo.threads = (int)f.threads;
  wo.idle_passes = f.idle_passes;
  q->worker_hour_price =
      f.core_price_given ? f.core_price * sim::ClusterCoresPerNode(*profile, wo) : f.price;
  q->workload.rate = rate;
  q->workload.requests = (int)f.requests;
  q->workload.warmup = (int)f.requests / 10;
  q->workload.prompt_tokens = input_tokens;
  q->workload.output_tokens = output_tokens;
  q->targets = {(ttft_ms > 0 ? ttft_ms : 2000) / 1e3, (tpot_ms > 0 ? tpot_ms : 200) / 1e3};
  q->attainment = f.attainment;
  q->max_workers = (int)f.max_workers;
  q->seeds = (int)f.seeds;
  q->pairs.clear();
  for (absl::string_view pair : absl::StrSplit(f.pairs, ',', absl::SkipEmpty())) {
    std::vector<std::string> parts = absl::StrSplit(pair, '/');
    if (parts.size() != 2 || parts[0].empty() || parts[1].empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--pairs: '", pair, "' is not PREFILL/DECODE, as in w8a8/w4a16"));
    }
    q->pairs.emplace_back(parts[0], parts[1]);
  }
  q->monolithic = f.shapes != "disaggregated";
  q->disaggregated = f.shapes != "monolithic";
  return absl::OkStatus();
}

// `pdq plan --sim --cluster-nodes`: sim::SweepCluster, printed.
int ClusterCommand(const SimPlanFlags& f, int64_t input_tokens, int64_t output_tokens,
                   double ttft_ms, double tpot_ms, const std::string& json_path) {
  auto fail = [](const absl::Status& s) { return Fail("plan", s); };
  sim::ClusterQuery cq;
  sim::Profile profile;
  if (absl::Status s =
          SimQuery(f, 0, input_tokens, output_tokens, ttft_ms, tpot_ms, &cq.plan, &profile);
      !s.ok()) {
    return fail(s);
  }
  absl::StatusOr<std::vector<int64_t>> nodes = IntList("cluster-nodes", f.cluster_nodes, 2, 4096);
  if (!nodes.ok()) return fail(nodes.status());
  absl::StatusOr<std::vector<double>> shares =
      FloatList("prefill-shares", f.prefill_shares, 0, 1, /*open=*/true);
  if (!shares.ok()) return fail(shares.status());
  cq.nodes.assign(nodes->begin(), nodes->end());
  cq.prefill_shares = *shares;
  sim::WorkerOptions wo;
  wo.kv_blocks = f.kv_blocks;
  wo.threads = (int)f.threads;
  wo.idle_passes = f.idle_passes;
  const int cores = sim::ClusterCoresPerNode(profile, wo);
  const sim::Workload& w = cq.plan.workload;
  std::printf(
      "projected from %s (%s, %d cores, %s, %s KV), not measured: the most requests/s of %lld "
      "tokens "
      "in and %lld out served with %.0f%% within TTFT %.0f ms and TPOT %.0f ms (none refused, "
      "at steady state, %d seeds; rates within %.0f%%); a node is one worker of %d core%s, "
      "priced %g an hour\n",
      f.profile.c_str(), profile.cpu.c_str(), profile.cores, profile.isa.c_str(),
      profile.kv_dtype.c_str(), (long long)w.prompt_tokens, (long long)w.output_tokens,
      cq.plan.attainment * 100, cq.plan.targets.ttft_seconds * 1e3,
      cq.plan.targets.tpot_seconds * 1e3, cq.plan.seeds, cq.tolerance * 100, cores,
      cores == 1 ? "" : "s", cq.plan.worker_hour_price);
  absl::StatusOr<std::vector<sim::ClusterPoint>> points =
      sim::SweepCluster(profile, cq, wo, [](const sim::ClusterPoint& p, int i, int n) {
        std::fprintf(stderr, "pdq plan: [%d/%d] %s %s/%s: %.4g requests/s (%d runs)\n", i, n,
                     p.deployment.c_str(), p.prefill_precision.c_str(), p.decode_precision.c_str(),
                     p.rate, p.runs);
      });
  if (!points.ok()) return fail(points.status());
  // The best of each size: the most goodput per core.
  std::vector<bool> best(points->size(), false);
  {
    std::map<int, int> best_of_size;  // nodes -> index into points
    for (int i = 0; i < (int)points->size(); ++i) {
      const sim::ClusterPoint& p = (*points)[i];
      if (p.rate <= 0) continue;
      auto [it, first] = best_of_size.try_emplace(p.nodes, i);
      if (!first &&
          p.tokens_per_second_per_core > (*points)[it->second].tokens_per_second_per_core) {
        it->second = i;
      }
    }
    for (const auto& [nodes, i] : best_of_size) best[i] = true;
  }
  std::printf("  %-6s %-12s %-12s %12s %16s %14s %10s %10s\n", "nodes", "deployment", "pair",
              "requests/s", "tokens/s/core", "cost/M tokens", "TTFT p90", "TPOT p90");
  for (int i = 0; i < (int)points->size(); ++i) {
    const sim::ClusterPoint& p = (*points)[i];
    const std::string pair = absl::StrCat(p.prefill_precision, "/", p.decode_precision);
    if (p.rate <= 0) {
      std::printf("  %-6d %-12s %-12s %12s\n", p.nodes, p.deployment.c_str(), pair.c_str(), "none");
      continue;
    }
    std::printf("  %-6d %-12s %-12s %12.4g %16.4g %14.4g %7.0f ms %7.1f ms%s\n", p.nodes,
                p.deployment.c_str(), pair.c_str(), p.rate, p.tokens_per_second_per_core,
                p.cost_per_million_output_tokens, p.result.ttft_p90.mean * 1e3,
                p.result.tpot_p90.mean * 1e3, best[i] ? "  <- best of its size" : "");
  }
  if (!json_path.empty()) {
    nlohmann::json j = {{"projected_from", f.profile},
                        {"cpu", profile.cpu},
                        {"cores", profile.cores},
                        {"isa", profile.isa},
                        {"kv_dtype", profile.kv_dtype},
                        {"cores_per_node", cores},
                        {"prompt_tokens", w.prompt_tokens},
                        {"output_tokens", w.output_tokens},
                        {"ttft_target_ms", cq.plan.targets.ttft_seconds * 1e3},
                        {"tpot_target_ms", cq.plan.targets.tpot_seconds * 1e3},
                        {"attainment", cq.plan.attainment},
                        {"seeds", cq.plan.seeds},
                        {"tolerance", cq.tolerance},
                        {"worker_hour_price", cq.plan.worker_hour_price},
                        {"nodes", cq.nodes},
                        {"points", nlohmann::json::array()}};
    for (int i = 0; i < (int)points->size(); ++i) {
      const sim::ClusterPoint& p = (*points)[i];
      j["points"].push_back({{"nodes", p.nodes},
                             {"deployment", p.deployment},
                             {"prefill_precision", p.prefill_precision},
                             {"decode_precision", p.decode_precision},
                             {"prefill", p.prefill},
                             {"decode", p.decode},
                             {"rate", p.rate},
                             {"missed_rate", p.missed_rate},
                             {"goodput_tokens_per_second", p.goodput_tokens_per_second},
                             {"tokens_per_second_per_core", p.tokens_per_second_per_core},
                             {"cost_per_million_output_tokens", p.cost_per_million_output_tokens},
                             {"ttft_p90", p.result.ttft_p90.mean},
                             {"tpot_p90", p.result.tpot_p90.mean},
                             {"met_fraction", p.result.met_fraction.mean},
                             {"runs", p.runs},
                             {"best_of_size", bool(best[i])}});
    }
    std::ofstream out(json_path);
    out << j.dump(1) << "\n";
    if (!out) return fail(absl::UnavailableError(absl::StrCat("cannot write ", json_path)));
  }
  return 0;
}

// `pdq plan --sim`: the search of sim/plan.h, printed.
int SimPlanCommand(const SimPlanFlags& f, double rate, int64_t input_tokens, int64_t output_tokens,
                   double ttft_ms, double tpot_ms, const std::string& json_path) {
  auto fail = [](const absl::Status& s) { return Fail("plan", s); };
  sim::PlanQuery q;
  sim::Profile read_profile;
  if (absl::Status s =
          SimQuery(f, rate, input_tokens, output_tokens, ttft_ms, tpot_ms, &q, &read_profile);
      !s.ok()) {
    return fail(s);
  }
  const sim::Profile* profile = &read_profile;
  sim::WorkerOptions wo;
  wo.kv_blocks = f.kv_blocks;
  wo.threads = (int)f.threads;
  wo.idle_passes = f.idle_passes;
  absl::StatusOr<sim::SimPlan> plan = sim::PlanBySimulation(*profile, q, wo);
  if (!plan.ok()) return fail(plan.status());
  std::printf(
      "projected from %s (%s, %d cores, %s, %s KV), not measured: %.3g requests/s of %lld "
      "tokens in and %lld out; targets TTFT %.0f ms, TPOT %.0f ms for %.0f%% of requests; %d "
      "seeds; workers of %s\n",
      f.profile.c_str(), profile->cpu.c_str(), profile->cores, profile->isa.c_str(),
      profile->kv_dtype.c_str(), rate, (long long)input_tokens, (long long)output_tokens,
      q.targets.ttft_seconds * 1e3, q.targets.tpot_seconds * 1e3, q.attainment * 100, q.seeds,
      f.threads > 0 ? absl::StrCat(f.threads, " thread", f.threads == 1 ? "" : "s").c_str()
                    : "the profile's most threads");
  std::printf("deployments of %d worker%s:\n", plan->workers, plan->workers == 1 ? "" : "s");
  std::printf("  %-22s %10s %9s %12s %12s %13s\n", "deployment", "goodput/s", "within", "TTFT p90",
              "TPOT p90", "cost/M tokens");
  for (int i = 0; i < (int)plan->options.size(); ++i) {
    const sim::PlanOption& o = plan->options[i];
    std::printf("  %-22s %10.3g %8.0f%% %9.0f ms %9.1f ms %13.3g%s\n", sim::Describe(o).c_str(),
                o.result.goodput.mean, o.result.met_fraction.mean * 100,
                o.result.ttft_p90.mean * 1e3, o.result.tpot_p90.mean * 1e3,
                o.cost_per_million_output_tokens, i == plan->best ? "  <- recommended" : "");
  }
  {
    // How long each was run: its steady state, not the ramp (RunSteady).
    int longest = 0;
    for (const sim::PlanOption& o : plan->options) {
      longest = std::max(longest, o.workload.warmup + o.workload.requests);
    }
    std::printf(
        "  (each run until its warm-up and its measured requests each span %.0f request "
        "lifetimes of arrivals: up to %d requests a seed here; a deployment missing the targets "
        "sooner stops there)\n",
        sim::kSteadyLifetimes, longest);
  }
  if (plan->best < 0) {
    std::printf("no deployment of up to %d workers meets the targets\n", q.max_workers);
  }
  // What bounds the recommended deployment (else the one of most goodput).
  int named = plan->best;
  if (named < 0) {
    for (int i = 0; i < (int)plan->options.size(); ++i) {
      if (named < 0 ||
          plan->options[i].result.goodput.mean > plan->options[named].result.goodput.mean) {
        named = i;
      }
    }
  }
  if (named >= 0) {
    const sim::PlanOption& o = plan->options[named];
    std::printf("%s is bound by %s\n", sim::Describe(o).c_str(),
                sim::NameBottleneck(o.result.busy, o.result.refusals).c_str());
  }
  // The autoscalers that hold the recommendation as the rate moves.
  std::optional<sim::AutoscalePlan> autoscale;
  if (!f.autoscale_phases.empty() && plan->best >= 0) {
    sim::AutoscaleQuery aq;
    absl::StatusOr<std::vector<sim::Workload::Phase>> phases = sim::ParsePhases(f.autoscale_phases);
    if (!phases.ok()) return fail(phases.status());
    aq.phases = *phases;
    if (!f.hpa.empty()) {
      absl::StatusOr<std::vector<sim::PoolHpa>> hpas = sim::ReadHpas(f.hpa);
      if (!hpas.ok()) return fail(hpas.status());
      for (const sim::PoolHpa& h : *hpas) {
        aq.base[static_cast<int>(sim::PoolRole(h.pool))] = h.spec;
      }
    }
    const sim::PlanOption& best = plan->options[plan->best];
    const char* start_from = "given";
    aq.pod_start_seconds = f.pod_start_seconds;
    if (f.pod_start_seconds < 0) {
      sim::Deployment d;
      (void)sim::ParseDeployment(best.deployment, &d);
      const sim::Precisions p{best.prefill_precision, best.decode_precision, best.decode_precision,
                              best.prefill_precision};
      absl::StatusOr<double> start = sim::PodStartSeconds(*profile, p, wo, d);
      aq.pod_start_seconds = start.ok() ? *start : 30;
      start_from = start.ok() ? "the profile's model load and start-up probe"
                              : "assumed: the profile has no load times";
    }
    absl::StatusOr<sim::AutoscalePlan> a = sim::PlanAutoscaling(
        *profile, q, wo, best, aq, [](const sim::AutoscaleTry& t, int i, int n) {
          std::fprintf(stderr,
                       "pdq plan: autoscaling replay %d/%d (pdq_active_sequences %g): %.0f%% "
                       "within the targets, %.3g workers on average\n",
                       i + 1, n, t.sequences, t.replay.met_fraction.mean * 100,
                       t.replay.mean_workers.mean);
        });
    if (!a.ok()) return fail(a.status());
    autoscale = *a;
    std::string trace;
    for (const sim::Workload::Phase& p : a->phases) {
      absl::StrAppend(&trace, trace.empty() ? "" : ", ", p.seconds, " s at ",
                      absl::StrFormat("%.3g", p.rate), "/s");
    }
    std::printf(
        "autoscaling %s (projected): replayed on %s, twice (%d requests), from one worker a pool, "
        "pods serving %.3g s after they start (%s); prompts scale on pdq_queued_prompt_tokens "
        "%.0f (half the TTFT target's prompt work); targets of pdq_active_sequences tried:\n",
        sim::Describe(best).c_str(), trace.c_str(), a->requests, aq.pod_start_seconds, start_from,
        a->queued_tokens);
    std::printf("  %-12s %7s %10s %10s %13s %5s\n", "sequences", "within", "TTFT p90", "TPOT p90",
                "workers mean", "peak");
    auto row = [](const std::string& name, const sim::SeedSummary& r, const char* mark) {
      std::printf("  %-12s %6.0f%% %7.0f ms %7.1f ms %13.3g %5d%s\n", name.c_str(),
                  r.met_fraction.mean * 100, r.ttft_p90.mean * 1e3, r.tpot_p90.mean * 1e3,
                  r.mean_workers.mean, r.peak_workers, mark);
    };
    for (int i = 0; i < (int)a->tries.size(); ++i) {
      row(absl::StrFormat("%g", a->tries[i].sequences), a->tries[i].replay,
          i == a->chosen ? "  <- recommended" : "");
    }
    row(absl::StrCat("fixed ", best.deployment), a->fixed, "");
    if (a->chosen < 0) {
      std::printf(
          "no target keeps %.0f%% of requests within the targets on this trace: keep the "
          "deployment fixed\n",
          q.attainment * 100);
    } else {
      const double ratio =
          a->tries[a->chosen].replay.mean_workers.mean / a->fixed.mean_workers.mean;
      std::printf(ratio < 1 ? "the autoscalers hold the targets with %.0f%% fewer workers on "
                              "average than the fixed %s on this trace\n"
                            : "the autoscalers need %.0f%% more workers on average than the fixed "
                              "%s on this trace (their ramps lag and overshoot): keep it fixed, "
                              "or autoscale only where the load varies more\n",
                  std::abs(1 - ratio) * 100, best.deployment.c_str());
    }
  }
  std::vector<sim::Sensitivity> sens;
  if (f.sensitivity > 0 && plan->best >= 0) {
    absl::StatusOr<std::vector<sim::Sensitivity>> s =
        sim::PlanSensitivity(*profile, q, wo, *plan, f.sensitivity);
    if (!s.ok()) return fail(s.status());
    sens = *s;
    std::printf("with one profile term changed by %.0f%%:\n", f.sensitivity * 100);
    for (const sim::Sensitivity& x : sens) {
      std::printf("  %-6s x%.2f: %s%s\n", x.term.c_str(), x.factor, x.recommendation.c_str(),
                  x.same ? " (same)" : " (changes the recommendation)");
    }
  }
  if (!json_path.empty()) {
    nlohmann::json j = {{"projected_from", f.profile}, {"workers", plan->workers}};
    j["recommended"] = plan->best >= 0 ? sim::Describe(plan->options[plan->best]) : "";
    for (const sim::PlanOption& o : plan->options) {
      j["options"].push_back({{"deployment", o.deployment},
                              {"prefill_precision", o.prefill_precision},
                              {"decode_precision", o.decode_precision},
                              {"goodput", o.result.goodput.mean},
                              {"met_fraction", o.result.met_fraction.mean},
                              {"ttft_p90", o.result.ttft_p90.mean},
                              {"tpot_p90", o.result.tpot_p90.mean},
                              {"cost_per_million_output_tokens", o.cost_per_million_output_tokens},
                              {"warmup_requests", o.workload.warmup},
                              {"measured_requests", o.workload.requests},
                              {"meets", o.meets}});
    }
    if (autoscale) {
      auto summary = [](const sim::SeedSummary& r) {
        return nlohmann::json{{"met_fraction", r.met_fraction.mean},
                              {"ttft_p90", r.ttft_p90.mean},
                              {"tpot_p90", r.tpot_p90.mean},
                              {"mean_workers", r.mean_workers.mean},
                              {"peak_workers", r.peak_workers}};
      };
      nlohmann::json phases = nlohmann::json::array();
      for (const sim::Workload::Phase& p : autoscale->phases) {
        phases.push_back({{"seconds", p.seconds}, {"rate", p.rate}});
      }
      nlohmann::json tries = nlohmann::json::array();
      for (const sim::AutoscaleTry& t : autoscale->tries) {
        nlohmann::json x = summary(t.replay);
        x["active_sequences"] = t.sequences;
        x["meets"] = t.meets;
        tries.push_back(x);
      }
      j["autoscaling"] = {
          {"queued_prompt_tokens", autoscale->queued_tokens},
          {"active_sequences",
           autoscale->chosen >= 0 ? autoscale->tries[autoscale->chosen].sequences : 0.0},
          {"tries", tries},
          {"phases", phases},
          {"requests", autoscale->requests},
          {"fixed", summary(autoscale->fixed)}};
    }
    for (const sim::Sensitivity& x : sens) {
      j["sensitivity"].push_back({{"term", x.term},
                                  {"factor", x.factor},
                                  {"recommendation", x.recommendation},
                                  {"same", x.same}});
    }
    std::ofstream out(json_path);
    out << j.dump(1) << "\n";
    if (!out) return fail(absl::UnavailableError(absl::StrCat("cannot write ", json_path)));
  }
  return 0;
}

}  // namespace

int PlanCommand(int argc, char** argv) {
  std::string bench_path, json_path;
  double rate = 0, ttft_ms = 0, tpot_ms = 0, headroom = 0.7;
  int64_t input_tokens = 0, output_tokens = 0, block_tokens = 16;
  FlagParser flags("plan",
                   "Recommends prefill and decode worker counts for a request rate, and the "
                   "autoscaler targets that hold them, from a pdq bench --json run against one "
                   "prefill and one decode worker.");
  flags.String("bench", &bench_path, "pdq bench --json output (concurrency levels, 1P+1D)");
  flags.Float("rate", &rate, 0, 1e9, "requests per second to serve");
  flags.Int("input-tokens", &input_tokens, 0, 1 << 20, "prompt tokens (default: the bench's)");
  flags.Int("output-tokens", &output_tokens, 0, 1 << 20, "output tokens (default: the bench's)");
  flags.Float("ttft-target-ms", &ttft_ms, 0, 1e9, "TTFT target (default: the bench's, else 2000)");
  flags.Float("tpot-target-ms", &tpot_ms, 0, 1e9, "TPOT target (default: the bench's, else 200)");
  flags.Float("headroom", &headroom, 0.05, 1, "fraction of measured capacity to plan for");
  flags.Int("block-tokens", &block_tokens, 1, 1024, "tokens per KV block of the workers");
  flags.String("json", &json_path, "also write the plan here");
  SimPlanFlags sim_flags;
  sim_flags.Register(flags);
  if (int rc = ParseOrExit(flags, argc, argv); rc >= 0) return rc;
  sim_flags.price_given = flags.Given("worker-hour-price");
  sim_flags.core_price_given = flags.Given("core-hour-price");
  if (!sim_flags.cluster_nodes.empty()) {
    if (sim_flags.profile.empty()) {
      return Fail("plan", absl::InvalidArgumentError("--cluster-nodes needs --sim PROFILE"));
    }
    return ClusterCommand(sim_flags, input_tokens, output_tokens, ttft_ms, tpot_ms, json_path);
  }
  if (!sim_flags.profile.empty()) {
    if (rate <= 0) {
      return Fail("plan",
                  absl::InvalidArgumentError("--rate is required (requests per second, > 0)"));
    }
    return SimPlanCommand(sim_flags, rate, input_tokens, output_tokens, ttft_ms, tpot_ms,
                          json_path);
  }
  if (bench_path.empty()) return Fail("plan", absl::InvalidArgumentError("--bench is required"));
  if (rate <= 0)
    return Fail("plan",
                absl::InvalidArgumentError("--rate is required (requests per second, > 0)"));
  absl::StatusOr<BenchResult> read = ReadBenchResult(bench_path);
  if (!read.ok()) return Fail("plan", read.status());
  const BenchResult& bench = *read;
  PlanRequest request;
  request.rate = rate;
  request.input_tokens = input_tokens;
  request.output_tokens = output_tokens;
  request.ttft_target_ms = ttft_ms;
  request.tpot_target_ms = tpot_ms;
  request.headroom = headroom;
  request.block_tokens = block_tokens;
  absl::StatusOr<DeploymentPlan> plan = PlanDeployment(bench, request);
  if (!plan.ok()) return Fail("plan", plan.status());
  const DeploymentPlan& p = *plan;
  const PlanRequest& r = p.request;
  std::printf("measured in %s:\n", bench_path.c_str());
  std::printf("  a prefill worker computes %.0f prompt tokens/s while busy\n",
              p.prefill_tokens_per_s);
  std::printf(
      "  a decode worker keeps TPOT p90 within %.0f ms up to %d streams (TPOT p50 %.1f ms)\n",
      r.tpot_target_ms, p.decode_streams, p.tpot_p50 * 1e3);
  std::printf("for %.3g requests/s of %lld tokens in and %lld out, at %.0f%% of that capacity:\n",
              r.rate, (long long)r.input_tokens, (long long)r.output_tokens, r.headroom * 100);
  std::printf("  prefill workers: %d  (%.0f prompt tokens/s to compute)\n", p.prefill_workers,
              p.prefill_load);
  std::printf("  decode workers:  %d  (%.1f streams decoding at once)\n", p.decode_workers,
              p.streams);
  std::printf("autoscaler targets (average value per pod):\n");
  std::printf(
      "  prefill: pdq_queued_prompt_tokens %.0f  (a queue one worker computes in half the "
      "%.0f ms TTFT target)\n",
      p.hpa_prefill_queued_prompt_tokens, r.ttft_target_ms);
  std::printf(
      "  decode:  pdq_active_sequences %d  (the streams one worker runs within the TPOT "
      "target)\n",
      p.decode_streams);
  if (p.hpa_decode_kv_blocks_used_ratio > 0) {
    std::printf(
        "  decode:  pdq_kv_blocks_used_ratio %.2f  (the KV %d streams of %lld tokens "
        "reserve on one worker)\n",
        p.hpa_decode_kv_blocks_used_ratio, p.decode_streams,
        (long long)(r.input_tokens + r.output_tokens));
  }
  if (!json_path.empty()) {
    const nlohmann::json out = {
        {"rate", r.rate},
        {"input_tokens", r.input_tokens},
        {"output_tokens", r.output_tokens},
        {"ttft_target_ms", r.ttft_target_ms},
        {"tpot_target_ms", r.tpot_target_ms},
        {"headroom", r.headroom},
        {"prefill_tokens_per_s", p.prefill_tokens_per_s},
        {"decode_streams_per_worker", p.decode_streams},
        {"prefill_workers", p.prefill_workers},
        {"decode_workers", p.decode_workers},
        {"hpa_prefill_queued_prompt_tokens", p.hpa_prefill_queued_prompt_tokens},
        {"hpa_decode_kv_blocks_used_ratio", p.hpa_decode_kv_blocks_used_ratio}};
    std::ofstream f(json_path);
    f << out.dump(1) << "\n";
    if (!f) return Fail("plan", absl::UnavailableError(absl::StrCat("cannot write ", json_path)));
  }
  return 0;
}

}  // namespace pdq
