// pdq sim: a discrete-event simulator of a pdq deployment (clients, the
// router, prefill, decode and monolithic workers, the KV links between
// them) that batches with the workers' own policy (policy/batch.h) and
// routes with the router's (policy/route.h), timing each step with a step
// time model measured by `pdq profile` (sim/profile.h). It answers what one
// machine cannot run: how a deployment of many workers would serve a
// workload, for sizing (pdq plan --sim).
//
// What it models: open-loop (Poisson or bursty) and closed-loop arrivals;
// per worker, continuous batching with chunked prefill under the token
// budget and the TPOT target, with the online step cost model the real
// worker fits (policy/step_plan.h) learning from the simulated step times;
// a prefill worker's KV streaming out layer by layer during its last chunk,
// over a sender and a receiver link that each carry one transfer at a time;
// the decode worker's KV reservation (a request that finds no room is
// refused, as the router refuses it), answered between that worker's steps
// before the prompt goes to its prefill worker (a refusal is immediate
// here, where the real worker's exact check also waits for the step); an
// A/B rollout's pools, each request
// drawn to one by the router's split (policy/traffic_split.h). What it
// does not model yet: the prefix
// cache, deadlines and cancels, live migration, pods sharing a node's
// memory bandwidth other than a prefill and a decode worker paired on one
// box (Workers::co_located, on the profile's split probe) (each said where
// a figure depends on it). Pools can
// carry Kubernetes HPAs (sim/autoscaler.h) that add and remove workers as
// the real ones would. Deterministic for a seed.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "policy/batch.h"
#include "sim/autoscaler.h"

