// The load generator behind `pdq bench` (harness/load_generator.h).
#include "harness/load_generator.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/arrivals.h"
#include "common/check.h"
#include "pdq/v1/pdq.grpc.pb.h"
#include "server/grpc_util.h"
#include "server/metrics.h"

namespace pdq {
namespace {

namespace v1 = pdq::v1;
using Clock = std::chrono::steady_clock;

double Since(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

using Record = BenchRecord;

// A line rewritten in place on a terminal, a line every 10 s in a log, until
// `done` reaches `total`.
void Progress(const std::atomic<int>& done, int total, const char* label, const char* unit) {
  const bool tty = isatty(STDERR_FILENO);
  for (int tick = 1; done.load() < total; ++tick) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    if (tty || tick % 20 == 0) {
      std::fprintf(stderr, "%spdq bench: %s: %d/%d %s%s", tty ? "\r" : "", label, done.load(),
                   total, unit, tty ? "" : "\n");
    }
  }
  if (tty) std::fprintf(stderr, "\n");
}

}  // namespace

namespace {

// Token runs of at least `tokens` tokens from `text`, `count` of them at
// offsets spread over it, each cut to `tokens`. The first starts `shift`
// (a fraction, < 1) of the spacing in (`count` 1: of the whole text).
absl::StatusOr<std::vector<std::vector<int32_t>>> CutTokenRuns(const Tokenize& tokenize,
                                                               const std::string& text,
                                                               int64_t tokens, int count,
                                                               double shift) {
  std::vector<std::vector<int32_t>> runs;
  size_t chars = (size_t)tokens * 6 + 64;  // English runs about 4 characters per token
  for (int i = 0; i < count; ++i) {
    for (int attempt = 0;; ++attempt) {
      if (chars > text.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("the text is too short for ", tokens, "-token prompts"));
      }
      const size_t room = text.size() - chars;
      // count spacings, not count - 1, when shifted: the last stays in the text.
      const size_t stride = count > 1 ? room / (shift > 0 ? count : count - 1) : room;
      size_t at = std::min(i * stride + (size_t)(shift * stride), room), end = at + chars;
      // Whole UTF-8 characters only: no continuation byte at either edge.
      auto continuation = [&](size_t k) { return k < text.size() && (text[k] & 0xC0) == 0x80; };
      while (continuation(at)) ++at;
      while (end > at && continuation(end)) --end;
      absl::StatusOr<std::vector<int32_t>> ids = tokenize(text.substr(at, end - at));
      if (!ids.ok()) return ids.status();
      if ((int64_t)ids->size() >= tokens) {
        ids->resize(tokens);
        runs.push_back(std::move(*ids));
        break;
      }
      chars *= 2;
    }
  }
  return runs;
}

absl::StatusOr<size_t> LeadingTokens(const Tokenize& tokenize);  // below

// Where --prompt-seed puts a seed in [0, 1): the golden ratio's fractional
// multiples, well apart for any few seeds; 0 for seed 0.
double SeedFraction(int64_t seed) {
  return seed > 0 ? std::fmod((double)seed * 0.6180339887498949, 1.0) : 0.0;
}

}  // namespace

absl::StatusOr<std::vector<BenchPrompt>> MakePrompts(const Tokenize& tokenize,
                                                     const Detokenize& detokenize,
                                                     const std::string& text, int64_t tokens,
                                                     int count, int64_t shared_prefix,
                                                     int64_t seed) {
  if (shared_prefix < 0 || shared_prefix >= tokens) {
    return absl::InvalidArgumentError(absl::StrCat("a shared prefix of ", shared_prefix,
                                                   " tokens leaves no tokens of a ", tokens,
                                                   "-token prompt its own"));
  }
  std::vector<int32_t> prefix;
  // After a shared prefix, each prompt's own part without the tokens the
  // tokenizer puts before any text (a BOS): they belong at the start only.
  size_t leading = 0;
  if (shared_prefix > 0) {
    PDQ_ASSIGN_OR_RETURN(std::vector<std::vector<int32_t>> one,
                         CutTokenRuns(tokenize, text, shared_prefix, 1, /*shift=*/0.5));
    prefix = std::move(one[0]);
    PDQ_ASSIGN_OR_RETURN(leading, LeadingTokens(tokenize));
  }
  // Seed 0 spaces its prompts room / (count - 1) apart and the others room /
  // count, so seed 0's starts are shift = k / (count - 1) for the others: a
  // shift within a quarter of that spacing of one moves half of it on, and no
  // prompt of a seed starts where one of seed 0's does.
  double shift = SeedFraction(seed);
  if (seed > 0 && count > 1) {
    const double k = shift * (count - 1);
    if (std::abs(k - std::round(k)) < 0.25) shift = std::fmod(shift + 0.5 / (count - 1), 1.0);
  }
  PDQ_ASSIGN_OR_RETURN(
      std::vector<std::vector<int32_t>> own,
      CutTokenRuns(tokenize, text, tokens - shared_prefix + (int64_t)leading, count, shift));
  std::vector<BenchPrompt> prompts;
  for (std::vector<int32_t>& ids : own) {
    BenchPrompt p;
    p.ids = prefix;
    p.ids.insert(p.ids.end(), ids.begin() + (int64_t)leading, ids.end());
    absl::StatusOr<std::string> piece = detokenize(p.ids);
    if (!piece.ok()) return piece.status();
    p.text = std::move(*piece);
    prompts.push_back(std::move(p));
  }
  return prompts;
}

