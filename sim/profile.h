// The measured profile that `pdq sim` and `pdq plan --sim` run on: a
// versioned JSON bundle written by `pdq profile` on the machine it
// describes. Each pass model is a linear fit of measured forward passes
// (sim::PassTime) with its error on points held out of the fit, so a
// simulated figure can say how far its inputs are from measurement.
//
//   {"pdq_profile": 1,
//    "machine": {"cpu": "...", "isa": "avx2", "cores": 2, "hostname": "..."},
//    "model": {"path": "...", "num_layers": 30, "kv_bytes_per_token": 92160,
//              "block_tokens": 16, "max_context": 8192, "kv_dtype": "fp16"},
//    "passes": [{"precision": "fp16", "threads": 2, "fixed": 0.004, "per_row": ...,
//                "per_token": ..., "per_pair": ..., "per_decode_pair": ...,
//                "points": 24, "held_out": 8,
//                "held_out_median_error": 0.03, "held_out_max_error": 0.08,
//                "served_factor": 1.12, "served": [{"clients": 4, ...}, ...]}, ...],
//    "links": [{"transport": "tcp", "bytes_per_second": 2.1e9, "latency_seconds": 8e-5}],
//    "router_seconds": 0.0004}
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "sim/sim.h"

namespace pdq::sim {

inline constexpr int kProfileVersion = 1;

// One measured forward pass.
struct PassSample {
  int64_t rows = 0, tokens = 0;
  double pairs = 0;          // attention pairs: policy::StepWork::attention + decode_attention
  double decode_pairs = -1;  // of them, the decode rows' (-1: not recorded, before 2026-12)
  double seconds = 0;
  bool held_out = false;  // not used by the fit
};

// A level of the served probe (`pdq profile --served-clients`): one
// worker of the pass's precision and thread count behind the router, with
// closed-loop clients on the same machine, read from its own /metrics.
struct ServedLevel {
  int clients = 0;
  int64_t prompt_tokens = 0, output_tokens = 0;  // each request's (0: not recorded)
  int64_t steps = 0;                  // decode steps in the level
  double rows_per_step = 0;           // their mean decode rows
  double prompt_tokens_per_step = 0;  // prompt tokens computed within them
  double step_seconds = 0;            // their mean time, served
  double model_seconds = 0;           // the pass model's time for the same mean work
  double model_pair_seconds = 0;      // of it, the attention's (the pair prices') part
  // The stepping loop's mean time outside the passes in those steps'
  // iterations (-1: not measured).
  double overhead_seconds = -1;
  // Streams that ended with their last token in the level, and the loop's
  // mean time ending one after it (-1: not measured).
  int64_t streams_finished = 0;
  double finish_seconds = -1;
};

// Prompt passes served: a level of the split probe (`pdq profile
// --split-pairs`: the prefill worker's prompt passes beside a busy decode
// worker), or of the served probe at one client (a monolithic worker's
// prompt passes, nothing decoding beside them).
struct PromptLevel {
  int clients = 0;
  int64_t prompt_tokens = 0;   // each request's
  int64_t passes = 0;          // forward passes that computed prompt tokens
  double tokens_per_pass = 0;  // their mean prompt tokens
  double pass_seconds = 0;     // their mean time, served
  double model_seconds = 0;    // the pass model's time for the same mean work
};

struct PassProfile {
  std::string precision;
  int threads = 0;
  PassTime time;
  // `time` is fitted to all `points`; the errors are those of a fit made
  // without `held_out` of them, on those (relative).
  int points = 0, held_out = 0;
  double held_out_median_error = 0, held_out_max_error = 0;
  // Loading the model at this precision and thread count (reading the GGUF,
  // quantizing, calibrating): what a new worker spends before it serves.
  // 0: not measured (a profile from before it was).
  double load_seconds = 0;
  std::vector<PassSample> samples;  // what was fitted and held out (optional in files)
  // How much longer this pass takes served than alone: the served levels'
  // step time fitted as served_factor x the pass model's time without
  // attention + served_pair_factor x its attention's (served KV lies in
  // blocks scattered over the pool, the profile's passes in fresh ones; and
  // the router, the gRPC threads and the clients share the cores). 0: not
  // measured; `pdq sim` then runs the passes as timed alone. A profile with
  // no served_pair_factor takes served_factor for both.
  double served_factor = 0, served_pair_factor = 0;
  // The one-client levels' steps against those factors' fit, as
  // WorkerSpec::row_factors: [[1, their served steps (or their passes'
  // model, where that is more: serving never speeds a pass) over the fit,
  // weighted by steps], [the next client count's mean rows, 1]]. Empty: not
  // measured (profiles before it, a probe without a one-client level and
  // another), or no served_factor; 1 at every row count.
  std::vector<std::pair<double, double>> served_row_factors;
  // The served levels' loop time outside the passes a step, fitted as
  // step_overhead + step_overhead_per_row x its decode rows (sampling and
  // sending are per row); WorkerSpec::step_overhead. 0: not measured.
  double step_overhead = 0, step_overhead_per_row = 0;
  // The served levels' mean time the loop spends ending a stream that sent
  // its last token, before it takes new requests: a step whose streams end
  // holds the next requests' clients that long longer (WorkerSpec::
  // stream_finish_seconds). 0: not measured.
  double stream_finish_seconds = 0;
  std::vector<ServedLevel> served;
  // The served probe's prompt passes at one client (whole prompts, nothing
  // decoding beside them) over the pass model's time for the same work,
  // least squares on relative error: what `pdq sim` scales a pass's prompt
  // tokens and their attention by, in place of served_factor (fitted on
  // decode steps, where the router and the clients work between the
  // passes; a prompt pass has no tokens to send while it runs). Not held at
  // 1 or more: on the Emerald Rapids guest a monolithic worker's served W4A16
  // prompts ran at 0.76-1.05 of the profile's model (bench/RESULTS.md). 0:
  // not measured (profiles before it): served_factor scales them as before.
  double served_prompt_factor = 0;
  std::vector<PromptLevel> served_prompts;
};

// A prefill worker and a decode worker of `threads` each on one machine,
// pinned to cores apart, behind the router (the 1P+1D deployment on one
// 2-core box), served to closed-loop clients: each worker's passes against
// its pass model. On a 2-core Zen 4 guest a prompt here took x1.01 its pass
// alone one hour and x1.30 the next, which the one-worker served probe does
// not see (bench/RESULTS.md, "The next hour"). `pdq sim
// --co-located` runs a pair's workers on these factors instead of the
// passes' served ones.
struct SplitProfile {
  std::string prefill_precision, decode_precision;
  int threads = 0;
  // The prefill worker's passes: served / model, least squares on relative
  // error over its levels, at least 1 (as served_factor).
  double prefill_factor = 0;
  std::vector<PromptLevel> prefill_levels;
  // The decode worker's steps, fitted as PassProfile's served factors and
  // step overhead are.
  double decode_factor = 0, decode_pair_factor = 0;
  double decode_step_overhead = 0, decode_step_overhead_per_row = 0;
  std::vector<ServedLevel> decode_levels;
};

struct LinkProfile {
  std::string transport;
  LinkSpec link;
};

struct Profile {
  int version = kProfileVersion;
  std::string cpu, isa, hostname;
  int cores = 0;
  std::string model_path;
  int num_layers = 0;
  int64_t kv_bytes_per_token = 0, block_tokens = 16, max_context = 0;
  // The KV cache's element type the passes ran on (`pdq profile --kv-dtype`):
  // decode attention reads it, so a bf16 deployment wants a bf16 profile.
  // Profiles written before it was recorded read as fp16 (all they could run).
  std::string kv_dtype = "fp16";
  std::vector<PassProfile> passes;
  std::vector<LinkProfile> links;
  // From a request's arrival at the router to its first token, less the
  // worker's compute of its prompt (the served probe at one client: parse,
  // tokenize, pick, gRPC both ways); 0: not measured.
  double router_seconds = 0;
  std::vector<SplitProfile> splits;  // the split probe's pairs (none: not run)