namespace pdq::sim {

// A forward pass's time as a linear function of policy::StepWork, in
// seconds: what `pdq profile` fits for one model at one thread count (the
// workers' cost models fit the same form).
using PassTime = policy::StepCoefficients;

enum class Role { kPrefill, kDecode, kBoth };

// Whether (rows, factor) points are WorkerSpec::row_factors' kind:
// kRowFactorsRule below.
bool RowFactorsValidFor(const std::vector<std::pair<double, double>>& points);
// Such points' factor at `decode_rows` (policy::Interpolated); 1 where they
// are empty or there are no rows.
inline double RowFactorAt(const std::vector<std::pair<double, double>>& points,
                          int64_t decode_rows) {
  return points.empty() || decode_rows < 1 ? 1 : policy::Interpolated(points, double(decode_rows));
}

struct WorkerSpec {
  // `pass`: the worker's model; it computes prompts and decode rows in one
  // forward pass. Unless `fused`, prompts run on a second model of another
  // precision (a monolithic W8A8 prefill beside W4A16 decode), timed by
  // `prompt_pass`, before the decode rows' pass.
  PassTime pass, prompt_pass;
  bool fused = true;
  policy::BatchOptions batch;
  int64_t kv_blocks = 1 << 20;  // the KV cache, in blocks of batch.block_tokens
  int64_t max_context = 8192;
  // Relative spread of step times around the model (log-normal sigma), so
  // that queueing sees the machine's jitter; 0: exact.
  double noise = 0;
  // The worker times policy::CalibrationPasses before serving (its
  // --tpot-target-ms bounds steps): its cost models start from them.
  bool calibrate = false;
  // The stepping loop's time outside the forward passes in a step with
  // decode rows (taking requests, sampling, sending tokens): step_overhead
  // + step_overhead_per_row x its rows: the per-row part after the pass,
  // each row's token leaving at its place among the rows.
  double step_overhead = 0, step_overhead_per_row = 0;
  // The loop's time ending a stream after its last token left (summary,
  // log line, the call's end, caching its KV): it adds to the step, and
  // the rows after it leave that much later, so clients whose streams ended
  // early in a step may send their next request before the loop takes
  // new ones (bench/RESULTS.md, "Monolithic TTFT").
  double stream_finish_seconds = 0;
  // A decode step's pass (decode rows, no prompt tokens in the step)
  // against `pass`'s time, by its decode rows: (rows, factor) points, rows
  // ascending, interpolated between them and held beyond the ends
  // (policy::Interpolated); empty: 1. From the profile's served probe
  // (PassProfile::served_row_factors).
  std::vector<std::pair<double, double>> row_factors;
  static constexpr const char* kRowFactorsRule =
      "row_factors' rows must be >= 1 and ascending, their factors finite and > 0";
  bool RowFactorsValid() const { return RowFactorsValidFor(row_factors); }
  // A co-located worker's steps (Workers::co_located) while the worker it
  // shares a machine with runs none (or where it shares none): these in
  // place of pass, step_overhead, step_overhead_per_row and row_factors
  // (`pdq sim --co-located`: the decode worker's one-worker served probe's,
  // where the fields above are the split probe's, measured with both
  // workers busy). Unset: the fields above always.
  struct Steps {
    PassTime pass;
    double step_overhead = 0, step_overhead_per_row = 0;
    std::vector<std::pair<double, double>> row_factors;
  };
  std::optional<Steps> neighbour_idle;
};

// A link between two workers' hosts: each worker sends or receives one KV
// at a time over its own link.
struct LinkSpec {
  double bytes_per_second = 1.25e9;  // 10 Gb/s
  double latency_seconds = 50e-6;
};

// Workers by role, and the spec of each role's workers.
struct Workers {
  int monolithic = 0, prefill = 0, decode = 0;
  WorkerSpec monolithic_worker, prefill_worker, decode_worker;
  // Prefill worker k and decode worker k share a machine, pinned to cores
  // apart (k below both counts; workers an HPA adds share none): a step
  // that starts while the other runs none and starts none at that instant,
  // or on a worker sharing no machine, takes its spec's neighbour_idle,
  // where it has one.
  bool co_located = false;
  // "1P+1D", "2M": for tables.
  std::string Name() const;
};

// One arm of an A/B rollout (pdq-router --split): a pool of workers and
// its weight (any scale; the weights are normalized).
struct Arm : Workers {
  std::string pool;
  double weight = 1;
};

// The deployment's workers are its own counts, or, for an A/B rollout, its
// arms': the router draws each request's arm by weight as it draws a pool
// (policy::TrafficSplit), or, with split_sticky and clients that send ids
// (Workload::client_ids), takes the arm the client's id hashes to, and only
// that arm's workers serve it. With arms the deployment's own counts are
// 0; the link, the router and the heartbeat below are shared.
struct Deployment : Workers {
  std::vector<Arm> arms;
  bool split_sticky = false;  // pdq-router --split-sticky
  LinkSpec link;
  int64_t kv_bytes_per_token = 0;  // all layers, K and V
  int num_layers = 1;
  double router_seconds = 0;  // the router's time per request (parse, pick, relay)
  // Each request's router time drawn from an exponential distribution of
  // mean router_seconds (the profile measures only the mean), not the mean
  // itself. Requests sent at once (a closed loop's start, or the next
  // requests of streams that ended in the same step) race to a worker a
  // fraction of a millisecond apart, and which of them share its next step
  // goes one way or another from run to run of the real system; with one
  // fixed time the simulator decides every such race alike in every seed,
  // drawn the seeds' mean spans both ways (bench/RESULTS.md, "Monolithic
  // TTFT: prompts served, and requests sent at once").
  bool random_router_time = true;
  double load_tokens = 512;   // policy::BestCandidate's weight of a request of load
  // How often each worker reports its load to the router (pdq-router
  // --heartbeat-ms): the router picks workers by their queued prompt
  // tokens, decoding streams and free KV as of their last heartbeat (its
  // own count of requests in flight is current). 0: read exactly.
  double heartbeat_seconds = 0.5;
  // The router's --max-streams-per-worker batch (the default): a worker
  // that decodes gets no stream past its max_decode_batch requests in
  // flight; a request no such worker has a place for is refused. false:
  // --max-streams-per-worker off (streams past the batch take turns).
  bool bound_streams = true;
  // Kubernetes HPAs on the pools; a pool without one keeps its count (the
  // counts above are then the starting replicas). A pod an HPA adds
  // serves `pod_start_seconds` later (scheduling, image, model load and
  // quantization, the start-up prompt probe, registration) and reports
  // no metric until then; one it removes takes no new request and leaves
  // once its streams end (the drain of a SIGTERM; a decode worker's live
  // migration of its streams to others is not modelled).
  std::optional<HpaSpec> prefill_hpa, decode_hpa, monolithic_hpa;
  std::optional<HpaSpec>& hpa(Role r) {
    return r == Role::kPrefill ? prefill_hpa : r == Role::kDecode ? decode_hpa : monolithic_hpa;
  }
  const std::optional<HpaSpec>& hpa(Role r) const { return const_cast<Deployment*>(this)->hpa(r); }
  double pod_start_seconds = 10;
  // "1P+1D", "2M"; an A/B rollout "fp16=50:1M,w8a8-w4a16=50:1M".
  std::string Name() const;
  // Its pools, by arm: this deployment's own workers alone, or its arms
  // (pointers into it).
  std::vector<const Workers*> Pools() const;
};

// The workers of an HPA's pool.
inline Role PoolRole(PoolHpa::Pool p) {
  return p == PoolHpa::Pool::kPrefill  ? Role::kPrefill
         : p == PoolHpa::Pool::kDecode ? Role::kDecode
                                       : Role::kBoth;
}

struct Workload {
  enum class Arrivals { kPoisson, kGamma, kClosedLoop };
  Arrivals arrivals = Arrivals::kPoisson;
  double rate = 1;        // requests a second (open loop)
  double burstiness = 1;  // kGamma: the coefficient of variation of the gaps (1: Poisson)
  int concurrency = 1;    // kClosedLoop: clients, each sending when its last ended
  // kClosedLoop: client c sends BenchClientId(c) with its requests (pdq
  // bench --client-ids), which a sticky split (Deployment::split_sticky)
  // routes by. (The router's tie-break between equal workers by client id,
  // policy::Affinity, is not modelled: the simulated workers have no ids.)
  bool client_ids = false;
  int requests = 200;     // measured
  int warmup = 20;        // not measured: the first to end, as pdq bench counts
  // false: the first sent instead (what a run that means to drop its ramp,
  // the requests that found idle workers, leaves out: RunSteady in plan.h).
  bool warmup_first_to_end = true;
  int64_t prompt_tokens = 512, output_tokens = 64;
  double length_spread = 0;  // each length uniform in (1 +- spread) x its mean
  // Open-loop arrivals without phases are those `pdq bench --rate R
  // --arrival-seed <seed>` sends: the first at 0, then the gaps of
  // mt19937_64(seed), so a run and a simulation can take the same arrivals.
  uint64_t seed = 1;
  // Open loop: when given, the arrival rate follows these phases in turn,
  // over and over (a trace for the autoscalers: a quiet phase, a busy one),
  // instead of `rate`; a phase may be idle (rate 0).
  struct Phase {
    double seconds = 60, rate = 1;
  };
  std::vector<Phase> phases;
};

// True when each closed-loop client's requests all go to the A/B pool its
// id hashes to (a sticky split, clients that send ids): nothing is drawn.
inline bool StickyClients(const Deployment& d, const Workload& w) {
  return !d.arms.empty() && d.split_sticky && w.client_ids &&
         w.arrivals == Workload::Arrivals::kClosedLoop;
}

// Why the router refused a request, as its refusal trailer
// (server::kRefusalTrailer) names it: no worker of the role it needed
// had room for its KV ("kv_full"), or every decode worker's batch was full
// under the stream bound ("batch_full"), or none was serving
// ("no_worker": every pod of the pool still starting).
enum class Refusal { kNone, kKvFull, kBatchFull, kNoWorker };

struct RequestRecord {
  int64_t id = 0;
  int arm = 0;      // the A/B arm it was drawn for (Deployment::arms; 0 without)
  int client = -1;  // kClosedLoop: the client that sent it (from 0)
  bool measured = false;             // not one of the Workload::warmup left out
  Refusal refusal = Refusal::kNone;  // why it was refused, if it was
  bool refused() const { return refusal != Refusal::kNone; }
  int64_t prompt_tokens = 0, output_tokens = 0;
  double arrival = 0, first_token = 0, finish = 0;
  int prefill_worker = -1, decode_worker = -1;  // indices into the run's workers
  double ttft() const { return first_token - arrival; }
  // Mean time between later tokens (0 for one token).
  double tpot() const {
    return output_tokens > 1 ? (finish - first_token) / double(output_tokens - 1) : 0;
  }
};

// One step of one worker, as the parity test and `pdq sim --trace` see it.
struct StepRecord {
  int worker = 0;
  double start = 0, seconds = 0;
  std::vector<int64_t> rows;                        // request ids
  std::vector<std::pair<int64_t, int64_t>> chunks;  // (request id, tokens)
};

struct WorkerRecord {
  Role role = Role::kBoth;
  int arm = 0;  // its A/B arm (Deployment::arms; 0 without)
  // When the pod was created, served from, and was gone (the run's end if
  // it never left; a pod removed while starting never served: ready < 0).
  double created = 0, ready = 0, gone = -1;
  double busy_seconds = 0;       // stepping
  double link_busy_seconds = 0;  // KV bytes on its link (sent or received) over the bandwidth
  int64_t steps = 0;
};

// An HPA changed a pool's replicas (the Deployment's count: starting and
// serving pods) at `time`.
struct ScaleRecord {
  double time = 0;
  Role role = Role::kBoth;
  int from = 0, to = 0;
};

struct RunResult {
  std::vector<RequestRecord> requests;
  std::vector<ScaleRecord> scaling;
  std::vector<WorkerRecord> workers;
  std::vector<StepRecord> steps;  // when RunOptions::trace_steps
  double end_time = 0;
};

struct RunOptions {
  bool trace_steps = false;
};

// "90:10,400:0.2": SECONDS:RATE phases (Workload::phases).
absl::StatusOr<std::vector<Workload::Phase>> ParsePhases(const std::string& text);

// Checks the deployment and workload (a clear error naming the field).
absl::Status Validate(const Deployment& d, const Workload& w);
absl::StatusOr<RunResult> Simulate(const Deployment& d, const Workload& w,
                                   const RunOptions& o = {});

// Service-level targets: a request counts toward goodput when it meets both.
struct Targets {
  double ttft_seconds = 2;
  double tpot_seconds = 0.1;
};

// How busy each pool was over a run: the share of its capacity (workers
// times the run's length) spent stepping, or for the links carrying KV;
// negative where the deployment has no such pool.
struct PoolBusy {
  double prefill = -1, decode = -1, monolithic = -1, link = -1;
};
// Refused requests by reason (Refusal).
struct RefusalCounts {
  int64_t kv_full = 0, batch_full = 0, no_worker = 0;
  int64_t total() const { return kv_full + batch_full + no_worker; }
  void Add(Refusal r);
  void Add(const RefusalCounts& o);
};

struct RunSummary {
  int64_t measured = 0;
  RefusalCounts refusals;  // the refused ones, by reason
  double ttft_p50 = 0, ttft_p90 = 0, ttft_p99 = 0;
  double tpot_p50 = 0, tpot_p90 = 0, tpot_p99 = 0;
  double output_tokens_per_second = 0;  // over the measured requests' span
  double requests_per_second = 0;
  double goodput = 0;  // requests a second meeting both targets
  double met_fraction = 0;
  // Goodput with every request's TTFT and TPOT kGoodputMargin longer, and
  // shorter, over the same span: only which requests meet the targets
  // moves (in a closed loop longer latencies would also stretch the run,
  // up to a further kGoodputMargin less). Near a target goodput is a step
  // function of the latency (a batch of prompts just under it counts
  // whole, just over it not at all); a wide range says the prediction sits
  // on that edge.
  double goodput_if_slower = 0, goodput_if_faster = 0;
  PoolBusy busy;
  // Workers over the run (pods alive, starting and draining included: what
  // they cost): the time-weighted mean and the most at once.
  double mean_workers = 0;
  int peak_workers = 0;
};
// The latency error RunSummary's goodput range allows: the 10% floor of
// the validation's bound on TTFT and TPOT p50/p90 (issue 24; the bound is
// the larger of it and twice the runs' spread, p99's 20%).
constexpr double kGoodputMargin = 0.10;
// `arm` >= 0: that A/B arm's requests and workers only.
RunSummary Summarize(const RunResult& r, const Targets& t, int arm = -1);
PoolBusy Busy(const RunResult& r, int arm = -1);
// What bounds the deployment, in words: the busiest pool when it is at
// least kSaturatedBusy busy ("the decode workers, 97% busy"), else that no
// pool is saturated and the arrivals set the pace; refusals (no place in a
// decode batch, no room for the KV, no worker serving) come first. The
// evaluation report names a measured bound by its busiest worker too.
constexpr double kSaturatedBusy = 0.85;
std::string NameBottleneck(const PoolBusy& b, const RefusalCounts& refused);

// A figure over several seeds: the mean and the half-width of its 95%
// confidence interval (Student's t).
struct Estimate {
  double mean = 0, half_width = 0;
};
struct SeedFigures {
  Estimate ttft_p50, ttft_p90, ttft_p99, tpot_p50, tpot_p90, tpot_p99;
  Estimate output_tokens_per_second, goodput, met_fraction;
  Estimate goodput_if_slower, goodput_if_faster;  // RunSummary's
  Estimate measured;       // requests measured and not refused
  RefusalCounts refusals;  // refused requests by reason, over all seeds
  PoolBusy busy;           // the mean over the seeds
};
struct SeedSummary : SeedFigures {
  int seeds = 0;
  // An A/B rollout's arms, each alone (in Deployment::arms' order): its
  // requests measured and refused over every seed, its other figures over
  // the `seeds` that drew it a measured request (none: all 0).
  struct ArmFigures : SeedFigures {
    std::string pool;
    int seeds = 0;
  };
  std::vector<ArmFigures> arms;
  Estimate mean_workers;
  int peak_workers = 0;      // the most over the seeds
  int64_t scale_events = 0;  // HPA changes over all seeds
  std::vector<ScaleRecord> first_seed_scaling;  // the first seed's HPA changes, in order
};
// Runs seeds w.seed .. w.seed + seeds - 1.
absl::StatusOr<SeedSummary> RunSeeds(const Deployment& d, const Workload& w, const Targets& t,
                                     int seeds);

}  // namespace pdq::sim