namespace {

// pdq's own API: token-id prompts over gRPC.
class PdqTarget : public BenchTarget {
 public:
  PdqTarget(v1::Pdq::Stub& stub, double temperature) : stub_(stub), temperature_(temperature) {}
  Record Run(const BenchPrompt& prompt, int64_t output_tokens, int64_t timeout_s,
             const std::string& id, const std::string& client_id) override {
    Record r;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(timeout_s));
    v1::GenerateRequest req;
    req.set_request_id(id);
    if (!client_id.empty()) req.set_client_id(client_id);
    for (int32_t t : prompt.ids) req.mutable_tokens()->add_ids(t);
    req.set_max_tokens((int32_t)output_tokens);
    req.set_ignore_eos(true);
    if (temperature_ > 0) req.mutable_sampling()->set_temperature((float)temperature_);
    const Clock::time_point start = Clock::now();
    auto reader = stub_.Generate(&ctx, req);
    v1::GenerateResponse m;
    Clock::time_point last = start;
    while (reader->Read(&m)) {
      if (m.has_summary()) {
        r.pool = m.summary().pool();
        r.cached_tokens = m.summary().cached_tokens();
      }
      if (!m.has_delta()) continue;
      r.output_text += m.delta().text();
      if (m.delta().token_ids_size() == 0) continue;
      const Clock::time_point now = Clock::now();
      const int n = m.delta().token_ids_size();
      if (r.output_tokens == 0) {
        r.ttft = Since(start, now);
        r.gaps.insert(r.gaps.end(), n - 1, 0.0);  // tokens that came with the first
      } else {
        // Tokens that arrive together share the gap.
        for (int k = 0; k < n; ++k) r.gaps.push_back(Since(last, now) / n);
      }
      r.output_tokens += m.delta().token_ids_size();
      last = now;
    }
    const grpc::Status s = reader->Finish();
    r.e2e = Since(start, Clock::now());
    r.prompt_tokens = (int)prompt.ids.size();
    r.ok = s.ok();
    if (!s.ok()) r.error = absl::StrCat(s.error_code(), ": ", s.error_message());
    r.refused = s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED;
    if (r.refused) r.refusal = server::Trailer(ctx, server::kRefusalTrailer);
    if (r.output_tokens > 1) r.tpot = Since(start, last) - r.ttft, r.tpot /= r.output_tokens - 1;
    return r;
  }

 private:
  v1::Pdq::Stub& stub_;
  const double temperature_;
};

// The level's figures; with `per_pool`, also each A/B pool's.
LevelFigures Figures(const std::vector<Record>& records, double seconds,
                     const LatencyTargets& targets) {
  std::vector<double> ttft, tpot, e2e, gaps, refusals;
  int64_t out_tokens = 0, in_tokens = 0, good = 0;
  LevelFigures f;
  for (const Record& r : records) {
    if (!r.ok) {
      ++f.requests_failed;
      if (r.refused) {
        ++f.requests_refused;
        refusals.push_back(r.e2e);
      }
      continue;
    }
    ++f.requests_ok;
    ttft.push_back(r.ttft);
    if (r.output_tokens > 1) tpot.push_back(r.tpot);
    e2e.push_back(r.e2e);
    gaps.insert(gaps.end(), r.gaps.begin(), r.gaps.end());
    out_tokens += r.output_tokens;
    in_tokens += r.prompt_tokens;
    good += (targets.ttft <= 0 || r.ttft <= targets.ttft) &&
            (targets.tpot <= 0 || r.output_tokens < 2 || r.tpot <= targets.tpot);
  }
  auto per_second = [&](int64_t n) { return seconds > 0 ? n / seconds : 0.0; };
  f.refusal_s = DistributionOf(refusals);
  f.seconds = seconds;
  f.ttft_s = DistributionOf(ttft);
  f.tpot_s = DistributionOf(tpot);
  f.itl_s = DistributionOf(gaps);
  f.e2e_s = DistributionOf(e2e);
  f.requests_per_s = per_second(f.requests_ok);
  f.output_tokens_per_s = per_second(out_tokens);
  f.total_tokens_per_s = per_second(out_tokens + in_tokens);
  f.goodput_requests_per_s = per_second(good);
  return f;
}

// The level's figures, and under an A/B split each pool's share of the
// level, summarized alike (its rates over the same span).
LevelResult Summarize(int level, const std::vector<Record>& records, double seconds,
                      const LatencyTargets& targets) {
  LevelResult out;
  static_cast<LevelFigures&>(out) = Figures(records, seconds, targets);
  out.concurrency = level;
  std::map<std::string, std::vector<Record>> by_pool;
  for (const Record& r : records) {
    if (!r.pool.empty()) by_pool[r.pool].push_back(r);
  }
  for (const auto& [pool, rs] : by_pool) out.pools[pool] = Figures(rs, seconds, targets);
  return out;
}

// One row of the level table; `level` is the first column (the concurrency,
// or the arrival rate of an open loop).
void PrintSummary(const std::string& level, const LevelFigures& s) {
  std::printf("%5s %4lld/%-4lld %8.1f %8.1f %8.1f %7.2f %7.2f %7.2f %8.2f %9.1f %9.1f %8.2f\n",
              level.c_str(), (long long)s.requests_ok,
              (long long)(s.requests_ok + s.requests_failed), s.ttft_s.p50 * 1e3,
              s.ttft_s.p90 * 1e3, s.ttft_s.p99 * 1e3, s.tpot_s.p50 * 1e3, s.tpot_s.p90 * 1e3,
              s.tpot_s.p99 * 1e3, s.requests_per_s, s.output_tokens_per_s, s.total_tokens_per_s,
              s.goodput_requests_per_s);
  std::fflush(stdout);
}
void PrintSummary(const LevelResult& s) {
  PrintSummary(s.rate > 0 ? absl::StrFormat("%.3g/s", s.rate) : absl::StrCat(s.concurrency), s);
}

}  // namespace

std::unique_ptr<BenchTarget> PdqBenchTarget(v1::Pdq::Stub& stub, double temperature) {
  return std::make_unique<PdqTarget>(stub, temperature);
}

