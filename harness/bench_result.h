// What `pdq bench --json` writes, as types: the one schema the load
// generator writes and the report (harness/report.h), `pdq plan` and
// `pdq eval` read. Field names are the JSON keys; durations are seconds.
//
// A figure that was not measured is NaN and left out of the JSON. Reading
// is lenient where data may predate a field: a missing (or null) number
// reads as NaN (counts as 0), a missing list as empty, so a report of an
// older run says "–" for what it lacks. A field of the wrong type is an
// error naming it (ReadBenchResult).
#pragma once

#include <cmath>
#include <concepts>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace pdq {

// Percentiles and mean of one quantity over a level's requests.
struct Distribution {
  double p50 = NAN, p90 = NAN, p99 = NAN, mean = NAN;
};
// p50, p90, p99 (linear interpolation between ranks) and mean; zeros for
// no values (what the bench has always written).
Distribution DistributionOf(std::vector<double> values);

// What one worker did during a level, from its /metrics before and after.
struct WorkerUsage {
  std::string worker_id, role, precision;
  double wall_seconds = NAN;
  double prefill_tokens = NAN, prefill_busy_seconds = NAN;
  // The forward passes that computed prompt tokens (NaN from workers or
  // files without them): prefill_busy_seconds / prefill_passes is the mean
  // prompt pass, prefill_tokens / prefill_passes its tokens.
  double prefill_passes = NAN;
  double generated_tokens = NAN, decode_step_seconds = NAN;
  // The decode steps' composition: steps, the rows they advanced, the prompt
  // tokens computed within them; and the prompts prefilled on their own
  // (pdq_prefill_seconds: count, summed seconds). NaN from workers (or
  // files) without them.
  double decode_steps = NAN, decode_rows = NAN, decode_step_prompt_tokens = NAN;
  // The stepping loop's time outside the forward passes in those steps'
  // iterations (taking requests, sampling, sending tokens), summed.
  double decode_step_overhead_seconds = NAN;
  // Streams that ended with their last token, and the loop's time ending
  // them after it (pdq_stream_finish_seconds_total), summed. NaN from
  // workers (or files) without them.
  double streams_finished = NAN, stream_finish_seconds = NAN;
  double prefills = NAN, prefill_seconds = NAN;
  double kv_blocks_total = NAN, peak_resident_bytes = NAN, cpu_cores_busy = NAN;
  // What the worker reports it holds (/metrics), at the level's end: its
  // weights, the most KV bytes that held data at once since start (blocks
  // in use or kept by the prefix cache: resident once touched), and its
  // activation workspaces. NaN from workers that do not report them.
  double weight_bytes = NAN, kv_used_peak_bytes = NAN, workspace_bytes = NAN;
  // While computing: prefill operations against the machine's peak for its
  // precision, decode bytes read against the read bandwidth (both measured
  // by the worker at start-up); NaN where the worker did none.
  double prefill_compute_utilization = NAN, decode_bandwidth_utilization = NAN;
};

// A level's figures over the requests it counted (warm-up excluded).
struct LevelFigures {
  int64_t requests_ok = 0, requests_failed = 0;
  int64_t requests_refused = 0;  // shed by admission control (also in requests_failed)
  Distribution refusal_s;        // how fast the refusals came back
  double seconds = NAN;
  Distribution ttft_s, tpot_s, itl_s, e2e_s;  // itl: gaps between consecutive tokens
  double requests_per_s = NAN, output_tokens_per_s = NAN, total_tokens_per_s = NAN;
  double goodput_requests_per_s = NAN;  // requests within both latency targets, per second
};

// One level of a sweep: a concurrency (closed loop) or an arrival rate.
struct LevelResult : LevelFigures {
  int concurrency = 0;
  double rate = 0;  // open-loop arrivals per second; 0: closed loop
  int cycle = 0;    // --pattern alternate: the cycle (from 1); 0 otherwise
  std::vector<WorkerUsage> workers;
  std::map<std::string, LevelFigures> pools;  // under an A/B split: each pool's share
};

// One request as the client saw it.
struct RequestResult {
  int concurrency = 0;
  int session = 0, turn = 0;  // --workload conversation (from 1 for turns); 0 otherwise
  bool ok = false, refused = false;
  std::string error;
  double start_s = NAN;  // since its level began
  int64_t prompt_tokens = 0, cached_tokens = 0, output_tokens = 0;
  double ttft_s = NAN, tpot_s = NAN, e2e_s = NAN;
  std::vector<double> gaps_s;
  std::string pool;         // the pool that answered (an A/B split)
  std::string client_id;    // the client id it went with (pdq bench --client-ids)
  std::string output_text;  // kept by the conversation workload only
};

// --pattern alternate: the verdict, and the workers' state after each cycle.
struct PatternResult {
  std::string name;
  bool pass = false;
  std::string reason;  // why it failed
};
struct CycleWorker {
  std::string worker_id;
  double resident_bytes = NAN, kv_blocks_free = NAN, kv_blocks_total = NAN;
};
struct CycleState {
  int cycle = 0;
  std::vector<CycleWorker> workers;
};

