// The bench result's JSON form (harness/bench_result.h).
#include "harness/bench_result.h"

#include <algorithm>
#include <fstream>
#include <stdexcept>

#include "absl/strings/str_cat.h"

namespace pdq {

using json = nlohmann::json;

namespace {

// Reads `key` into `out` where present and not null; a value of the wrong
// type throws (ReadBenchResult names it).
// A field of the wrong type, by name (innermost first).
struct FieldError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <typename T>
void Get(const json& j, const char* key, T& out) {
  if (!j.is_object()) return;
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return;
  try {
    it->get_to(out);
  } catch (const FieldError& e) {
    throw FieldError(absl::StrCat(key, ".", e.what()));
  } catch (const json::exception& e) {
    throw FieldError(absl::StrCat(key, ": ", e.what()));
  }
}

// Writes `v` where it is finite (a figure the run did not produce is left
// out rather than written as null).
void PutFinite(json& j, const char* key, double v) {
  if (std::isfinite(v)) j[key] = v;
}

double Percentile(const std::vector<double>& sorted, double p) {
  const double rank = p / 100.0 * (sorted.size() - 1);
  const size_t lo = (size_t)rank;
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - lo);
}

}  // namespace

Distribution DistributionOf(std::vector<double> values) {
  if (values.empty()) return {0, 0, 0, 0};
  std::sort(values.begin(), values.end());
  double sum = 0;
  for (double x : values) sum += x;
  return {Percentile(values, 50), Percentile(values, 90), Percentile(values, 99),
          sum / values.size()};
}

const LevelResult* BestLevel(const BenchResult& bench) {
  const LevelResult* best = nullptr;
  for (const LevelResult& l : bench.levels) {
    if (best == nullptr || l.goodput_requests_per_s > best->goodput_requests_per_s) best = &l;
  }
  return best;
}

const LevelResult* TopLevel(const BenchResult& bench) {
  return bench.levels.empty() ? nullptr : &bench.levels.back();
}

const LevelResult* LevelAt(const BenchResult& bench, int concurrency) {
  for (const LevelResult& l : bench.levels) {
    if (l.concurrency == concurrency) return &l;
  }
  return nullptr;
}

void to_json(json& j, const Distribution& v) {
  j = {{"p50", v.p50}, {"p90", v.p90}, {"p99", v.p99}, {"mean", v.mean}};
}
void from_json(const json& j, Distribution& v) {
  Get(j, "p50", v.p50);
  Get(j, "p90", v.p90);
  Get(j, "p99", v.p99);
  Get(j, "mean", v.mean);
}

void to_json(json& j, const WorkerUsage& v) {
  j = {{"worker_id", v.worker_id},
       {"role", v.role},
       {"precision", v.precision},
       {"wall_seconds", v.wall_seconds},
       {"prefill_tokens", v.prefill_tokens},
       {"prefill_busy_seconds", v.prefill_busy_seconds},
       {"generated_tokens", v.generated_tokens},
       {"decode_step_seconds", v.decode_step_seconds},
       {"kv_blocks_total", v.kv_blocks_total},
       {"peak_resident_bytes", v.peak_resident_bytes},
       {"cpu_cores_busy", v.cpu_cores_busy}};
  PutFinite(j, "prefill_compute_utilization", v.prefill_compute_utilization);
  PutFinite(j, "decode_bandwidth_utilization", v.decode_bandwidth_utilization);
}
void from_json(const json& j, WorkerUsage& v) {
  Get(j, "worker_id", v.worker_id);
  Get(j, "role", v.role);
  Get(j, "precision", v.precision);
  Get(j, "wall_seconds", v.wall_seconds);
  Get(j, "prefill_tokens", v.prefill_tokens);
  Get(j, "prefill_busy_seconds", v.prefill_busy_seconds);
  Get(j, "generated_tokens", v.generated_tokens);
  Get(j, "decode_step_seconds", v.decode_step_seconds);
  Get(j, "kv_blocks_total", v.kv_blocks_total);
  Get(j, "peak_resident_bytes", v.peak_resident_bytes);
  Get(j, "cpu_cores_busy", v.cpu_cores_busy);
  Get(j, "prefill_compute_utilization", v.prefill_compute_utilization);
  Get(j, "decode_bandwidth_utilization", v.decode_bandwidth_utilization);
}