// The evaluation's three standard shapes; "custom" takes the flags.
constexpr WorkloadShape kWorkloads[] = {
    {"chat", 128, 512}, {"summarize", 2048, 32}, {"analysis", 2048, 512}};

const WorkloadShape* StandardWorkload(const std::string& name) {
  for (const WorkloadShape& w : kWorkloads) {
    if (name == w.name) return &w;
  }
  return nullptr;
}

std::vector<BenchRecord> Driver::Run(int concurrency, double rate, int total, int warmup,
                                     const char* label, double* seconds, uint64_t arrival_seed) {
  std::vector<Record> records(total);
  std::atomic<int> next{0}, done{0};
  const Clock::time_point start = Clock::now();
  auto one = [&](int i, int client) {
    const double begun = Since(start, Clock::now());
    const std::string client_id = client >= 0 && client_ids_ ? BenchClientId(client) : "";
    records[i] = target_.Run(prompts_[(serial_ + i) % prompts_.size()], output_tokens_, timeout_s_,
                             absl::StrCat("bench-", label, "-", serial_ + i), client_id);
    records[i].client_id = client_id;
    records[i].start = begun;
    records[i].level = concurrency;
    ++done;
  };
  std::vector<std::thread> threads;
  if (rate > 0) {
    // Open loop: arrivals do not wait for answers.
    const std::vector<double> at = PoissonArrivalTimes(rate, total, arrival_seed + serial_);
    for (int i = 0; i < total; ++i) {
      std::this_thread::sleep_until(start + std::chrono::duration_cast<Clock::duration>(
                                                std::chrono::duration<double>(at[i])));
      threads.emplace_back(one, i, -1);
    }
  } else {
    for (int c = 0; c < concurrency; ++c) {
      threads.emplace_back([&, c] {
        for (int i; (i = next++) < total;) one(i, c);
      });
    }
  }
  Progress(done, total, label, "requests");
  for (std::thread& t : threads) t.join();
  serial_ += total;
  // The warm-up requests are the ones that finished first.
  std::sort(records.begin(), records.end(),
            [](const Record& a, const Record& b) { return a.start + a.e2e < b.start + b.e2e; });
  records.erase(records.begin(), records.begin() + std::min<int>(warmup, records.size()));
  double first = 1e300, last = 0;
  for (const Record& r : records) {
    first = std::min(first, r.start);
    last = std::max(last, r.start + r.e2e);
  }
  *seconds = records.empty() ? 0 : last - first;
  return records;
}

namespace {

// Every live worker's /metrics at one moment.
struct Snapshot {
  Clock::time_point at;
  std::vector<v1::WorkerStatus> workers;
  std::vector<absl::StatusOr<std::map<std::string, double>>> samples;  // by worker
};

// Unavailable only when the router does not answer; a worker that does not
// has its own error in `samples`.
absl::StatusOr<Snapshot> TakeSnapshot(v1::Pdq::Stub& stub) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::ModelInfo info;
  if (grpc::Status s = stub.GetModelInfo(&ctx, {}, &info); !s.ok()) {
    return absl::UnavailableError(absl::StrCat("GetModelInfo: ", s.error_message()));
  }
  Snapshot snap;
  for (const v1::WorkerStatus& w : info.workers()) {
    snap.workers.push_back(w);
    snap.samples.push_back(w.metrics_address().empty()
                               ? absl::NotFoundError(absl::StrCat("worker ", w.worker_id(),
                                                                  " reports no metrics address"))
                               : server::ScrapeMetrics(w.metrics_address()));
  }
  snap.at = Clock::now();
  return snap;
}

// One worker's figures that must come back after load.
struct WorkerState {
  std::string id, metrics;
  double kv_free = 0, kv_total = 0, rss = 0;
  double kv_held_peak = 0;  // bytes: the most KV that held data (resident once touched)
};

// The workers that report metrics (older ones do not), by id; the error of
// one that reports an address and does not answer.
absl::StatusOr<std::vector<WorkerState>> ReadWorkers(v1::Pdq::Stub& stub) {
  absl::StatusOr<Snapshot> snap = TakeSnapshot(stub);
  if (!snap.ok()) return snap.status();
  std::vector<WorkerState> out;
  for (size_t i = 0; i < snap->workers.size(); ++i) {
    const v1::WorkerStatus& w = snap->workers[i];
    if (w.metrics_address().empty()) continue;
    if (!snap->samples[i].ok()) return snap->samples[i].status();
    std::map<std::string, double>& m = *snap->samples[i];
    out.push_back({w.worker_id(), w.metrics_address(), m["pdq_kv_blocks_free"],
                   m["pdq_kv_blocks_total"], m["process_resident_memory_bytes"],
                   m["pdq_kv_used_peak_bytes"]});
  }
  std::sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.id < b.id; });
  return out;
}

// The greedy answer to a fixed prompt: it must not change between cycles.
absl::StatusOr<std::vector<int32_t>> Probe(v1::Pdq::Stub& stub, int64_t timeout_s) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(timeout_s));
  v1::GenerateRequest req;
  req.set_request_id("bench-probe");
  v1::ChatMessage* m = req.mutable_chat()->add_messages();
  m->set_role("user");
  m->set_content("Explain in three sentences why the sky is blue.");
  req.set_max_tokens(48);
  req.set_ignore_eos(true);
  auto reader = stub.Generate(&ctx, req);
  std::vector<int32_t> ids;
  v1::GenerateResponse r;
  while (reader->Read(&r))
    ids.insert(ids.end(), r.delta().token_ids().begin(), r.delta().token_ids().end());
  if (grpc::Status s = reader->Finish(); !s.ok()) {
    return absl::UnavailableError(absl::StrCat("the probe failed: ", s.error_message()));
  }
  return ids;
}