// --workload conversation.
struct TurnResult {
  int turn = 0;
  int64_t requests_ok = 0, requests_failed = 0;
  Distribution ttft_s, tpot_s, e2e_s;
  double prompt_tokens_mean = NAN, cached_tokens_mean = NAN, output_tokens_mean = NAN;
};
struct ConversationResult {
  int sessions = 0, turns = 0, conversations_ok = 0;
  int64_t requests_ok = 0, requests_failed = 0;
  double seconds = NAN, conversations_per_s = NAN, output_tokens_per_s = NAN;
  Distribution ttft_later_turns_s;  // turns 2 on: those that resend a conversation
  std::vector<TurnResult> per_turn;
  std::vector<WorkerUsage> workers;
};

// A router's counters by A/B pool: {pool: {series: value}}.
using PoolCounters = std::map<std::string, std::map<std::string, double>>;

struct BenchResult {
  std::string router, target, workload;  // target: "pdq" or "openai"
  int64_t input_tokens = 0, output_tokens = 0;
  int64_t shared_prefix_tokens = 0;  // of input_tokens, the same in every prompt
  int64_t prompt_seed = 0;           // where in the text the prompts start (pdq bench)
  double rate = 0, ttft_target_ms = 0, tpot_target_ms = 0;
  int64_t arrival_seed = 0;  // with a rate: the arrivals' seed (pdq bench --arrival-seed)
  bool client_ids = false;   // each closed-loop client sent its id (pdq bench --client-ids)
  double temperature = 0;  // the answers' sampling temperature (written when not 0: greedy)
  // pdq bench's wall clock, UTC (RFC 3339, to the second): when it began
  // (connected, before cutting the prompts and any warm-up) and when the
  // run ended. bench/sim_validation_summary.py compares the start with the
  // commit date of the predictions judged against the run. Empty: not
  // recorded.
  std::string started_at, finished_at;
  // --workload conversation's shape (written only for it).
  int sessions = 0, turns = 0;
  int64_t first_tokens = 0, turn_tokens = 0;
  std::vector<LevelResult> levels;
  std::vector<RequestResult> requests;
  std::optional<PatternResult> pattern;
  std::vector<CycleState> cycles;
  std::optional<ConversationResult> conversation;
  // `pdq eval`: the router's counters by A/B pool over the workload
  // (requests_ok, ttft_seconds_sum, ...).
  PoolCounters router_pools;
};

// The level with the highest goodput (ties: the lower concurrency); null
// without levels.
const LevelResult* BestLevel(const BenchResult& bench);
// The last level measured (the highest of a sweep); null without levels.
const LevelResult* TopLevel(const BenchResult& bench);
const LevelResult* LevelAt(const BenchResult& bench, int concurrency);

// Where a sweep's output tokens/s stops rising with concurrency: `at` is the
// lowest level within `within` (a fraction) of the `most` any level reached;
// past it clients only queue. `top` is the highest level and `below_top` the
// one under it. When `at` is `top` the sweep has not shown the point (still
// rising); a `top` below `within` of `most` is a fall. `refused` is the
// lowest level where admission control refused requests: the deployment's
// bound reached, whatever its output did (past it more clients are refused,
// not served). Nullopt with fewer than two levels or no output tokens.
struct Saturation {
  const LevelResult* at = nullptr;
  const LevelResult* top = nullptr;
  const LevelResult* below_top = nullptr;
  const LevelResult* refused = nullptr;
  double most = 0;  // output tokens/s
};
std::optional<Saturation> FindSaturation(const BenchResult& bench, double within = 0.95);
// The level of a bench's most goodput (requests/s meeting its targets), the
// lowest of equals; null when no level has any.
const LevelResult* MostGoodput(const BenchResult& bench);

// nlohmann's JSON conversions of these types (json(result), j.get<...>()).
template <typename T>
concept BenchResultPart = std::same_as<T, Distribution> || std::same_as<T, WorkerUsage> ||
    std::same_as<T, LevelFigures> || std::same_as<T, LevelResult> ||
    std::same_as<T, RequestResult> || std::same_as<T, PatternResult> ||
    std::same_as<T, CycleWorker> || std::same_as<T, CycleState> || std::same_as<T, TurnResult> ||
    std::same_as<T, ConversationResult> || std::same_as<T, BenchResult>;
template <BenchResultPart T>
void to_json(nlohmann::json& j, const T& v);
template <BenchResultPart T>
void from_json(const nlohmann::json& j, T& v);

// The file's result; NotFound when it does not exist, InvalidArgument naming
// the file and the field when it is not a bench result.
absl::StatusOr<BenchResult> ReadBenchResult(const std::string& path);
absl::Status WriteBenchResult(const std::string& path, const BenchResult& result);

}  // namespace pdq