void to_json(json& j, const LevelFigures& v) {
  j = {{"requests_ok", v.requests_ok},
       {"requests_failed", v.requests_failed},
       {"requests_refused", v.requests_refused},
       {"refusal_s", v.refusal_s},
       {"seconds", v.seconds},
       {"ttft_s", v.ttft_s},
       {"tpot_s", v.tpot_s},
       {"itl_s", v.itl_s},
       {"e2e_s", v.e2e_s},
       {"requests_per_s", v.requests_per_s},
       {"output_tokens_per_s", v.output_tokens_per_s},
       {"total_tokens_per_s", v.total_tokens_per_s},
       {"goodput_requests_per_s", v.goodput_requests_per_s}};
}
void from_json(const json& j, LevelFigures& v) {
  Get(j, "requests_ok", v.requests_ok);
  Get(j, "requests_failed", v.requests_failed);
  Get(j, "requests_refused", v.requests_refused);
  Get(j, "refusal_s", v.refusal_s);
  Get(j, "seconds", v.seconds);
  Get(j, "ttft_s", v.ttft_s);
  Get(j, "tpot_s", v.tpot_s);
  Get(j, "itl_s", v.itl_s);
  Get(j, "e2e_s", v.e2e_s);
  Get(j, "requests_per_s", v.requests_per_s);
  Get(j, "output_tokens_per_s", v.output_tokens_per_s);
  Get(j, "total_tokens_per_s", v.total_tokens_per_s);
  Get(j, "goodput_requests_per_s", v.goodput_requests_per_s);
}

void to_json(json& j, const LevelResult& v) {
  to_json(j, static_cast<const LevelFigures&>(v));
  j["concurrency"] = v.concurrency;
  if (v.rate > 0) j["rate"] = v.rate;
  if (v.cycle > 0) j["cycle"] = v.cycle;
  j["workers"] = v.workers;
  if (!v.pools.empty()) j["pools"] = v.pools;
}
void from_json(const json& j, LevelResult& v) {
  from_json(j, static_cast<LevelFigures&>(v));
  Get(j, "concurrency", v.concurrency);
  Get(j, "rate", v.rate);
  Get(j, "cycle", v.cycle);
  Get(j, "workers", v.workers);
  Get(j, "pools", v.pools);
}

void to_json(json& j, const RequestResult& v) {
  j = {{"ok", v.ok},
       {"error", v.error},
       {"start_s", v.start_s},
       {"prompt_tokens", v.prompt_tokens},
       {"output_tokens", v.output_tokens},
       {"ttft_s", v.ttft_s},
       {"tpot_s", v.tpot_s},
       {"e2e_s", v.e2e_s},
       {"gaps_s", v.gaps_s},
       {"pool", v.pool}};
  if (v.turn > 0) {  // the conversation workload's record
    j["session"] = v.session;
    j["turn"] = v.turn;
    j["cached_tokens"] = v.cached_tokens;
    j["output_text"] = v.output_text;
  } else {
    j["concurrency"] = v.concurrency;
    j["refused"] = v.refused;
  }
}
void from_json(const json& j, RequestResult& v) {
  Get(j, "concurrency", v.concurrency);
  Get(j, "session", v.session);
  Get(j, "turn", v.turn);
  Get(j, "ok", v.ok);
  Get(j, "refused", v.refused);
  Get(j, "error", v.error);
  Get(j, "start_s", v.start_s);
  Get(j, "prompt_tokens", v.prompt_tokens);
  Get(j, "cached_tokens", v.cached_tokens);
  Get(j, "output_tokens", v.output_tokens);
  Get(j, "ttft_s", v.ttft_s);
  Get(j, "tpot_s", v.tpot_s);
  Get(j, "e2e_s", v.e2e_s);
  Get(j, "gaps_s", v.gaps_s);
  Get(j, "pool", v.pool);
  Get(j, "output_text", v.output_text);
}

void to_json(json& j, const PatternResult& v) {
  j = {{"name", v.name}, {"pass", v.pass}, {"reason", v.reason}};
}
void from_json(const json& j, PatternResult& v) {
  Get(j, "name", v.name);
  Get(j, "pass", v.pass);
  Get(j, "reason", v.reason);
}

void to_json(json& j, const CycleState& v) {
  j = {{"cycle", v.cycle}, {"workers", json::array()}};
  for (const CycleWorker& w : v.workers) {
    j["workers"].push_back({{"worker_id", w.worker_id},
                            {"resident_bytes", w.resident_bytes},
                            {"kv_blocks_free", w.kv_blocks_free},
                            {"kv_blocks_total", w.kv_blocks_total}});
  }
}
void from_json(const json& j, CycleState& v) {
  Get(j, "cycle", v.cycle);
  for (const json& w : j.is_object() ? j.value("workers", json::array()) : json::array()) {
    CycleWorker c;
    Get(w, "worker_id", c.worker_id);
    Get(w, "resident_bytes", c.resident_bytes);
    Get(w, "kv_blocks_free", c.kv_blocks_free);
    Get(w, "kv_blocks_total", c.kv_blocks_total);
    v.workers.push_back(std::move(c));
  }
}