// What each worker did between two snapshots: peak resident memory, CPU
// cores busy, and while computing, prefill operations against the
// machine's peak for its precision and decode bytes read against the read
// bandwidth (both measured by the worker at start-up).
std::vector<WorkerUsage> Resources(const Snapshot& a, const Snapshot& b) {
  std::vector<WorkerUsage> out;
  const double wall = Since(a.at, b.at);
  for (size_t j = 0; j < b.workers.size(); ++j) {
    if (!b.samples[j].ok()) continue;  // a worker that did not answer has no figures
    const std::map<std::string, double>& after = *b.samples[j];
    std::map<std::string, double> before;
    for (size_t i = 0; i < a.workers.size(); ++i) {
      if (a.workers[i].worker_id() == b.workers[j].worker_id() && a.samples[i].ok()) {
        before = *a.samples[i];
      }
    }
    auto get = [](const std::map<std::string, double>& m, const char* k) {
      auto it = m.find(k);
      return it == m.end() ? 0.0 : it->second;
    };
    auto delta = [&](const char* k) { return get(after, k) - get(before, k); };
    // Raw deltas too, for pdq plan: capacity while busy, and what was done.
    WorkerUsage w;
    w.wall_seconds = wall;
    w.prefill_tokens = delta("pdq_prefill_tokens_total");
    w.prefill_busy_seconds = delta("pdq_prefill_busy_seconds_total");
    w.prefill_passes =
        after.count("pdq_prefill_passes_total") ? delta("pdq_prefill_passes_total") : NAN;
    w.generated_tokens = delta("pdq_generated_tokens_total");
    w.decode_step_seconds = delta("pdq_decode_step_seconds_sum");
    w.decode_steps = delta("pdq_decode_steps_total");
    w.decode_rows = delta("pdq_decode_step_sequences_total");
    w.decode_step_prompt_tokens = delta("pdq_decode_step_prompt_tokens_sum");
    w.prefills = delta("pdq_prefill_seconds_count");
    w.prefill_seconds = delta("pdq_prefill_seconds_sum");
    w.decode_step_overhead_seconds = after.count("pdq_decode_step_overhead_seconds_total")
                                         ? delta("pdq_decode_step_overhead_seconds_total")
                                         : NAN;
    if (after.count("pdq_stream_finish_seconds_total")) {
      w.streams_finished = delta("pdq_streams_finished_total");
      w.stream_finish_seconds = delta("pdq_stream_finish_seconds_total");
    }
    w.kv_blocks_total = get(after, "pdq_kv_blocks_total");
    w.worker_id = b.workers[j].worker_id();
    w.role = b.workers[j].role();
    w.precision = b.workers[j].precision();
    w.peak_resident_bytes = get(after, "process_peak_resident_memory_bytes");
    auto reported = [&](const char* k) {
      auto it = after.find(k);
      return it == after.end() ? NAN : it->second;
    };
    w.weight_bytes = reported("pdq_weight_bytes");
    w.kv_used_peak_bytes = reported("pdq_kv_used_peak_bytes");
    w.workspace_bytes = reported("pdq_workspace_bytes");
    w.cpu_cores_busy = wall > 0 ? delta("process_cpu_seconds_total") / wall : 0;
    const double prefill_s = delta("pdq_prefill_busy_seconds_total"),
                 peak = get(after, "pdq_machine_peak_ops_per_second");
    if (prefill_s > 0 && peak > 0) {
      w.prefill_compute_utilization = delta("pdq_prefill_ops_total") / prefill_s / peak;
    }
    const double decode_s = delta("pdq_decode_step_seconds_sum"),
                 bw = get(after, "pdq_machine_read_bytes_per_second");
    if (decode_s > 0 && bw > 0) {
      w.decode_bandwidth_utilization = delta("pdq_decode_bytes_read_total") / decode_s / bw;
    }
    out.push_back(std::move(w));
  }
  return out;
}

void PrintResources(const std::vector<WorkerUsage>& workers) {
  for (const WorkerUsage& w : workers) {
    std::string line = absl::StrFormat("      %s (%s %s): peak RSS %.0f MiB", w.worker_id, w.role,
                                       w.precision, w.peak_resident_bytes / 1048576);
    if (std::isfinite(w.weight_bytes)) {
      // A worker of an older build may report its weights alone.
      auto mib = [](double bytes) {
        return std::isfinite(bytes) ? absl::StrFormat("%.0f", bytes / 1048576) : "not reported";
      };
      absl::StrAppend(&line, " (weights ", mib(w.weight_bytes), ", KV held at most ",
                      mib(w.kv_used_peak_bytes), ", workspaces ", mib(w.workspace_bytes), ")");
    }
    absl::StrAppendFormat(&line, ", %.2f cores busy", w.cpu_cores_busy);
    if (std::isfinite(w.prefill_compute_utilization)) {
      absl::StrAppendFormat(&line, ", prefill at %.2f of peak ops", w.prefill_compute_utilization);
    }
    if (std::isfinite(w.decode_bandwidth_utilization)) {
      absl::StrAppendFormat(&line, ", decode at %.2f of read bandwidth",
                            w.decode_bandwidth_utilization);
    }
    std::printf("%s\n", line.c_str());
  }
  std::fflush(stdout);
}

}  // namespace

