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

std::optional<Saturation> FindSaturation(const BenchResult& bench, double within) {
  PDQ_CHECK(within > 0 && within <= 1);  // a fraction of the most
  std::vector<const LevelResult*> levels;
  for (const LevelResult& l : bench.levels) levels.push_back(&l);
  std::sort(levels.begin(), levels.end(), [](const LevelResult* a, const LevelResult* b) {
    return a->concurrency < b->concurrency;
  });
  if (levels.size() < 2) return std::nullopt;
  Saturation s;
  for (const LevelResult* l : levels) s.most = std::max(s.most, l->output_tokens_per_s);
  if (!(s.most > 0)) return std::nullopt;
  for (const LevelResult* l : levels) {
    if (l->output_tokens_per_s >= within * s.most) {
      s.at = l;
      break;
    }
  }
  for (const LevelResult* l : levels) {
    if (l->requests_refused > 0) {
      s.refused = l;
      break;
    }
  }
  s.top = levels.back();
  s.below_top = levels[levels.size() - 2];
  return s;
}

const LevelResult* MostGoodput(const BenchResult& bench) {
  const LevelResult* best = nullptr;
  for (const LevelResult& l : bench.levels) {
    if (!(l.goodput_requests_per_s > 0)) continue;
    if (best == nullptr || l.goodput_requests_per_s > best->goodput_requests_per_s ||
        (l.goodput_requests_per_s == best->goodput_requests_per_s &&
         l.concurrency < best->concurrency)) {
      best = &l;
    }
  }
  return best;
}

// ---- JSON: each type's fields, listed once (harness/json_fields.h). Static:
// found by argument-dependent lookup, private to this file.

static void Fields(auto& f, Distribution& v) { PDQ_JSON_EACH(p50, p90, p99, mean) }

static void Fields(auto& f, WorkerUsage& v) {
  PDQ_JSON_EACH(worker_id, role, precision, wall_seconds, prefill_tokens, prefill_busy_seconds,
                generated_tokens, decode_step_seconds, kv_blocks_total, peak_resident_bytes,
                cpu_cores_busy, prefill_compute_utilization, decode_bandwidth_utilization,
                weight_bytes, kv_used_peak_bytes, workspace_bytes, decode_steps, decode_rows,
                decode_step_prompt_tokens, prefills, prefill_seconds, decode_step_overhead_seconds,
                prefill_passes, streams_finished, stream_finish_seconds)
}

static void Fields(auto& f, LevelFigures& v) {
  PDQ_JSON_EACH(requests_ok, requests_failed, requests_refused, refusal_s, seconds, ttft_s, tpot_s,
                itl_s, e2e_s, requests_per_s, output_tokens_per_s, total_tokens_per_s,
                goodput_requests_per_s)
}

static void Fields(auto& f, LevelResult& v) {
  Fields(f, static_cast<LevelFigures&>(v));
  PDQ_JSON_EACH(concurrency, workers)
  PDQ_JSON_EACH_OPTIONAL(rate, cycle, pools)
}

static void Fields(auto& f, RequestResult& v) {
  PDQ_JSON_EACH(concurrency, session, turn, ok, refused, error, start_s, prompt_tokens,
                cached_tokens, output_tokens, ttft_s, tpot_s, e2e_s, gaps_s, pool, output_text)
  PDQ_JSON_EACH_OPTIONAL(client_id)
}

static void Fields(auto& f, PatternResult& v) { PDQ_JSON_EACH(name, pass, reason) }

static void Fields(auto& f, CycleWorker& v) {
  PDQ_JSON_EACH(worker_id, resident_bytes, kv_blocks_free, kv_blocks_total)
}

static void Fields(auto& f, CycleState& v) { PDQ_JSON_EACH(cycle, workers) }

static void Fields(auto& f, TurnResult& v) {
  PDQ_JSON_EACH(turn, requests_ok, requests_failed, ttft_s, tpot_s, e2e_s, prompt_tokens_mean,
                cached_tokens_mean, output_tokens_mean)
}

static void Fields(auto& f, ConversationResult& v) {
  PDQ_JSON_EACH(sessions, turns, conversations_ok, requests_ok, requests_failed, seconds,
                conversations_per_s, output_tokens_per_s, ttft_later_turns_s, per_turn, workers)
}

static void Fields(auto& f, BenchResult& v) {
  PDQ_JSON_EACH(router, target, workload, input_tokens, output_tokens, rate, ttft_target_ms,
                tpot_target_ms, levels, requests, pattern, conversation)
  PDQ_JSON_EACH_OPTIONAL(sessions, turns, first_tokens, turn_tokens, cycles, router_pools,
                         shared_prefix_tokens, prompt_seed, temperature, arrival_seed, client_ids,
                         started_at, finished_at)
}

// Each type's to_json and from_json are its Fields, instantiated here for
// every BenchResultPart.
template <BenchResultPart T>
void to_json(json& j, const T& v) {
  json_fields::WriteFields(j, v);
}
template <BenchResultPart T>
void from_json(const json& j, T& v) {
  json_fields::ReadFields(j, v);
}
#define PDQ_INSTANTIATE(T)                   \
  template void to_json<T>(json&, const T&); \
  template void from_json<T>(const json&, T&);
PDQ_INSTANTIATE(Distribution)
PDQ_INSTANTIATE(WorkerUsage)
PDQ_INSTANTIATE(LevelFigures)
PDQ_INSTANTIATE(LevelResult)
PDQ_INSTANTIATE(RequestResult)
PDQ_INSTANTIATE(PatternResult)
PDQ_INSTANTIATE(CycleWorker)
PDQ_INSTANTIATE(CycleState)
PDQ_INSTANTIATE(TurnResult)
PDQ_INSTANTIATE(ConversationResult)
PDQ_INSTANTIATE(BenchResult)
#undef PDQ_INSTANTIATE

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
