// The bench result's JSON form (harness/bench_result.h).
#include "harness/bench_result.h"

#include <algorithm>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "harness/json_fields.h"

namespace pdq {

using json = nlohmann::json;

namespace {

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

// ---- JSON: each type's fields, listed once (harness/json_fields.h). Static:
// found by argument-dependent lookup, private to this file.

static void Fields(auto& f, Distribution& v) {
  f("p50", v.p50);
  f("p90", v.p90);
  f("p99", v.p99);
  f("mean", v.mean);
}

static void Fields(auto& f, WorkerUsage& v) {
  f("worker_id", v.worker_id);
  f("role", v.role);
  f("precision", v.precision);
  f("wall_seconds", v.wall_seconds);
  f("prefill_tokens", v.prefill_tokens);
  f("prefill_busy_seconds", v.prefill_busy_seconds);
  f("generated_tokens", v.generated_tokens);
  f("decode_step_seconds", v.decode_step_seconds);
  f("kv_blocks_total", v.kv_blocks_total);
  f("peak_resident_bytes", v.peak_resident_bytes);
  f("cpu_cores_busy", v.cpu_cores_busy);
  f("prefill_compute_utilization", v.prefill_compute_utilization);
  f("decode_bandwidth_utilization", v.decode_bandwidth_utilization);
}

static void Fields(auto& f, LevelFigures& v) {
  f("requests_ok", v.requests_ok);
  f("requests_failed", v.requests_failed);
  f("requests_refused", v.requests_refused);
  f("refusal_s", v.refusal_s);
  f("seconds", v.seconds);
  f("ttft_s", v.ttft_s);
  f("tpot_s", v.tpot_s);
  f("itl_s", v.itl_s);
  f("e2e_s", v.e2e_s);
  f("requests_per_s", v.requests_per_s);
  f("output_tokens_per_s", v.output_tokens_per_s);
  f("total_tokens_per_s", v.total_tokens_per_s);
  f("goodput_requests_per_s", v.goodput_requests_per_s);
}

static void Fields(auto& f, LevelResult& v) {
  Fields(f, static_cast<LevelFigures&>(v));
  f("concurrency", v.concurrency);
  f.Optional("rate", v.rate);
  f.Optional("cycle", v.cycle);
  f("workers", v.workers);
  f.Optional("pools", v.pools);
}

static void Fields(auto& f, RequestResult& v) {
  f("concurrency", v.concurrency);
  f("session", v.session);
  f("turn", v.turn);
  f("ok", v.ok);
  f("refused", v.refused);
  f("error", v.error);
  f("start_s", v.start_s);
  f("prompt_tokens", v.prompt_tokens);
  f("cached_tokens", v.cached_tokens);
  f("output_tokens", v.output_tokens);
  f("ttft_s", v.ttft_s);
  f("tpot_s", v.tpot_s);
  f("e2e_s", v.e2e_s);
  f("gaps_s", v.gaps_s);
  f("pool", v.pool);
  f("output_text", v.output_text);
}

static void Fields(auto& f, PatternResult& v) {
  f("name", v.name);
  f("pass", v.pass);
  f("reason", v.reason);
}

static void Fields(auto& f, CycleWorker& v) {
  f("worker_id", v.worker_id);
  f("resident_bytes", v.resident_bytes);
  f("kv_blocks_free", v.kv_blocks_free);
  f("kv_blocks_total", v.kv_blocks_total);
}

static void Fields(auto& f, CycleState& v) {
  f("cycle", v.cycle);
  f("workers", v.workers);
}

static void Fields(auto& f, TurnResult& v) {
  f("turn", v.turn);
  f("requests_ok", v.requests_ok);
  f("requests_failed", v.requests_failed);
  f("ttft_s", v.ttft_s);
  f("tpot_s", v.tpot_s);
  f("e2e_s", v.e2e_s);
  f("prompt_tokens_mean", v.prompt_tokens_mean);
  f("cached_tokens_mean", v.cached_tokens_mean);
  f("output_tokens_mean", v.output_tokens_mean);
}

static void Fields(auto& f, ConversationResult& v) {
  f("sessions", v.sessions);
  f("turns", v.turns);
  f("conversations_ok", v.conversations_ok);
  f("requests_ok", v.requests_ok);
  f("requests_failed", v.requests_failed);
  f("seconds", v.seconds);
  f("conversations_per_s", v.conversations_per_s);
  f("output_tokens_per_s", v.output_tokens_per_s);
  f("ttft_later_turns_s", v.ttft_later_turns_s);
  f("per_turn", v.per_turn);
  f("workers", v.workers);
}

static void Fields(auto& f, BenchResult& v) {
  f("router", v.router);
  f("target", v.target);
  f("workload", v.workload);
  f("input_tokens", v.input_tokens);
  f("output_tokens", v.output_tokens);
  f("rate", v.rate);
  f("ttft_target_ms", v.ttft_target_ms);
  f("tpot_target_ms", v.tpot_target_ms);
  f.Optional("sessions", v.sessions);
  f.Optional("turns", v.turns);
  f.Optional("first_tokens", v.first_tokens);
  f.Optional("turn_tokens", v.turn_tokens);
  f("levels", v.levels);
  f("requests", v.requests);
  f("pattern", v.pattern);
  f.Optional("cycles", v.cycles);
  f("conversation", v.conversation);
  f.Optional("router_pools", v.router_pools);
}


// Each type's to_json and from_json are its Fields.
#define PDQ_JSON_BY_FIELDS(T)                                                \
  void to_json(json& j, const T& v) { json_fields::WriteFields(j, v); } \
  void from_json(const json& j, T& v) { json_fields::ReadFields(j, v); }
PDQ_JSON_BY_FIELDS(Distribution)
PDQ_JSON_BY_FIELDS(WorkerUsage)
PDQ_JSON_BY_FIELDS(LevelFigures)
PDQ_JSON_BY_FIELDS(LevelResult)
PDQ_JSON_BY_FIELDS(RequestResult)
PDQ_JSON_BY_FIELDS(PatternResult)
PDQ_JSON_BY_FIELDS(CycleWorker)
PDQ_JSON_BY_FIELDS(CycleState)
PDQ_JSON_BY_FIELDS(TurnResult)
PDQ_JSON_BY_FIELDS(ConversationResult)
PDQ_JSON_BY_FIELDS(BenchResult)
#undef PDQ_JSON_BY_FIELDS

absl::StatusOr<BenchResult> ReadBenchResult(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read bench result '", path, "'"));
  const json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat("'", path, "' is not a JSON object"));
  }
  BenchResult result;
  PDQ_RETURN_IF_ERROR(json_fields::ReadFieldsOrError(
      j, result, absl::StrCat("'", path, "' is not a pdq bench result: field ")));
  return result;
}

absl::Status WriteBenchResult(const std::string& path, const BenchResult& result) {
  std::ofstream f(path);
  // Answers cut at a token count may end inside a UTF-8 character.
  f << json(result).dump(1, ' ', false, json::error_handler_t::replace) << "\n";
  if (!f) return absl::UnavailableError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

}  // namespace pdq