std::string Alternate(v1::Pdq::Stub& stub, Driver& driver, const AlternateOptions& o,
                      const LatencyTargets& targets, BenchResult* out) {
  // A warm-up burst first: workspaces and allocator pools grow to their
  // working size on the first high phase, which is not a leak. The bound
  // applies from the state after it.
  for (int level : {o.high, o.low}) {
    double seconds = 0;
    const std::string label = absl::StrCat("warm-up concurrency ", level);
    for (const Record& r :
         driver.Run(level, 0, std::max(4, 2 * level), 0, label.c_str(), &seconds)) {
      if (!r.ok) return absl::StrCat("warm-up: a request failed: ", r.error);
    }
  }
  // The baseline once the warm-up's blocks are back (all free, unless
  // others use the deployment too; then whatever is free after 30 s).
  absl::StatusOr<std::vector<WorkerState>> start = ReadWorkers(stub);
  for (int wait = 0; start.ok() && wait < 300; ++wait) {
    bool idle = true;
    for (const WorkerState& w : *start) idle &= w.kv_free == w.kv_total;
    if (idle) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    start = ReadWorkers(stub);
  }
  if (!start.ok()) return std::string(start.status().message());
  if (start->empty()) return "no worker reports a metrics address (workers older than the router?)";
  absl::StatusOr<std::vector<int32_t>> probe0 = Probe(stub, o.timeout_s);
  if (!probe0.ok()) return std::string(probe0.status().message());
  for (int cycle = 1; cycle <= o.cycles; ++cycle) {
    for (int level : {o.high, o.low}) {
      double seconds = 0;
      const std::string label = absl::StrCat("cycle ", cycle, " concurrency ", level);
      std::vector<Record> records =
          driver.Run(level, 0, std::max(4, 2 * level), 0, label.c_str(), &seconds);
      LevelResult s = Summarize(level, records, seconds, targets);
      s.cycle = cycle;
      PrintSummary(s);
      out->levels.push_back(std::move(s));
      for (const Record& r : records) {
        if (!r.ok) return absl::StrCat("cycle ", cycle, ": a request failed or hung: ", r.error);
      }
    }
    // Blocks come back once the workers have seen every request end.
    absl::StatusOr<std::vector<WorkerState>> now = ReadWorkers(stub);
    for (int wait = 0; now.ok() && wait < 300; ++wait) {
      bool back = now->size() == start->size();
      for (size_t i = 0; back && i < now->size(); ++i)
        back = (*now)[i].kv_free == (*start)[i].kv_free;
      if (back) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      now = ReadWorkers(stub);
    }
    if (!now.ok()) return std::string(now.status().message());
    if (now->size() != start->size())
      return absl::StrCat("cycle ", cycle, ": workers came or went");
    std::string rss_note;
    for (size_t i = 0; i < now->size(); ++i) {
      const WorkerState &a = (*start)[i], &b = (*now)[i];
      if (b.kv_free != a.kv_free) {
        return absl::StrFormat(
            "cycle %d: worker %s has %.0f of %.0f KV blocks free, %.0f at the start", cycle, b.id,
            b.kv_free, b.kv_total, a.kv_free);
      }
      // KV pages the prefix cache touched for the first time (blocks it
      // keeps for later requests: bounded by --kv-tokens) are not a leak;
      // anything else that grew is.
      const double kv = (b.kv_held_peak - a.kv_held_peak) / 1048576;
      const double growth = (b.rss - a.rss) / 1048576 - kv;
      if (growth > o.max_rss_growth_mib) {
        return absl::StrFormat(
            "cycle %d: worker %s grew by %.0f MiB of resident memory besides %.0f MiB more KV "
            "held (bound %.0f)",
            cycle, b.id, growth, kv, o.max_rss_growth_mib);
      }
      absl::StrAppendFormat(&rss_note, "%s%s %+.1f MiB (and %+.1f MiB of KV held)", i ? ", " : "",
                            b.id, growth, kv);
    }
    CycleState state{cycle, {}};
    for (const WorkerState& w : *now) state.workers.push_back({w.id, w.rss, w.kv_free, w.kv_total});
    out->cycles.push_back(std::move(state));
    absl::StatusOr<std::vector<int32_t>> probe = Probe(stub, o.timeout_s);
    if (!probe.ok()) return std::string(probe.status().message());
    if (*probe != *probe0) {
      size_t at = 0;
      while (at < probe->size() && at < probe0->size() && (*probe)[at] == (*probe0)[at]) ++at;
      return absl::StrCat("cycle ", cycle, ": the probe's greedy answer changed at token ", at);
    }
    std::printf("cycle %d: every KV block back, resident memory %s, probe identical\n", cycle,
                rss_note.c_str());
    std::fflush(stdout);
  }
  return "";
}