void to_json(json& j, const TurnResult& v) {
  j = {{"turn", v.turn},
       {"requests_ok", v.requests_ok},
       {"requests_failed", v.requests_failed},
       {"ttft_s", v.ttft_s},
       {"tpot_s", v.tpot_s},
       {"e2e_s", v.e2e_s},
       {"prompt_tokens_mean", v.prompt_tokens_mean},
       {"cached_tokens_mean", v.cached_tokens_mean},
       {"output_tokens_mean", v.output_tokens_mean}};
}
void from_json(const json& j, TurnResult& v) {
  Get(j, "turn", v.turn);
  Get(j, "requests_ok", v.requests_ok);
  Get(j, "requests_failed", v.requests_failed);
  Get(j, "ttft_s", v.ttft_s);
  Get(j, "tpot_s", v.tpot_s);
  Get(j, "e2e_s", v.e2e_s);
  Get(j, "prompt_tokens_mean", v.prompt_tokens_mean);
  Get(j, "cached_tokens_mean", v.cached_tokens_mean);
  Get(j, "output_tokens_mean", v.output_tokens_mean);
}

void to_json(json& j, const ConversationResult& v) {
  j = {{"sessions", v.sessions},
       {"turns", v.turns},
       {"conversations_ok", v.conversations_ok},
       {"requests_ok", v.requests_ok},
       {"requests_failed", v.requests_failed},
       {"seconds", v.seconds},
       {"conversations_per_s", v.conversations_per_s},
       {"output_tokens_per_s", v.output_tokens_per_s},
       {"ttft_later_turns_s", v.ttft_later_turns_s},
       {"per_turn", v.per_turn},
       {"workers", v.workers}};
}
void from_json(const json& j, ConversationResult& v) {
  Get(j, "sessions", v.sessions);
  Get(j, "turns", v.turns);
  Get(j, "conversations_ok", v.conversations_ok);
  Get(j, "requests_ok", v.requests_ok);
  Get(j, "requests_failed", v.requests_failed);
  Get(j, "seconds", v.seconds);
  Get(j, "conversations_per_s", v.conversations_per_s);
  Get(j, "output_tokens_per_s", v.output_tokens_per_s);
  Get(j, "ttft_later_turns_s", v.ttft_later_turns_s);
  Get(j, "per_turn", v.per_turn);
  Get(j, "workers", v.workers);
}

void to_json(json& j, const BenchResult& v) {
  j = {{"router", v.router},
       {"target", v.target},
       {"workload", v.workload},
       {"input_tokens", v.input_tokens},
       {"output_tokens", v.output_tokens},
       {"rate", v.rate},
       {"ttft_target_ms", v.ttft_target_ms},
       {"tpot_target_ms", v.tpot_target_ms},
       {"levels", v.levels},
       {"requests", v.requests}};
  if (v.workload == "conversation") {
    j["sessions"] = v.sessions;
    j["turns"] = v.turns;
    j["first_tokens"] = v.first_tokens;
    j["turn_tokens"] = v.turn_tokens;
  }
  if (v.pattern) j["pattern"] = *v.pattern;
  if (!v.cycles.empty()) j["cycles"] = v.cycles;
  if (v.conversation) j["conversation"] = *v.conversation;
  if (!v.router_pools.empty()) j["router_pools"] = v.router_pools;
}
void from_json(const json& j, BenchResult& v) {
  Get(j, "router", v.router);
  Get(j, "target", v.target);
  Get(j, "workload", v.workload);
  Get(j, "input_tokens", v.input_tokens);
  Get(j, "output_tokens", v.output_tokens);
  Get(j, "rate", v.rate);
  Get(j, "ttft_target_ms", v.ttft_target_ms);
  Get(j, "tpot_target_ms", v.tpot_target_ms);
  Get(j, "sessions", v.sessions);
  Get(j, "turns", v.turns);
  Get(j, "first_tokens", v.first_tokens);
  Get(j, "turn_tokens", v.turn_tokens);
  Get(j, "levels", v.levels);
  Get(j, "requests", v.requests);
  if (j.contains("pattern")) Get(j, "pattern", v.pattern.emplace());
  Get(j, "cycles", v.cycles);
  if (j.contains("conversation")) Get(j, "conversation", v.conversation.emplace());
  Get(j, "router_pools", v.router_pools);
}

absl::StatusOr<BenchResult> ReadBenchResult(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read bench result '", path, "'"));
  const json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat("'", path, "' is not a JSON object"));
  }
  // nlohmann's conversions report a wrong type by throwing; it ends here.
  try {
    return j.get<BenchResult>();
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", path, "' is not a pdq bench result: field ", e.what()));
  }
}

absl::Status WriteBenchResult(const std::string& path, const BenchResult& result) {
  std::ofstream f(path);
  // Answers cut at a token count may end inside a UTF-8 character.
  f << json(result).dump(1, ' ', false, json::error_handler_t::replace) << "\n";
  if (!f) return absl::UnavailableError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

}  // namespace pdq
