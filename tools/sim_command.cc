// `pdq sim`: how a deployment would serve a workload, simulated from a
// measured profile (`pdq profile`) with the workers' own batching and the
// router's own routing (sim/sim.h). Every figure it prints is a projection
// from the profile, over several seeds with 95% confidence intervals.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "harness/load_generator.h"
#include "nlohmann/json.hpp"
#include "sim/profile.h"
#include "sim/sim.h"
#include "tools/commands.h"

namespace pdq {
namespace {

std::string Figure(const sim::Estimate& e, double scale, const char* unit) {
  return absl::StrFormat("%.4g ± %.2g %s", e.mean * scale, e.half_width * scale, unit);
}

nlohmann::json ToJson(const sim::Estimate& e) {
  return {{"mean", e.mean}, {"ci95_half_width", e.half_width}};
}

const char* PoolName(sim::Role r) {
  return r == sim::Role::kPrefill ? "prefill" : r == sim::Role::kDecode ? "decode" : "monolithic";
}

// --trace: the first seed's run, request by request and step by step.
absl::Status WriteTrace(const sim::Deployment& d, const sim::Workload& w, const std::string& path) {
  sim::RunOptions o;
  o.trace_steps = true;
  absl::StatusOr<sim::RunResult> run = sim::Simulate(d, w, o);
  if (!run.ok()) return run.status();
  nlohmann::json requests = nlohmann::json::array(), steps = nlohmann::json::array(),
                 workers = nlohmann::json::array();
  for (const sim::WorkerRecord& x : run->workers) {
    workers.push_back({{"role", PoolName(x.role)},
                       {"arm", x.arm},
                       {"steps", x.steps},
                       {"busy_seconds", x.busy_seconds}});
  }
  for (const sim::RequestRecord& r : run->requests) {
    requests.push_back({{"id", r.id},
                        {"client", r.client},
                        {"measured", r.measured},
                        {"refused", r.refused()},
                        {"prompt_tokens", r.prompt_tokens},
                        {"output_tokens", r.output_tokens},
                        {"arrival", r.arrival},
                        {"first_token", r.first_token},
                        {"finish", r.finish},
                        {"prefill_worker", r.prefill_worker},
                        {"decode_worker", r.decode_worker}});
  }
  for (const sim::StepRecord& s : run->steps) {
    nlohmann::json chunks = nlohmann::json::array();
    for (const auto& [id, tokens] : s.chunks) chunks.push_back({id, tokens});
    steps.push_back({{"worker", s.worker},
                     {"start", s.start},
                     {"seconds", s.seconds},
                     {"rows", s.rows},
                     {"chunks", chunks}});
  }
  std::ofstream out(path);
  out << nlohmann::json{{"seed", w.seed},
                        {"workers", workers},
                        {"requests", requests},
                        {"steps", steps}}
             .dump(1)
      << "\n";
  if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

}  // namespace

int SimCommand(int argc, char** argv) {
  std::string profile_path, deployment = "1P+1D", workload, json_path, trace_path, hpa_path,
                            rate_phases, split, arms, router_time = "exponential";
  std::string prefill_precision = "w8a8", decode_precision = "w4a16", mono_precision = "fp16",
              mono_prefill_precision, transport = "tcp";
  int64_t threads = 0, prompt_tokens = 0, output_tokens = 0, concurrency = 0, requests = 500,
          warmup = 50, seeds = 5, seed = 1, batch = 64, budget = 2048, kv_blocks = 1 << 20;
  double rate = 0, burstiness = 1, spread = 0, ttft_ms = 2000, tpot_ms = 200, step_target_ms = 0,
         prompt_share = 0, noise = 0, pod_start_seconds = -1, hpa_sync_seconds = 15,
         heartbeat_ms = 500;
  bool idle_passes = false, co_located = false, split_sticky = false, client_ids = false;
  FlagParser flags(
      "sim",
      "Simulates a deployment serving a workload from a measured profile (pdq profile): the "
      "workers batch and the router routes with pdq's own policy. Prints TTFT and TPOT "
      "percentiles, throughput and goodput over several seeds, with 95% confidence intervals. "
      "All figures are projections from the profile.");
  flags.String("profile", &profile_path, "pdq profile's JSON (required)");
  flags.String("deployment", &deployment, "workers by role: 1P+1D, 2P+6D, 4M, 1P+2D+1M");
  flags.String("prefill-precision", &prefill_precision, "prefill workers' precision");
  flags.String("decode-precision", &decode_precision, "decode workers' precision");
  flags.String("monolithic-precision", &mono_precision, "monolithic workers' precision");
  flags.String("monolithic-prefill-precision", &mono_prefill_precision,
               "monolithic workers compute prompts at this precision on a second model "
               "(default: the same model)");
  flags.String("split", &split,
               "an A/B rollout, as pdq-router's --split: POOL=WEIGHT,... (e.g. "
               "fp16=50,w8a8-w4a16=50); each request goes to one pool, drawn by weight as the "
               "router draws it, and the pools' workers come from --arms, in place of "
               "--deployment and the precisions above");
  flags.String("arms", &arms,
               "with --split: each pool's workers and precision pair, "
               "POOL=DEPLOYMENT:PREFILL/DECODE,... (e.g. fp16=1M:fp16,w8a8-w4a16=1M:w8a8/w4a16; "
               "a monolithic worker computes prompts at PREFILL on a second model where the two "
               "differ)");
  flags.Bool("split-sticky", &split_sticky,
             "with --split: the router keeps each client id in one pool (pdq-router "
             "--split-sticky); requests without an id are still drawn");
  flags.Bool("client-ids", &client_ids,
             "closed loop: each client sends its own id, as pdq bench --client-ids does, so "
             "with --split-sticky a client's requests all go to the pool its id hashes to, the "
             "router's pool for that id");
  flags.Int("threads", &threads, 0, 1024,
            "the profile's passes at this many threads (0: the most)");
  flags.String("transport", &transport, "the KV link of the profile to use");
  flags.String("workload", &workload,
               "chat (128 in, 512 out), summarize (2048, 32) or analysis (2048, 512)");
  flags.Int("prompt-tokens", &prompt_tokens, 0, 1 << 20, "prompt tokens (default: the workload's)");
  flags.Int("output-tokens", &output_tokens, 0, 1 << 20, "output tokens (default: the workload's)");
  flags.Float("length-spread", &spread, 0, 0.99, "lengths uniform in (1 +- this) x their mean");
  flags.Float("rate", &rate, 0, 1e9, "open-loop arrivals a second (or --concurrency)");
  flags.Float("burstiness", &burstiness, 0.01, 100,
              "coefficient of variation of the gaps between arrivals (1: Poisson)");
  flags.Int("concurrency", &concurrency, 0, 1 << 20, "closed loop: clients sending back to back");
  flags.Int("requests", &requests, 1, 1 << 24, "measured requests a seed");
  flags.Int("warmup", &warmup, 0, 1 << 24,
            "requests not measured: the first to end, as pdq bench counts");
  flags.Int("seeds", &seeds, 1, 1000, "runs, each with its own seed");
  flags.Int("seed", &seed, 0, 1LL << 62,
            "the first seed (seed N's arrivals at --burstiness 1 without --rate-phases are those "
            "`pdq bench --rate R --arrival-seed N` sends)");
  flags.Float("ttft-target-ms", &ttft_ms, 0, 1e9, "TTFT target of goodput");
  flags.Float("tpot-target-ms", &tpot_ms, 0, 1e9, "TPOT target of goodput");
  flags.Int("max-decode-batch", &batch, 1, 4096, "workers' --max-decode-batch");
  flags.Int("prefill-budget", &budget, 1, 1 << 20, "workers' --prefill-budget");
  flags.Float("step-target-ms", &step_target_ms, 0, 1e6, "workers' --tpot-target-ms (ms)");
  flags.Float("prompt-share", &prompt_share, 0, 0.95,
              "workers' --prompt-share under --tpot-target-ms auto (used without a "
              "--step-target-ms; 0: workers with --tpot-target-ms off)");
  flags.Int("kv-blocks", &kv_blocks, 1, 1LL << 40, "KV blocks per decode or monolithic worker");
  flags.Float("noise", &noise, 0, 2, "relative spread of step times (log-normal sigma)");
  flags.Bool("idle-passes", &idle_passes,
             "forward passes as the profile timed them alone, not times its measured "
             "served_factor (the router, gRPC and clients sharing the cores), served_prompt_factor "
             "or served_row_factors, "
             "and no stepping-loop time outside them (its step_overhead and "
             "stream_finish_seconds)");
  flags.Bool("co-located", &co_located,
             "each prefill worker shares a machine with a decode worker, pinned to cores apart "
             "(1P+1D on one box): they run on the profile's split probe of their pair (pdq "
             "profile --split-pairs), which sees the slowdown of each beside the other, in place "
             "of their passes' served factors, the decode worker only for steps that start "
             "while the prefill worker runs or starts one");
  flags.String("rate-phases", &rate_phases,
               "open loop: the rate in phases SECONDS:RATE,... repeated (e.g. 90:10,400:0.2), "
               "instead of --rate");
  flags.String("hpa", &hpa_path,
               "Kubernetes HorizontalPodAutoscalers (JSON: `kubectl get hpa -o json`, or the "
               "rendered manifests as JSON) that scale the pools: each scales the pool its "
               "scaleTargetRef names (prefill, decode, else monolithic); the deployment's "
               "counts are the starting replicas");
  flags.Float("pod-start-seconds", &pod_start_seconds, -1, 1e6,
              "with --hpa: a new worker's time from creation to serving; -1: the profile's "
              "model load and start-up prompt probe (no scheduling or image pull)");
  flags.Float("hpa-sync-seconds", &hpa_sync_seconds, 0.1, 3600,
              "with --hpa: the controller's --horizontal-pod-autoscaler-sync-period");
  bool bound_streams = true;
  flags.Bool("bound-streams", &bound_streams,
             "the router's --max-streams-per-worker batch (its default): a worker that decodes "
             "takes no stream past its --batch, the router refuses it; --bound-streams=false: "
             "--max-streams-per-worker off (streams past the batch take turns)");
  flags.String("router-time", &router_time,
               "each request's time through the router (the profile's router_seconds is its "
               "mean): exponential (drawn per request, seeded: requests sent at once reach a "
               "worker apart, and an idle worker starts its step on the first, as real ones do) "
               "or fixed (the mean for every request: requests sent at once arrive together)");
  flags.Float("heartbeat-ms", &heartbeat_ms, 0, 60000,
              "the router's --heartbeat-ms: it routes on each worker's load as of its last "
              "heartbeat (0: on the exact load)");
  flags.String("json", &json_path, "also write the results here");
  flags.String("trace", &trace_path,
               "write the first seed's run here (JSON): each request's arrival, first token and "
               "end (seconds), its workers, and each step's worker, start, time, decode rows and "
               "prompt chunks (request id, tokens)");
  if (int rc = ParseOrExit(flags, argc, argv); rc >= 0) return rc;
  auto fail = [](const absl::Status& s) { return Fail("sim", s); };
  if (profile_path.empty()) return fail(absl::InvalidArgumentError("--profile is required"));
  if (router_time != "exponential" && router_time != "fixed") {
    return fail(absl::InvalidArgumentError(
        absl::StrCat("--router-time: '", router_time, "' is neither exponential nor fixed")));
  }
  if ((rate > 0) + (concurrency > 0) + !rate_phases.empty() != 1) {
    return fail(absl::InvalidArgumentError("give one of --rate, --rate-phases and --concurrency"));
  }
  if (!workload.empty()) {
    const WorkloadShape* shape = StandardWorkload(workload);
    if (shape == nullptr) {
      return fail(absl::InvalidArgumentError(
          absl::StrCat("--workload: unknown '", workload, "' (chat, summarize or analysis)")));
    }
    if (prompt_tokens == 0) prompt_tokens = shape->input;
    if (output_tokens == 0) output_tokens = shape->output;
  }
  if (prompt_tokens == 0 || output_tokens == 0) {
    return fail(
        absl::InvalidArgumentError("give --workload, or --prompt-tokens and --output-tokens"));
  }
  std::vector<sim::Workload::Phase> phases;
  if (!rate_phases.empty()) {
    absl::StatusOr<std::vector<sim::Workload::Phase>> p = sim::ParsePhases(rate_phases);
    if (!p.ok()) return fail(p.status());
    phases = *p;
  }
  std::vector<sim::PoolHpa> hpas;
  if (!hpa_path.empty()) {
    absl::StatusOr<std::vector<sim::PoolHpa>> h = sim::ReadHpas(hpa_path);
    if (!h.ok()) return fail(h.status());
    hpas = std::move(*h);
  }
  if (split.empty() != arms.empty()) {
    return fail(absl::InvalidArgumentError("--split and --arms go together"));
  }
  if (split_sticky && split.empty()) {
    return fail(absl::InvalidArgumentError("--split-sticky needs --split"));
  }
  if (client_ids && !(concurrency > 0)) {
    return fail(absl::InvalidArgumentError(
        "--client-ids names closed-loop clients: it needs --concurrency"));
  }
  if (!split.empty() && !hpas.empty()) {
    return fail(absl::InvalidArgumentError(
        "--hpa with --split: HPAs on an A/B rollout's pools are not modelled"));
  }
  absl::StatusOr<sim::Profile> profile = sim::ReadProfile(profile_path);
  if (!profile.ok()) return fail(profile.status());
  sim::Deployment d;
  if (absl::Status s = sim::ParseDeployment(deployment, &d); !s.ok()) return fail(s);
  const sim::Precisions precisions{prefill_precision, decode_precision, mono_precision,
                                   mono_prefill_precision};
  sim::WorkerOptions wo;
  wo.threads = (int)threads;
  wo.transport = transport;
  wo.max_decode_batch = (int)batch;
  wo.token_budget = budget;
  wo.step_target_seconds = step_target_ms / 1e3;
  wo.prompt_share = prompt_share;
  wo.kv_blocks = kv_blocks;
  wo.noise = noise;
  wo.idle_passes = idle_passes;
  wo.co_located = co_located;
  // Each pool's precisions: the deployment's, or each A/B arm's.
  std::vector<sim::Precisions> pool_precisions = {precisions};
  if (split.empty()) {
    if (absl::Status s = sim::SpecsFromProfile(*profile, precisions, wo, &d); !s.ok()) {
      return fail(s);
    }
  } else {
    absl::StatusOr<std::vector<sim::Precisions>> a =
        sim::ArmsFromProfile(*profile, split, arms, wo, &d);
    if (!a.ok()) return fail(a.status());
    pool_precisions = std::move(*a);
  }
  // ... and its workers.
  const std::vector<const sim::Workers*> pools = d.Pools();
  if (co_located && std::none_of(pools.begin(), pools.end(), [](const sim::Workers* w) {
        return w->prefill > 0 && w->decode > 0;
      })) {
    return fail(absl::InvalidArgumentError(
        "--co-located pairs prefill with decode workers: the deployment has no P and D"));
  }
  for (sim::PoolHpa& h : hpas) {
    h.spec.sync_seconds = hpa_sync_seconds;
    d.hpa(sim::PoolRole(h.pool)) = h.spec;
  }
  if (!hpas.empty() && pod_start_seconds < 0) {
    absl::StatusOr<double> start = sim::PodStartSeconds(*profile, precisions, wo, d);
    if (!start.ok()) {
      return fail(absl::Status(start.status().code(),
                               absl::StrCat(start.status().message(), " (--pod-start-seconds)")));
    }
    pod_start_seconds = *start;
  }
  d.pod_start_seconds = std::max(0.0, pod_start_seconds);
  d.heartbeat_seconds = heartbeat_ms / 1e3;
  d.bound_streams = bound_streams;
  d.random_router_time = router_time == "exponential";
  d.split_sticky = split_sticky;
  sim::Workload w;
  w.arrivals = concurrency > 0   ? sim::Workload::Arrivals::kClosedLoop
               : burstiness == 1 ? sim::Workload::Arrivals::kPoisson
                                 : sim::Workload::Arrivals::kGamma;
  w.rate = rate;
  w.phases = phases;
  w.burstiness = burstiness;
  w.concurrency = (int)concurrency;
  w.client_ids = client_ids;
  w.requests = (int)requests;
  w.warmup = (int)warmup;
  w.prompt_tokens = prompt_tokens;
  w.output_tokens = output_tokens;
  w.length_spread = spread;
  w.seed = (uint64_t)seed;
  const sim::Targets targets{ttft_ms / 1e3, tpot_ms / 1e3};
  absl::StatusOr<sim::SeedSummary> r = sim::RunSeeds(d, w, targets, (int)seeds);
  if (!r.ok()) return fail(r.status());
  std::printf(
      "projected from %s (%s, %d cores, %s, %s KV): %s serving %lld tokens in, %lld out, %s\n",
      profile_path.c_str(), profile->cpu.c_str(), profile->cores, profile->isa.c_str(),
      profile->kv_dtype.c_str(), d.Name().c_str(), (long long)prompt_tokens,
      (long long)output_tokens,
      concurrency > 0 ? absl::StrCat(concurrency, " clients back to back").c_str()
      : !phases.empty()
          ? absl::StrCat("requests/s in phases ", rate_phases, " (s:rate)").c_str()
          : absl::StrFormat(
                "%.3g requests/s%s", rate,
                burstiness == 1 ? " (Poisson)" : absl::StrFormat(" (gap CV %.2g)", burstiness))
                .c_str());
  std::printf("  %d seeds x %lld requests; 95%% confidence intervals\n", r->seeds,
              (long long)requests);
  {
    // Whether the passes are served ones (sim::WorkerOptions::idle_passes).
    std::vector<std::string> used;
    for (size_t i = 0; i < pools.size(); ++i) {
      const sim::Precisions& p = pool_precisions[i];
      if (pools[i]->monolithic > 0) used.insert(used.end(), {p.monolithic, p.monolithic_prompt});
      if (pools[i]->prefill > 0) used.push_back(p.prefill);
      if (pools[i]->decode > 0) used.push_back(p.decode);
    }
    std::vector<std::string> factors, stepped;
    for (const std::string& precision : used) {
      absl::StatusOr<sim::PassProfile> pass = profile->Pass(precision, wo.threads);
      if (!precision.empty() && pass.ok() && !pass->time.row_steps.empty() &&
          std::find(stepped.begin(), stepped.end(), precision) == stepped.end()) {
        stepped.push_back(precision);
      }
      if (precision.empty() || !pass.ok() ||
          !(pass->served_factor > 0 || pass->served_prompt_factor > 0 ||
            pass->stream_finish_seconds > 0)) {
        continue;
      }
      std::string f = pass->served_factor > 0
                          ? absl::StrFormat("%s x%.2f", precision, pass->served_factor)
                          : absl::StrFormat("%s x1 (no served_factor)", precision);
      if (pass->served_pair_factor > 0 && pass->served_pair_factor != pass->served_factor) {
        absl::StrAppendFormat(&f, " (attention x%.2f)", pass->served_pair_factor);
      }
      if (pass->served_prompt_factor > 0) {
        absl::StrAppendFormat(&f, ", prompt tokens x%.2f", pass->served_prompt_factor);
      }
      if (pass->served_factor > 0 && !pass->served_row_factors.empty()) {
        const auto& [rows, factor] = pass->served_row_factors.front();
        absl::StrAppendFormat(&f, ", decode steps of %.0f row%s x%.2f that", rows,
                              rows == 1 ? "" : "s", factor);
      }
      if (pass->step_overhead > 0 || pass->step_overhead_per_row > 0) {
        absl::StrAppendFormat(&f, ", +%.2f ms +%.3f ms a row a step outside the passes",
                              pass->step_overhead * 1e3, pass->step_overhead_per_row * 1e3);
      }
      if (pass->stream_finish_seconds > 0) {
        absl::StrAppendFormat(&f, ", +%.3f ms a stream ending", pass->stream_finish_seconds * 1e3);
      }
      if (std::find(factors.begin(), factors.end(), f) == factors.end()) factors.push_back(f);
    }
    std::printf("  passes: %s\n",
                factors.empty() ? "as timed alone (the profile has no served_factor for them)"
                : idle_passes   ? "as timed alone (--idle-passes)"
                                : absl::StrCat("served (the profile's served_factor x the time "
                                                 "alone): ",
                                               absl::StrJoin(factors, "; "))
                                    .c_str());
    for (size_t i = 0; i < pools.size() && co_located && !idle_passes; ++i) {
      if (!(pools[i]->prefill > 0 && pools[i]->decode > 0)) continue;
      const sim::Precisions& p = pool_precisions[i];
      const sim::SplitProfile pair = *sim::CoLocatedSplit(*profile, p, wo);  // found above
      std::printf(
          "  co-located: %s prefill x%.2f, %s decode x%.2f (attention x%.2f), +%.2f ms +%.3f ms "
          "a row a step outside the passes (the profile's split probe, in place of the above; "
          "for decode steps that start while the prefill worker runs or starts one)\n",
          p.prefill.c_str(), pair.prefill_factor, p.decode.c_str(), pair.decode_factor,
          pair.decode_pair_factor, pair.decode_step_overhead * 1e3,
          pair.decode_step_overhead_per_row * 1e3);
    }
    std::printf("  step times: %s\n",
                stepped.empty()
                    ? "the profile's line in rows, tokens and attention"
                    : absl::StrCat("the profile's line and where its passes left it by rows (",
                                   absl::StrJoin(stepped, ", "), ")")
                          .c_str());
  }
  if (r->seeds > 1 && concurrency > 0 && spread == 0 && noise == 0 &&
      (d.arms.empty() || sim::StickyClients(d, w)) &&
      !(d.random_router_time && d.router_seconds > 0)) {
    // Nothing in such a run draws from the seed.
    std::printf(
        "  (every seed runs alike here: closed loop, fixed lengths, no --noise, fixed router "
        "time; the intervals are 0 by construction, not certainty: --length-spread, --noise or "
        "--router-time exponential give them a spread)\n");
  }
  std::printf("  TTFT p50 %s  p90 %s  p99 %s\n", Figure(r->ttft_p50, 1e3, "ms").c_str(),
              Figure(r->ttft_p90, 1e3, "ms").c_str(), Figure(r->ttft_p99, 1e3, "ms").c_str());
  std::printf("  TPOT p50 %s  p90 %s  p99 %s\n", Figure(r->tpot_p50, 1e3, "ms").c_str(),
              Figure(r->tpot_p90, 1e3, "ms").c_str(), Figure(r->tpot_p99, 1e3, "ms").c_str());
  std::printf("  output %s; goodput %s (%.0f%% of requests within %.0f ms TTFT and %.0f ms TPOT)\n",
              Figure(r->output_tokens_per_second, 1, "tokens/s").c_str(),
              Figure(r->goodput, 1, "requests/s").c_str(), r->met_fraction.mean * 100, ttft_ms,
              tpot_ms);
  // Near a target goodput turns over on a few percent of latency: say how
  // far, and when it moves by more than the latencies did.
  const double margin = sim::kGoodputMargin;
  std::printf("  goodput were every TTFT and TPOT %.0f%% longer: %s; %.0f%% shorter: %s%s\n",
              margin * 100, Figure(r->goodput_if_slower, 1, "requests/s").c_str(), margin * 100,
              Figure(r->goodput_if_faster, 1, "requests/s").c_str(),
              r->goodput_if_slower.mean < (1 - margin) * r->goodput_if_faster.mean
                  ? absl::StrFormat(" (it moves more than %.0f%%: requests sit near a target)",
                                    margin * 100)
                        .c_str()
                  : "");
  if (r->refusals.total() > 0) {
    // By reason, the router's words first (as clients see them).
    std::vector<std::string> why;
    const sim::RefusalCounts& n = r->refusals;
    if (n.batch_full > 0) {
      why.push_back(absl::StrCat(n.batch_full,
                                 " batch_full (a full decode batch: --max-decode-batch, "
                                 "--bound-streams)"));
    }
    if (n.kv_full > 0)
      why.push_back(absl::StrCat(n.kv_full, " kv_full (no room for the KV: --kv-blocks)"));
    if (n.no_worker > 0) {
      why.push_back(absl::StrCat(n.no_worker, " no_worker (no worker of a pool serving yet)"));
    }
    std::printf("  %lld requests refused: %s\n", (long long)r->refusals.total(),
                absl::StrJoin(why, ", ").c_str());
  }
  const std::string bound = sim::NameBottleneck(r->busy, r->refusals);
  std::printf("  bound: %s\n", bound.c_str());
  // An A/B rollout's arms, each alone (the router's pool-labelled metrics).
  nlohmann::json arm_json = nlohmann::json::array();
  for (size_t i = 0; i < r->arms.size(); ++i) {
    const sim::SeedSummary::ArmFigures& a = r->arms[i];
    const sim::Precisions& p = pool_precisions[i];
    const std::string pair = p.prefill == p.decode ? p.decode : p.prefill + "/" + p.decode;
    const std::string arm_bound = sim::NameBottleneck(a.busy, a.refusals);
    if (a.seeds == 0) {
      // No seed sent it a measured request (a sticky split whose clients
      // all hash elsewhere, or a small weight): no figures to show.
      std::printf("  arm %s (weight %g, %s %s): no measured request in any seed\n", a.pool.c_str(),
                  d.arms[i].weight, d.arms[i].Name().c_str(), pair.c_str());
    } else {
      std::printf(
          "  arm %s (weight %g, %s %s): %s requests a seed; over the %d seeds that drew it one: "
          "TTFT p50 %s  p90 %s; TPOT p50 %s  p90 %s; output %s; bound: %s\n",
          a.pool.c_str(), d.arms[i].weight, d.arms[i].Name().c_str(), pair.c_str(),
          absl::StrFormat("%.4g ± %.2g", a.measured.mean, a.measured.half_width).c_str(), a.seeds,
          Figure(a.ttft_p50, 1e3, "ms").c_str(), Figure(a.ttft_p90, 1e3, "ms").c_str(),
          Figure(a.tpot_p50, 1e3, "ms").c_str(), Figure(a.tpot_p90, 1e3, "ms").c_str(),
          Figure(a.output_tokens_per_second, 1, "tokens/s").c_str(), arm_bound.c_str());
    }
    arm_json.push_back({{"pool", a.pool},
                        {"weight", d.arms[i].weight},
                        {"deployment", d.arms[i].Name()},
                        {"prefill_precision", p.prefill},
                        {"decode_precision", p.decode},
                        {"measured", ToJson(a.measured)},
                        {"seeds_drawn", a.seeds},
                        {"ttft_p50", ToJson(a.ttft_p50)},
                        {"ttft_p90", ToJson(a.ttft_p90)},
                        {"ttft_p99", ToJson(a.ttft_p99)},
                        {"tpot_p50", ToJson(a.tpot_p50)},
                        {"tpot_p90", ToJson(a.tpot_p90)},
                        {"tpot_p99", ToJson(a.tpot_p99)},
                        {"output_tokens_per_second", ToJson(a.output_tokens_per_second)},
                        {"goodput", ToJson(a.goodput)},
                        {"goodput_if_slower", ToJson(a.goodput_if_slower)},
                        {"goodput_if_faster", ToJson(a.goodput_if_faster)},
                        {"refused", a.refusals.total()},
                        {"bound", arm_bound}});
  }
  // The autoscalers: the workers they kept (what the deployment costs),
  // and the first seed's scaling as a timeline.
  nlohmann::json timeline = nlohmann::json::array();
  const bool autoscaled = d.prefill_hpa || d.decode_hpa || d.monolithic_hpa;
  if (autoscaled) {
    std::printf(
        "  workers (HPA, %.3g s to start): mean %.3g ± %.2g, peak %d; %lld changes over %d seeds\n",
        pod_start_seconds, r->mean_workers.mean, r->mean_workers.half_width, r->peak_workers,
        (long long)r->scale_events, r->seeds);
    const std::vector<sim::ScaleRecord>& first = r->first_seed_scaling;
    const size_t shown = 12;
    for (size_t i = 0; i < first.size(); ++i) {
      const sim::ScaleRecord& s = first[i];
      timeline.push_back(
          {{"time", s.time}, {"pool", PoolName(s.role)}, {"from", s.from}, {"to", s.to}});
      if (i < shown) {
        std::printf("    %7.0f s  %s %d -> %d\n", s.time, PoolName(s.role), s.from, s.to);
      }
    }
    if (first.size() > shown) {
      std::printf("    ... %zu more (seed %lld; --json has them all)\n", first.size() - shown,
                  (long long)seed);
    }
  }
  if (!trace_path.empty()) {
    if (absl::Status s = WriteTrace(d, w, trace_path); !s.ok()) return fail(s);
  }
  if (!json_path.empty()) {
    nlohmann::json j = {{"projected_from", profile_path},
                        {"deployment", d.Name()},
                        {"prompt_tokens", prompt_tokens},
                        {"output_tokens", output_tokens},
                        {"rate", rate},
                        {"concurrency", concurrency},
                        {"burstiness", burstiness},
                        {"seeds", r->seeds},
                        {"requests", requests},
                        {"ttft_p50", ToJson(r->ttft_p50)},
                        {"ttft_p90", ToJson(r->ttft_p90)},
                        {"ttft_p99", ToJson(r->ttft_p99)},
                        {"tpot_p50", ToJson(r->tpot_p50)},
                        {"tpot_p90", ToJson(r->tpot_p90)},
                        {"tpot_p99", ToJson(r->tpot_p99)},
                        {"output_tokens_per_second", ToJson(r->output_tokens_per_second)},
                        {"goodput", ToJson(r->goodput)},
                        {"met_fraction", ToJson(r->met_fraction)},
                        {"goodput_if_slower", ToJson(r->goodput_if_slower)},
                        {"goodput_if_faster", ToJson(r->goodput_if_faster)},
                        {"goodput_margin", sim::kGoodputMargin},
                        {"ttft_target_ms", ttft_ms},
                        {"tpot_target_ms", tpot_ms},
                        {"refused", r->refusals.total()},
                        {"refusals",
                         {{"kv_full", r->refusals.kv_full},
                          {"batch_full", r->refusals.batch_full},
                          {"no_worker", r->refusals.no_worker}}},
                        {"busy",
                         {{"prefill", r->busy.prefill},
                          {"decode", r->busy.decode},
                          {"monolithic", r->busy.monolithic},
                          {"link", r->busy.link}}},
                        {"bound", bound}};
    if (autoscaled) {
      j["workers"] = {{"mean", ToJson(r->mean_workers)}, {"peak", r->peak_workers}};
      j["scaling_first_seed"] = timeline;
      j["pod_start_seconds"] = pod_start_seconds;
    }
    if (!phases.empty()) j["rate_phases"] = rate_phases;
    if (!arm_json.empty()) {
      j["split"] = split;
      j["arms"] = arm_json;
      if (split_sticky) j["split_sticky"] = true;
    }
    if (client_ids) j["client_ids"] = true;
    j["router_time"] = router_time;
    std::ofstream out(json_path);
    out << j.dump(2) << "\n";
    if (!out) return fail(absl::UnavailableError(absl::StrCat("cannot write ", json_path)));
  }
  return 0;
}

}  // namespace pdq