namespace {

// --workload conversation: sessions of multi-turn chat in which every turn
// resends the whole conversation so far, the traffic a KV prefix cache
// speeds up. Prompts are text, the same for every target; each turn is
// tokenized as a whole by the target's tokenizer.
// The tokens `tokenize` puts before any text (a BOS): what it gives "a" and
// "b" alike at the front.
absl::StatusOr<size_t> LeadingTokens(const Tokenize& tokenize) {
  absl::StatusOr<std::vector<int32_t>> a = tokenize("a");
  if (!a.ok()) return a.status();
  absl::StatusOr<std::vector<int32_t>> b = tokenize("b");
  if (!b.ok()) return b.status();
  size_t n = 0;
  while (n < a->size() && n < b->size() && (*a)[n] == (*b)[n]) ++n;
  return n;
}

// The shortest run of whole UTF-8 characters of `text` from byte `at` (going
// on at the start past the end) that `tokenize` makes `tokens` tokens of
// besides its `leading` ones. Token counts do not grow strictly with the
// length, so now and then it is a token longer.
absl::StatusOr<std::string> CutChunk(const Tokenize& tokenize, size_t leading,
                                     const std::string& text, size_t at, int64_t tokens) {
  const size_t size = text.size();
  if (size == 0) return absl::InvalidArgumentError("the text is empty");
  auto continuation = [&](size_t k) { return (text[k % size] & 0xC0) == 0x80; };
  for (int i = 0; i < 4 && continuation(at); ++i) at = (at + 1) % size;
  auto piece = [&](size_t len) {
    return at + len <= size ? text.substr(at, len)
                            : text.substr(at) + text.substr(0, at + len - size);
  };
  auto count = [&](size_t len) -> absl::StatusOr<int64_t> {
    absl::StatusOr<std::vector<int32_t>> ids = tokenize(piece(len));
    if (!ids.ok()) return ids.status();
    return (int64_t)ids->size() - (int64_t)leading;
  };
  // Lengths in bytes, at character edges: count(lo) < tokens <= count(hi).
  size_t lo = 0, hi = std::min(size, (size_t)tokens * 6 + 64);
  for (;;) {
    while (hi < size && continuation(at + hi)) ++hi;
    absl::StatusOr<int64_t> n = count(hi);
    if (!n.ok()) return n.status();
    if (*n >= tokens) break;
    if (hi == size) {
      return absl::InvalidArgumentError(
          absl::StrCat("the text is too short for ", tokens, "-token messages"));
    }
    lo = hi;
    hi = std::min(size, hi * 2);
  }
  for (;;) {
    size_t mid = lo + (hi - lo) / 2;
    while (mid > lo && continuation(at + mid)) --mid;
    if (mid == lo) {
      mid = lo + (hi - lo) / 2;
      while (mid < hi && continuation(at + mid)) ++mid;
    }
    if (mid == lo || mid == hi) break;
    absl::StatusOr<int64_t> n = count(mid);
    if (!n.ok()) return n.status();
    (*n >= tokens ? hi : lo) = mid;
  }
  return piece(hi);
}

// The user messages: each session's first (--first-tokens) and later ones
// (--turn-tokens), each from its own place in `text`, so that sessions
// differ from their first token; and one more first-length message, apart
// from them all, for the warm-up.
struct UserMessages {
  std::vector<std::vector<std::string>> by_session;  // [session][turn - 1]
  std::string warmup;
};

absl::StatusOr<UserMessages> MakeUserMessages(const Tokenize& tokenize, const std::string& text,
                                              const ConversationOptions& o) {
  absl::StatusOr<size_t> leading = LeadingTokens(tokenize);
  if (!leading.ok()) return leading.status();
  const size_t count = (size_t)o.sessions * o.turns + 1;
  // Half a spacing in: no message starts where the text does, as a sweep's
  // first prompt (pdq bench --prompt-seed 0) does, which a deployment's
  // prefix cache would then answer. Another seed moves every start on by a
  // quarter to three quarters of a spacing, so no message of it starts where
  // one of seed 0's does.
  const double shift = o.prompt_seed > 0 ? 0.25 + 0.5 * SeedFraction(o.prompt_seed) : 0.0;
  auto cut = [&](size_t i, int64_t tokens) {
    const size_t at =
        o.prompt_seed > 0
            ? (size_t)(((double)i + 0.5 + shift) * (double)text.size() / (double)count) %
                  text.size()
            : (2 * i + 1) * text.size() / (2 * count);
    return CutChunk(tokenize, *leading, text, at, tokens);
  };
  UserMessages m;
  m.by_session.resize(o.sessions);
  for (int s = 0; s < o.sessions; ++s) {
    for (int turn = 1; turn <= o.turns; ++turn) {
      absl::StatusOr<std::string> chunk =
          cut((size_t)s * o.turns + turn - 1, turn == 1 ? o.first_tokens : o.turn_tokens);
      if (!chunk.ok()) return chunk.status();
      m.by_session[s].push_back(std::move(*chunk));
    }
  }
  absl::StatusOr<std::string> warmup = cut(count - 1, o.first_tokens);
  if (!warmup.ok()) return warmup.status();
  m.warmup = std::move(*warmup);
  return m;
}

struct ConversationRun {
  std::vector<Record> records;  // every turn sent, by session, then turn
  double seconds = 0;           // from the first turn's start to the last session's end
  int completed = 0;            // sessions whose every turn succeeded
};

// Every session in its own thread, turns back to back: turn 1 sends the
// first message; turn k the previous turn's prompt, its answer and the next
// message. A failed turn ends its session.
ConversationRun RunConversations(BenchTarget& target, const Tokenize& tokenize,
                                 const UserMessages& messages, const ConversationOptions& o) {
  std::vector<std::vector<Record>> by_session(o.sessions);
  std::vector<double> ends(o.sessions, 0);
  std::atomic<int> done{0};
  const int total = o.sessions * o.turns;
  const Clock::time_point start = Clock::now();
  auto session = [&](int s) {
    std::vector<Record>& records = by_session[s];
    std::string conversation;
    for (int turn = 1; turn <= o.turns; ++turn) {
      if (turn > 1) conversation += records.back().output_text;
      conversation += messages.by_session[s][turn - 1];
      Record r;
      absl::StatusOr<std::vector<int32_t>> ids = tokenize(conversation);
      const double begun = Since(start, Clock::now());
      if (ids.ok()) {
        r = target.Run({std::move(*ids), conversation}, o.output_tokens, o.timeout_s,
                       absl::StrCat("bench-conversation-", s, "-", turn), "");
      } else {
        r.error = absl::StrCat("tokenizing the conversation: ", ids.status().message());
      }
      r.start = begun;
      r.session = s;
      r.turn = turn;
      records.push_back(std::move(r));
      ++done;
      if (!records.back().ok) {
        done += o.turns - turn;  // the turns it will not send
        break;
      }
    }
    ends[s] = Since(start, Clock::now());
  };
  std::vector<std::thread> threads;
  for (int s = 0; s < o.sessions; ++s) threads.emplace_back(session, s);
  Progress(done, total, "conversation", "turns");
  for (std::thread& t : threads) t.join();
  ConversationRun run;
  double first = 1e300, last = 0;
  for (int s = 0; s < o.sessions; ++s) {
    for (Record& r : by_session[s]) {
      first = std::min(first, r.start);
      run.records.push_back(std::move(r));
    }
    last = std::max(last, ends[s]);
    run.completed += (int)by_session[s].size() == o.turns && by_session[s].back().ok;
  }
  run.seconds = run.records.empty() ? 0 : last - first;
  return run;
}

// Per turn: requests, TTFT, TPOT, end-to-end, mean prompt and cached
// tokens; over the run: conversations and output tokens per second, and
// the TTFT of the turns that resend a conversation (2 on).
ConversationResult SummarizeConversations(const ConversationRun& run,
                                          const ConversationOptions& o) {
  ConversationResult out;
  std::vector<double> later_ttft;
  int64_t out_tokens = 0;
  for (int turn = 1; turn <= o.turns; ++turn) {
    std::vector<double> ttft, tpot, e2e;
    TurnResult t;
    t.turn = turn;
    double prompt = 0, cached = 0, output = 0;
    for (const Record& r : run.records) {
      if (r.turn != turn) continue;
      if (!r.ok) {
        ++t.requests_failed;
        continue;
      }
      ++t.requests_ok;
      ttft.push_back(r.ttft);
      if (r.output_tokens > 1) tpot.push_back(r.tpot);
      e2e.push_back(r.e2e);
      prompt += r.prompt_tokens;
      cached += r.cached_tokens;
      output += r.output_tokens;
      if (turn >= 2) later_ttft.push_back(r.ttft);
    }
    out.requests_ok += t.requests_ok;
    out.requests_failed += t.requests_failed;
    out_tokens += (int64_t)output;
    auto mean = [&](double sum) { return t.requests_ok > 0 ? sum / t.requests_ok : 0.0; };
    t.ttft_s = DistributionOf(ttft);
    t.tpot_s = DistributionOf(tpot);
    t.e2e_s = DistributionOf(e2e);
    t.prompt_tokens_mean = mean(prompt);
    t.cached_tokens_mean = mean(cached);
    t.output_tokens_mean = mean(output);
    out.per_turn.push_back(std::move(t));
  }
  auto per_second = [&](double n) { return run.seconds > 0 ? n / run.seconds : 0.0; };
  out.sessions = o.sessions;
  out.turns = o.turns;
  out.conversations_ok = run.completed;
  out.seconds = run.seconds;
  out.conversations_per_s = per_second(run.completed);
  out.output_tokens_per_s = per_second((double)out_tokens);
  out.ttft_later_turns_s = DistributionOf(later_ttft);
  return out;
}

void PrintConversations(const ConversationResult& s) {
  std::printf("%5s %9s %8s %8s %8s %8s %8s\n", "turn", "ok/all", "ttft p50", "p90", "tpot50",
              "prompt", "cached");
  std::printf("%5s %9s %8s %8s %8s %8s %8s\n", "", "", "ms", "ms", "ms", "tokens", "tokens");
  for (const TurnResult& t : s.per_turn) {
    std::printf("%5d %4lld/%-4d %8.1f %8.1f %8.2f %8.1f %8.1f\n", t.turn, (long long)t.requests_ok,
                s.sessions, t.ttft_s.p50 * 1e3, t.ttft_s.p90 * 1e3, t.tpot_s.p50 * 1e3,
                t.prompt_tokens_mean, t.cached_tokens_mean);
  }
  std::printf(
      "%d/%d conversations of %d turns in %.2f s: %.3f conversations/s, %.1f output tok/s; "
      "TTFT p50 of turns 2 on: %.1f ms\n",
      s.conversations_ok, s.sessions, s.turns, s.seconds, s.conversations_per_s,
      s.output_tokens_per_s, s.ttft_later_turns_s.p50 * 1e3);
  std::fflush(stdout);
}

// A request's record as the bench result keeps it.
RequestResult RequestOf(const Record& r) {
  RequestResult q;
  q.concurrency = r.level;
  q.session = r.session;
  q.turn = r.turn;
  q.ok = r.ok;
  q.refused = r.refused;
  q.error = r.error;
  q.start_s = r.start;
  q.prompt_tokens = r.prompt_tokens;
  q.cached_tokens = r.cached_tokens;
  q.output_tokens = r.output_tokens;
  q.ttft_s = r.ttft;
  q.tpot_s = r.tpot;
  q.e2e_s = r.e2e;
  q.gaps_s = r.gaps;
  q.pool = r.pool;
  q.client_id = r.client_id;
  if (r.turn > 0) q.output_text = r.output_text;
  return q;
}

}  // namespace