  // The pass of `precision` at `threads` (0: the most threads measured).
  absl::StatusOr<PassProfile> Pass(const std::string& precision, int threads = 0) const;
  absl::StatusOr<LinkProfile> Link(const std::string& transport) const;
  // The split probe of that pair at `threads` a worker (0: the most
  // measured); NotFound says how to measure it.
  absl::StatusOr<SplitProfile> Split(const std::string& prefill_precision,
                                     const std::string& decode_precision, int threads = 0) const;
};

// How the simulated workers run, beside what the profile measured (the
// workers' own flags).
struct WorkerOptions {
  int threads = 0;  // the profile's passes at this many threads (0: the most measured)
  std::string transport = "tcp";
  int max_decode_batch = 64;
  int64_t token_budget = 2048;     // --prefill-budget
  double step_target_seconds = 0;  // --tpot-target-ms
  double prompt_share = 0;         // --tpot-target-ms auto --prompt-share (0: off)
  int64_t kv_blocks = 1 << 20;     // per decode or monolithic worker
  double noise = 0;                // WorkerSpec::noise
  // The passes as timed alone, without the profile's served_factor and
  // step overhead (the emulation tier times its passes so).
  bool idle_passes = false;
  // Each prefill worker shares a machine with a decode worker, pinned to
  // cores apart (1P+1D on one box): both take the profile's split probe
  // (Profile::splits) instead of their passes' served factors, the decode
  // worker only for steps that start while the prefill worker runs or
  // starts one.
  bool co_located = false;
};

// The precision of each kind of worker. A monolithic worker computes
// prompts at `monolithic_prompt` on a second model when it differs from
// `monolithic` (empty: the same model).
struct Precisions {
  std::string prefill = "w8a8", decode = "w4a16", monolithic = "fp16", monolithic_prompt;
};

// Worker counts by role from "2P+6D", "3M", "1P+2D+1M".
absl::Status ParseDeployment(const std::string& text, Deployment* d);
// Fills the specs of the kinds of worker `d` has, its link and the model's
// KV facts from the profile; NotFound names a precision or transport the
// profile lacks.
absl::Status SpecsFromProfile(const Profile& p, const Precisions& precisions,
                              const WorkerOptions& o, Deployment* d);

// An A/B rollout's arms (Deployment::arms) from pdq-router's --split spec
// ("fp16=50,w8a8-w4a16=50") and each pool's workers and precision pair
// (`arms`: "fp16=1M:fp16,w8a8-w4a16=1M:w8a8/w4a16", POOL=DEPLOYMENT:
// PREFILL/DECODE, one precision for both): a pool's prefill workers run
// PREFILL, its decode workers DECODE, and its monolithic workers DECODE,
// computing prompts at PREFILL on a second model where the two differ (a
// pdq worker's --prefill-precision). Fills the specs, the link and the
// model's KV facts as SpecsFromProfile does, and sets d's own counts to 0.
// Returns each arm's precisions, in the split's order.
absl::StatusOr<std::vector<Precisions>> ArmsFromProfile(const Profile& p, const std::string& split,
                                                        const std::string& arms,
                                                        const WorkerOptions& o, Deployment* d);

// The split probe a co-located pair of `precisions` runs on (options.co_located):
// the pair's at the thread count of the prefill pass the options pick.
// NotFound names the pass or the probe the profile lacks.
absl::StatusOr<SplitProfile> CoLocatedSplit(const Profile& p, const Precisions& precisions,
                                            const WorkerOptions& o);

// How long a new worker of `d`'s pools takes from start to serving, by the
// profile: the slowest pool's model loads (both models of a monolithic
// worker with two) and its start-up prompt probe (a 16-token warm pass and
// a 128-token prompt, for a worker that prefills). Scheduling the pod and
// pulling its image are not in it. NotFound where the profile has no load
// times.
absl::StatusOr<double> PodStartSeconds(const Profile& p, const Precisions& precisions,
                                       const WorkerOptions& o, const Deployment& d);

std::string ProfileToJson(const Profile& p);
// Errors name the field; a newer version is refused.
absl::StatusOr<Profile> ProfileFromJson(const std::string& text);
absl::StatusOr<Profile> ReadProfile(const std::string& path);

}  // namespace pdq::sim