absl::StatusOr<bool> RunConversationBench(BenchTarget& target, const Tokenize& tokenize,
                                          v1::Pdq::Stub* stub, const std::string& text,
                                          const ConversationOptions& o, BenchResult* out) {
  PDQ_ASSIGN_OR_RETURN(const UserMessages messages, MakeUserMessages(tokenize, text, o));
  if (o.warmup) {
    PDQ_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tokenize(messages.warmup));
    const Record r =
        target.Run({std::move(ids), messages.warmup}, std::min<int64_t>(o.output_tokens, 8),
                   o.timeout_s, "bench-conversation-warmup", "");
    if (!r.ok) return absl::UnavailableError(absl::StrCat("the warm-up request failed: ", r.error));
  }
  const absl::StatusOr<Snapshot> before =
      stub ? TakeSnapshot(*stub) : absl::StatusOr<Snapshot>(absl::UnimplementedError(""));
  const ConversationRun run = RunConversations(target, tokenize, messages, o);
  const absl::StatusOr<Snapshot> after =
      stub ? TakeSnapshot(*stub) : absl::StatusOr<Snapshot>(absl::UnimplementedError(""));
  ConversationResult summary = SummarizeConversations(run, o);
  if (before.ok() && after.ok()) summary.workers = Resources(*before, *after);
  bool all_ok = true;
  for (const Record& r : run.records) {
    if (!r.ok) {
      all_ok = false;
      std::fprintf(stderr, "pdq bench: session %d turn %d failed (the session ends): %s\n",
                   r.session, r.turn, r.error.c_str());
    }
    out->requests.push_back(RequestOf(r));
  }
  PrintConversations(summary);
  PrintResources(summary.workers);
  out->conversation = std::move(summary);
  return all_ok;
}

void PrintLevelHeader() {
  std::printf("%5s %9s %8s %8s %8s %7s %7s %7s %8s %9s %9s %8s\n", "conc", "ok/all", "ttft p50",
              "p90", "p99", "tpot50", "p90", "p99", "req/s", "out tok/s", "tot tok/s", "goodput");
  std::printf("%5s %9s %8s %8s %8s %7s %7s %7s\n", "", "", "ms", "ms", "ms", "ms", "ms", "ms");
}

namespace {

// The requests RunSweep counts at `level`.
int CountedAt(const SweepOptions& o, int level) {
  return o.requests > 0     ? (int)o.requests
         : o.rate > 0       ? 32
         : o.per_client > 0 ? (int)o.per_client * level
                            : std::max(8, 4 * level);
}

std::vector<int> SweepLevels(const SweepOptions& o) {
  if (o.rate > 0) return {0};
  std::vector<int> levels = o.levels;
  if (o.until_flat > 0 && !levels.empty()) {
    for (int64_t l = 2 * (int64_t)levels.back(); l <= o.until_flat; l *= 2) {
      levels.push_back((int)l);
    }
  }
  return levels;
}

}  // namespace

int FlatLevelAfter(const BenchResult& so_far, int until_flat) {
  const LevelResult* top = nullptr;
  if (so_far.levels.size() == 1) {
    top = &so_far.levels[0];  // nothing to judge yet: one level more
    if (!(top->output_tokens_per_s > 0) || top->requests_refused > 0) return 0;
  } else {
    const std::optional<Saturation> s = FindSaturation(so_far, 0.95);
    // Past the point already, at the admission bound, or no tokens at all.
    if (!s || s->at != s->top || s->refused != nullptr) return 0;
    top = s->top;
  }
  const int64_t next = 2 * (int64_t)top->concurrency;
  return next <= until_flat ? (int)next : 0;
}

bool UntilFlatExtends(const std::vector<int>& levels, int until_flat) {
  const int top = *std::max_element(levels.begin(), levels.end());
  return levels.back() == top && (int64_t)until_flat >= 2 * (int64_t)top;
}

int64_t SweepRequests(const SweepOptions& o) {
  int64_t total = 0;
  for (int level : SweepLevels(o)) total += CountedAt(o, level) + o.warmup;
  return total;
}

bool RunSweep(Driver& driver, v1::Pdq::Stub* stub, const SweepOptions& o, BenchResult* out) {
  bool all_ok = true;
  std::vector<int> levels = o.rate > 0 ? std::vector<int>{0} : o.levels;
  for (size_t i = 0; i < levels.size(); ++i) {
    const int level = levels[i];
    const int counted = CountedAt(o, level);
    const std::string label =
        o.rate > 0 ? absl::StrCat("rate ", o.rate, "/s") : absl::StrCat("concurrency ", level);
    if (o.rate <= 0 && counted + o.warmup < level) {
      std::fprintf(stderr,
                   "pdq bench: warning: %d requests at concurrency %d: the level never has %d "
                   "in flight (--requests-per-client keeps them proportional)\n",
                   counted + (int)o.warmup, level, level);
    }
    double seconds = 0;
    // Worker resources only where the target is a pdq router.
    const absl::StatusOr<Snapshot> before =
        stub ? TakeSnapshot(*stub) : absl::StatusOr<Snapshot>(absl::UnimplementedError(""));
    std::vector<Record> kept = driver.Run(level, o.rate, counted + (int)o.warmup, (int)o.warmup,
                                          label.c_str(), &seconds, o.arrival_seed);
    const absl::StatusOr<Snapshot> after =
        stub ? TakeSnapshot(*stub) : absl::StatusOr<Snapshot>(absl::UnimplementedError(""));
    int64_t refused = 0;
    std::map<std::string, int64_t> reasons;  // of the refusals, as the server named them
    for (const Record& r : kept) {
      if (r.refused) {
        ++refused;  // shed by the server's admission control: counted, not a failure
        ++reasons[r.refusal.empty() ? "unnamed" : r.refusal];
      } else if (!r.ok) {
        all_ok = false;
        std::fprintf(stderr, "pdq bench: a request failed: %s\n", r.error.c_str());
      }
      out->requests.push_back(RequestOf(r));
    }
    LevelResult s = Summarize(level, kept, seconds, o.targets);
    s.rate = o.rate;
    if (before.ok() && after.ok()) s.workers = Resources(*before, *after);
    PrintSummary(s);
    for (const auto& [pool, p] : s.pools) {
      std::printf("      pool %s:\n", pool.c_str());
      PrintSummary(absl::StrCat(level), p);
    }
    PrintResources(s.workers);
    if (refused > 0) {
      std::string why;
      for (const auto& [reason, n] : reasons) {
        absl::StrAppend(&why, why.empty() ? "" : ", ", n, " ", reason);
      }
      std::printf(
          "      %lld refused by the server (admission control: %s), answered in p50 %.1f ms, "
          "p90 %.1f ms, p99 %.1f ms\n",
          (long long)refused, why.c_str(), s.refusal_s.p50 * 1e3, s.refusal_s.p90 * 1e3,
          s.refusal_s.p99 * 1e3);
    }
    out->levels.push_back(std::move(s));
    if (i + 1 == levels.size() && o.rate <= 0 && o.until_flat > 0) {
      if (const int next = FlatLevelAfter(*out, o.until_flat); next > 0) {
        std::fprintf(stderr,
                     "pdq bench: output tokens/s still rising at concurrency %d: concurrency %d "
                     "next (--until-flat %d)\n",
                     level, next, o.until_flat);
        levels.push_back(next);
      }
    }
  }
  return all_ok;
}

}  // namespace pdq
