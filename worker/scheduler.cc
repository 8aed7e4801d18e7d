#include "worker/scheduler.h"

#include <algorithm>
#include <optional>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/check.h"
#include "common/log.h"
#include "policy/batch.h"
#include "server/metrics.h"
#include "worker/text_stream.h"

namespace pdq::worker {

const char* RoleName(Role role) {
  switch (role) {
    case Role::kPrefill:
      return "prefill";
    case Role::kDecode:
      return "decode";
    case Role::kBoth:
      return "both";
  }
  return "?";
}

absl::StatusOr<Role> ParseRole(const std::string& name) {
  if (name == "prefill") return Role::kPrefill;
  if (name == "decode") return Role::kDecode;
  if (name == "both") return Role::kBoth;
  return absl::InvalidArgumentError(
      absl::StrCat("role must be prefill, decode or both, not '", name, "'"));
}

namespace {

enum class Kind { kPrefillOnly, kDecodeReservation, kBoth };
enum class Stage { kQueued, kAwaitingKv, kSending, kDecoding };

// Tokens of a prompt the prefill rate is measured on at start.
constexpr int kPrefillRateProbeTokens = 128;

// Made-up prompt tokens for timing passes before serving (any will do: the
// cost does not depend on which).
std::vector<int32_t> SyntheticTokens(int64_t n, int64_t salt, int vocab) {
  std::vector<int32_t> t(n);
  for (int64_t i = 0; i < n; ++i) t[i] = (int32_t)((salt * 7919 + i * 104729 + 13) % vocab);
  return t;
}

const char* ReasonName(FinishReason r) {
  switch (r) {
    case FinishReason::kEos:
      return "eos";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kContextFull:
      return "context_full";
  }
  return "?";
}

double Seconds(absl::Duration d) { return absl::ToDoubleSeconds(d); }

// The weights the contexts' models hold, each model once (two contexts may
// share one).
int64_t HeldWeightBytes(const Context* prefill, const Context* decode) {
  int64_t bytes = prefill != nullptr ? prefill->model().resident_weight_bytes() : 0;
  if (decode != nullptr && (prefill == nullptr || &decode->model() != &prefill->model())) {
    bytes += decode->model().resident_weight_bytes();
  }
  return bytes;
}

int64_t SpanBytes(const std::vector<KvSpan>& spans) {
  int64_t n = 0;
  for (const KvSpan& s : spans) n += s.bytes;
  return n;
}

// What the scheduler counts for /metrics (the load gauges are read from
// load() by the server).
struct WorkMetrics {
  server::Metrics& m = server::Metrics::Global();
  server::Counter& prefill_tokens =
      m.GetCounter("pdq_prefill_tokens_total", "Prompt tokens computed by prefill.");
  server::Counter& prefill_ops = m.GetCounter(
      "pdq_prefill_ops_total",
      "Arithmetic operations of the prefill forward passes (2 per multiply-add), for compute "
      "utilization against pdq_machine_peak_ops_per_second.");
  server::Counter& prefill_busy =
      m.GetCounter("pdq_prefill_busy_seconds_total",
                   "Time spent in prefill forward passes (batched prompts count once).");
  server::Counter& prefill_passes = m.GetCounter(
      "pdq_prefill_passes_total",
      "Forward passes that computed prompt tokens (with pdq_prefill_busy_seconds_total "
      "and pdq_prefill_tokens_total: the mean prompt pass).");
  server::Counter& decode_bytes =
      m.GetCounter("pdq_decode_bytes_read_total",
                   "Weight and KV bytes the decode steps read, for bandwidth utilization against "
                   "pdq_machine_read_bytes_per_second.");
  server::Histogram& prefill_seconds = m.GetHistogram(
      "pdq_prefill_seconds", "Compute time of one prompt, from its first chunk to its last.",
      server::LatencyBuckets());
  server::Counter& generated_tokens =
      m.GetCounter("pdq_generated_tokens_total", "Tokens streamed to callers.");
  server::Counter& decode_steps = m.GetCounter(
      "pdq_decode_steps_total", "Decode steps (each advances every running sequence).");
  server::Counter& decode_step_rows = m.GetCounter("pdq_decode_step_sequences_total",
                                                   "Sequences advanced, summed over decode steps.");
  server::Histogram& decode_step_seconds = m.GetHistogram(
      "pdq_decode_step_seconds", "Time of one decode step.", server::LatencyBuckets());
  server::Counter& streams_finished = m.GetCounter(
      "pdq_streams_finished_total",
      "Streams that ended with their last token (length, stop or end of text), in the stepping "
      "loop.");
  server::Counter& stream_finish_seconds = m.GetCounter(
      "pdq_stream_finish_seconds_total",
      "Time the stepping loop spent ending those streams after sending their last token (the "
      "summary, the log line, the call's end, caching their KV blocks), summed: with "
      "pdq_streams_finished_total, how long a step's finished streams hold the loop before it "
      "takes new requests.");
  server::Counter& decode_step_overhead = m.GetCounter(
      "pdq_decode_step_overhead_seconds_total",
      "Time the stepping loop spent outside the forward passes in iterations that ran decode "
      "rows (taking requests, forming the step, sampling, sending the tokens), summed: with "
      "pdq_decode_step_seconds, what a token costs its stream.");
  server::Histogram& step_prefill_tokens = m.GetHistogram(
      "pdq_decode_step_prompt_tokens",
      "Prompt tokens computed in the same step as the decode rows (in one forward pass, or "
      "just before it when prefill runs at another precision): what delays decoding streams.",
      {0, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096});
  server::Counter& kv_sent =
      m.GetCounter("pdq_kv_bytes_sent_total", "KV cache bytes posted to decode workers.");
  server::Counter& kv_received =
      m.GetCounter("pdq_kv_bytes_received_total", "KV cache bytes received and verified.");
  server::Histogram& kv_transfer_seconds = m.GetHistogram(
      "pdq_kv_transfer_seconds",
      "Prefill side: from the end of a prompt's compute to the decode worker's "
      "acknowledgement of its KV (the part of the transfer not hidden behind compute).",
      server::LatencyBuckets());
  static WorkMetrics& Get() {
    static WorkMetrics* w = new WorkMetrics;
    return *w;
  }
};

// The prefix cache's figures, labelled by the worker's pool and by the
// precision that wrote the reused blocks.
struct CacheMetrics {
  explicit CacheMetrics(const std::string& pool)
      : pool(pool),
        lookups(server::Metrics::Global().GetCounter("pdq_prefix_cache_lookups_total",
                                                     "Prompts looked up in the KV prefix cache.",
                                                     {{"pool", pool}})),
        lookup_tokens(server::Metrics::Global().GetCounter(
            "pdq_prefix_cache_lookup_tokens_total",
            "Prompt tokens looked up in the KV prefix cache (the hit rate's denominator).",
            {{"pool", pool}})),
        evictions(server::Metrics::Global().GetCounter(
            "pdq_prefix_cache_evictions_total",
            "Cached KV blocks evicted to make room for new sequences.", {{"pool", pool}})) {}
  server::Counter& hit_tokens(const std::string& writer) {
    return server::Metrics::Global().GetCounter(
        "pdq_prefix_cache_hit_tokens_total",
        "Prompt tokens whose KV was reused from the prefix cache, by the precision that wrote it.",
        {{"pool", pool}, {"writer", writer}});
  }
  const std::string pool;
  server::Counter &lookups, &lookup_tokens, &evictions;
};

}  // namespace

struct Scheduler::Sequence {
  uint64_t key = 0;  // names the sequence in transport callbacks
  Kind kind = Kind::kBoth;
  Stage stage = Stage::kQueued;
  std::string request_id;
  bool batch = false;  // batch priority
  SeqId seq = 0;
  absl::Time arrival, deadline = absl::InfiniteFuture();

  // Prefill.
  // The prompt, then (for a sequence that decodes) the tokens generated.
  std::vector<int32_t> tokens;
  int64_t prompt_tokens = 0;
  uint64_t cache_seed = 0;    // the prefix cache's seed for its salt
  int64_t cached_tokens = 0;  // prompt tokens reused from the prefix cache
  int64_t skip_tokens = 0;    // prefill: leading tokens the receiver holds, not sent
  int64_t prefilled = 0;
  SamplingParams first_sampling;
  std::unique_ptr<kvtransfer::Outbound> outbound;
  std::shared_ptr<PrefillCall> call;
  absl::Time compute_start, compute_end;
  int32_t first_token = -1;

  // Decode.
  std::string reservation_id;
  absl::Time lease_end = absl::InfiniteFuture();
  std::unique_ptr<kvtransfer::Inbound> inbound;
  int64_t kv_bytes = 0;   // what the transfer brings
  std::string kv_writer;  // the precision of the prefill that sends it
  // The missing prompt tokens are prefilled here (a short suffix), not sent.
  bool local_prefill = false;
  // That prefill is queued: since the reservation (when it brought the
  // first token's sampling) or since the Decode call.
  bool prefill_started = false;
  bool kv_landed = false;
  // Its request id went to the routers as taken (kv_taken_): when its
  // blocks are freed it goes as released (kv_released_).
  bool kv_listed = false;
  // The prefill worker connected for this reservation's KV (it does when
  // it queues the prompt): from then on its connection, not the lease,
  // says whether the KV is still coming.
  bool sender_connected = false;
  kvtransfer::KvNotice notice;
  std::shared_ptr<TokenStream> stream;
  GenerationParams params;
  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<TextStream> text;
  int32_t last_token = -1;
  int64_t generated = 0;
  absl::Time first_token_time, last_token_time;
  absl::Time paused_since = absl::InfiniteFuture();
  // Live migration, source side: not decoding until `suspend_end` (then it
  // decodes on); `migration` runs while its KV is sent.
  bool suspended = false;
  absl::Time suspend_end = absl::InfiniteFuture();
  std::function<void(absl::StatusOr<KvSent>)> migration;
  absl::Time migration_start;
  int64_t migration_bytes = 0;
  // The original prompt's length, for a migrated stream's summary.
  int64_t summary_prompt_tokens = -1;
  int64_t first_skip = 0;  // prefill: samples the stream drew before its first pick here
  bool emitted = false;    // a token went out from here (first_token_time is set)
  bool finished = false;
};

Scheduler::Scheduler(const SchedulerOptions& options, Context* prefill, Context* decode,
                     std::unique_ptr<KvCache> kv, kvtransfer::Transport* transport)
    : options_(options),
      prefill_(prefill),
      decode_(decode),
      kv_(std::move(kv)),
      transport_(transport),
      weight_bytes_(HeldWeightBytes(prefill, decode)),
      kv_block_bytes_(kv_->block_bytes() * kv_->layout().num_layers) {
  PDQ_CHECK(options_.role == Role::kDecode || prefill_ != nullptr);
  PDQ_CHECK(options_.role == Role::kPrefill || decode_ != nullptr);
  PDQ_CHECK(options_.role == Role::kBoth || transport_ != nullptr);
  std::random_device rd;
  id_salt_ = ((uint64_t)rd() << 32) ^ rd();
  kv_->TakePrefixEvents();  // starts the event log
  if (options_.calibrate_step_costs && decode_ != nullptr) {
    const absl::Time start = absl::Now();
    absl::StatusOr<std::string> learnt = CalibrateStepCosts();
    if (learnt.ok()) {
      calibration_ = *learnt;
      LogLine(absl::StrFormat("step costs measured in %.2f s: %s", Seconds(absl::Now() - start),
                              calibration_));
    } else {
      // The models then learn from the first steps, as without calibration.
      LogLine(absl::StrCat("step costs not measured at start (", learnt.status().message(),
                           "); learning them from the first steps"));
    }
  }
  if (options_.role != Role::kDecode) {
    absl::StatusOr<double> rate = MeasurePrefillRate();
    if (rate.ok()) {
      prefill_rate_ = *rate;
      LogLine(absl::StrFormat("prefill rate measured at start: %.0f tokens/s (one %d-token prompt)",
                              *rate, kPrefillRateProbeTokens));
    } else {
      LogLine(absl::StrCat("prefill rate not measured at start (", rate.status().message(),
                           "); the router learns it from the first prompts"));
    }
  }
  UpdateLoad();
  thread_ = std::thread([this] { Loop(); });
}

absl::StatusOr<double> Scheduler::MeasurePrefillRate() {
  Context* ctx = prefill_context();
  const int64_t block = kv_->layout().block_tokens;
  if (kv_->num_free_blocks() * block < kPrefillRateProbeTokens) {
    return absl::ResourceExhaustedError(absl::StrCat("the KV cache holds fewer than the ",
                                                     kPrefillRateProbeTokens, " tokens it takes"));
  }
  const std::vector<int32_t> prompt =
      SyntheticTokens(kPrefillRateProbeTokens, 0, ctx->model().config().vocab_size);
  const SeqId seq = kv_->AddSequence();
  Logits logits;
  auto pass = [&](std::span<const int32_t> tokens) -> absl::StatusOr<double> {
    const BatchEntry e{seq, tokens, 1};
    const absl::Time t0 = absl::Now();
    PDQ_RETURN_IF_ERROR(ctx->Forward(*kv_, {&e, 1}, &logits));
    for (const absl::Status& st : logits.status) PDQ_RETURN_IF_ERROR(st);
    const double took = Seconds(absl::Now() - t0);
    PDQ_RETURN_IF_ERROR(kv_->SetLength(seq, 0));
    return took;
  };
  // A short untimed pass first: the first touch of the weights and
  // workspaces is not what serving costs.
  absl::StatusOr<double> took = pass(std::span<const int32_t>(prompt).first(16));
  if (took.ok()) took = pass(prompt);
  kv_->RemoveSequence(seq).IgnoreError();
  PDQ_RETURN_IF_ERROR(took.status());
  return double(kPrefillRateProbeTokens) / std::max(*took, 1e-6);
}

absl::StatusOr<std::string> Scheduler::CalibrateStepCosts() {
  Context* prompt_ctx = prefill_context();
  const bool fused = prompt_ctx == decode_;
  const KvLayout& layout = kv_->layout();
  const int64_t need = policy::CalibrationKvTokens(fused, layout.block_tokens);
  if (kv_->num_free_blocks() * layout.block_tokens < need) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the KV cache holds fewer than the ", need, " tokens it takes"));
  }
  const int vocab = decode_->model().config().vocab_size;
  auto tokens = [&](int64_t n, int64_t salt) { return SyntheticTokens(n, salt, vocab); };
  Logits logits;
  std::vector<SeqId> seqs;
  auto run = [&](Context* ctx, std::span<const BatchEntry> batch) -> absl::StatusOr<double> {
    const absl::Time t0 = absl::Now();
    PDQ_RETURN_IF_ERROR(ctx->Forward(*kv_, batch, &logits));
    for (const absl::Status& st : logits.status) PDQ_RETURN_IF_ERROR(st);
    return Seconds(absl::Now() - t0);
  };
  auto calibrate = [&]() -> absl::Status {
    const std::vector<policy::CalibrationPass> passes = policy::CalibrationPasses(fused);
    int64_t rows = 0, context = 0;
    for (const policy::CalibrationPass& p : passes) {
      rows = std::max(rows, p.rows);
      context = std::max(context, p.context);
    }
    // The decode rows' sequences, filled in one untimed pass (by the decode
    // model, whose KV they are).
    std::vector<std::vector<int32_t>> filled;
    std::vector<BatchEntry> fill;
    for (int64_t r = 0; r < rows; ++r) {
      seqs.push_back(kv_->AddSequence());
      filled.push_back(tokens(context, r + 1));
    }
    for (int64_t r = 0; r < rows; ++r) fill.push_back({seqs[r], filled[r], 1});
    PDQ_RETURN_IF_ERROR(run(decode_, fill).status());
    const SeqId prompt = kv_->AddSequence();
    seqs.push_back(prompt);
    int64_t longest = 0;
    for (const policy::CalibrationPass& p : passes) longest = std::max(longest, p.chunk);
    const std::vector<int32_t> prompt_tokens = tokens(longest, 0);
    std::vector<int32_t> row_tokens(rows, 1);
    // The fill touched the decode model's weights; a prompt model of its own
    // gets a first pass untimed too.
    if (!fused) {
      const BatchEntry warm{prompt, std::span<const int32_t>(prompt_tokens).first(16), 1};
      PDQ_RETURN_IF_ERROR(run(prompt_ctx, {&warm, 1}).status());
      PDQ_RETURN_IF_ERROR(kv_->SetLength(prompt, 0));
    }
    for (const policy::CalibrationPass& p : passes) {
      std::vector<BatchEntry> decode_batch, prompt_batch;
      for (int64_t r = 0; r < p.rows; ++r) {
        PDQ_RETURN_IF_ERROR(kv_->SetLength(seqs[r], p.context));  // filled to `context`
        decode_batch.push_back({seqs[r], {&row_tokens[r], 1}, 1});
      }
      if (p.chunk > 0) {
        prompt_batch.push_back({prompt, std::span<const int32_t>(prompt_tokens).first(p.chunk), 1});
      }
      if (fused) {
        decode_batch.insert(decode_batch.end(), prompt_batch.begin(), prompt_batch.end());
        PDQ_ASSIGN_OR_RETURN(const double t, run(decode_, decode_batch));
        decode_cost_.Calibrate(p.Work(), t);
      } else {
        if (!prompt_batch.empty()) {
          PDQ_ASSIGN_OR_RETURN(const double t, run(prompt_ctx, prompt_batch));
          prefill_cost_.Calibrate(p.PromptWork(), t);
        }
        if (!decode_batch.empty()) {
          PDQ_ASSIGN_OR_RETURN(const double t, run(decode_, decode_batch));
          decode_cost_.Calibrate(p.RowWork(), t);
        }
      }
      if (p.chunk > 0) PDQ_RETURN_IF_ERROR(kv_->SetLength(prompt, 0));
    }
    return absl::OkStatus();
  };
  const absl::Status st = calibrate();
  for (SeqId q : seqs) kv_->RemoveSequence(q).IgnoreError();
  PDQ_RETURN_IF_ERROR(st);
  if (fused) return absl::StrCat("one pass ", decode_cost_.Describe());
  return absl::StrCat("prompt pass ", prefill_cost_.Describe(), ", decode pass ",
                      decode_cost_.Describe());
}

Scheduler::~Scheduler() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Scheduler::Post(std::function<void()> command) {
  {
    std::lock_guard lock(mu_);
    commands_.push_back(std::move(command));
  }
  cv_.notify_all();
}

void Scheduler::Wake() {
  {
    std::lock_guard lock(mu_);
    wake_ = true;
  }
  cv_.notify_all();
}

SchedulerLoad Scheduler::load() const {
  SchedulerLoad l;
  l.queued_prompt_tokens = queued_prompt_tokens_.load();
  l.kv_blocks_free = kv_blocks_free_.load();
  l.kv_blocks_total = kv_->num_blocks();
  l.active_sequences = active_.load();
  l.reservations = reservations_.load();
  l.sequences_held = sequences_held_.load();
  l.kv_blocks_cached = kv_blocks_cached_.load();
  l.prefill_tokens_per_second = prefill_rate_.load();
  l.weight_bytes = weight_bytes_;
  l.kv_bytes_total = kv_->num_blocks() * kv_block_bytes_;
  l.kv_bytes_used = kv_bytes_used_.load();
  l.kv_bytes_used_peak = kv_bytes_used_peak_.load();
  l.workspace_bytes = workspace_bytes_.load();
  return l;
}

std::string Scheduler::NewId() {
  std::mt19937_64 rng(id_salt_ ^ (++next_id_ * 0x9e3779b97f4a7c15ull));
  return absl::StrFormat("%016x%016x", rng(), rng());
}

// ---- Commands ---------------------------------------------------------------

void Scheduler::Reserve(ReserveArgs args, std::function<void(absl::StatusOr<Reservation>)> done) {
  const int64_t tokens = std::min<int64_t>(decode_->model().config().max_context,
                                           args.prompt_tokens + args.max_tokens);
  {
    // Refused at once rather than after the step in progress (hundreds of
    // ms on a loaded worker): even with every whole block of the prompt
    // from the prefix cache, the rest would not fit in the blocks free at
    // the end of the last step. The exact check runs between steps.
    const int64_t bt = kv_->layout().block_tokens;
    const int64_t more = (tokens + bt - 1) / bt - args.prompt_tokens / bt;
    const int64_t free = kv_blocks_free_.load();
    if (more > free) {
      const absl::Status st = absl::ResourceExhaustedError(absl::StrCat(
          "KV cache full: ", tokens, " tokens need at least ", more, " more blocks of ", bt,
          " tokens but only ", free, " of ", kv_->num_blocks(), " are free"));
      LogLine(absl::StrCat("request ", args.request_id, ": reservation refused: ", st.message()));
      done(st);
      return;
    }
  }
  Post([this, tokens, args = std::move(args), done = std::move(done)] {
    auto refuse = [&](const absl::Status& st) {
      LogLine(absl::StrCat("request ", args.request_id, ": reservation refused: ", st.message()));
      done(st);
    };
    if (!args.prompt.empty() && (int64_t)args.prompt.size() != args.prompt_tokens) {
      return refuse(absl::InvalidArgumentError(absl::StrCat("the prompt has ", args.prompt.size(),
                                                            " ids but prompt_tokens is ",
                                                            args.prompt_tokens)));
    }
    // A new sequence of length 0 whose blocks the transfer fills, after the
    // prompt's cached prefix.
    absl::StatusOr<SeqId> seq = kv_->ImportSequence(args.sender, 0);
    if (!seq.ok()) return refuse(seq.status());
    auto s = std::make_unique<Sequence>();
    s->key = ++next_id_;
    s->kind = Kind::kDecodeReservation;
    s->stage = Stage::kAwaitingKv;
    s->request_id = args.request_id;
    s->seq = *seq;
    s->arrival = absl::Now();
    s->deadline = args.deadline;
    s->prompt_tokens = args.prompt_tokens;
    s->tokens = std::move(args.prompt);
    s->cache_seed = kv_->PrefixSeed(args.cache_salt);
    s->kv_writer = args.kv_writer.empty() ? "?" : args.kv_writer;
    // What the prefill would write is what the reuse must match.
    const int64_t hit = AttachCachedPrefix(*s, s->prompt_tokens - 1, s->kv_writer);
    if (absl::Status r = kv_->Reserve(s->seq, tokens); !r.ok()) {
      PDQ_CHECK(kv_->RemoveSequence(s->seq).ok());
      return refuse(r);
    }
    kv_taken_.push_back(s->request_id);
    s->kv_listed = true;
    s->lease_end = std::min(args.deadline, s->arrival + options_.reservation_lease);
    s->reservation_id = NewId();
    Reservation r{s->reservation_id, NewId(), options_.reservation_lease, hit};
    // Prefilling here writes at this worker's precision: where that is the
    // sender's; or, where any precision's KV may be reused, when this worker
    // holds at least as much of the prompt as is missing and more of it than
    // the prefill worker does (a conversation's next turn, whose last answer
    // only this worker holds: what reuse across precisions was measured on).
    // A fresh prompt that shares a system prompt with earlier ones stays
    // with the prefill worker, which holds that system prompt too: sent
    // here, its prefill took this worker's decode steps' time, 5-29% of the
    // output tokens/s of 1P+1D W8A8/W4A16 (bench/shared_prefix_bench.sh).
    const int64_t missing = s->prompt_tokens - hit;
    const bool may_prefill_here =
        s->kv_writer == decode_writer() ||
        (options_.reuse_any_precision && hit >= missing && hit > args.prefill_cached_tokens);
    if (hit > 0 && may_prefill_here && missing <= args.local_prefill_max_tokens) {
      // A follow-up whose missing part is short enough to prefill here: it
      // queues like role both's, now when the reservation brings the first
      // token's sampling (the token then waits for the Decode call), else
      // when the Decode call comes. A prompt this worker holds nothing of
      // goes to the prefill worker, however short: that is its precision.
      r.local_prefill = true;
      s->local_prefill = true;
      s->kv_landed = true;  // no transfer to wait for
      const bool now = args.first_sampling.has_value() &&
                       queued_prompt_tokens_.load() + missing <= options_.max_queued_prompt_tokens;
      if (now) {
        s->first_sampling = *args.first_sampling;
        s->batch = args.batch;
        QueueLocalPrefill(*s);
      }
      LogLine(absl::StrCat("request ", s->request_id, ": reserved ", tokens, " tokens of KV, ", hit,
                           " of the ", s->prompt_tokens,
                           "-token prompt cached; prefilling the rest ",
                           now ? "here now" : "here when its Decode call comes"));
      sequences_.push_back(std::move(s));
      done(r);
      return;
    }
    kvtransfer::InboundSpec spec;
    spec.token = r.transfer_token;
    spec.tokens = args.prompt_tokens;
    for (int l = 0; l < kv_->layout().num_layers; ++l) {
      std::vector<KvSpan> spans = *kv_->LayerSpans(s->seq, l, args.prompt_tokens);
      // The cached blocks are not sent.
      spans.erase(spans.begin(), spans.begin() + 2 * (hit / kv_->layout().block_tokens));
      s->kv_bytes += SpanBytes(spans);
      spec.layers.push_back(std::move(spans));
    }
    spec.done = [this, key = s->key](absl::Status st, const kvtransfer::KvNotice& n) {
      Post([this, key, st, n] {
        for (auto& s : sequences_) {
          if (s->key != key || s->finished) continue;
          s->inbound.reset();
          if (!st.ok()) {
            FinishSequence(*s, absl::UnavailableError(absl::StrCat(
                                   "KV transfer from prefill failed: ", st.message())));
          } else {
            WorkMetrics::Get().kv_received.Add(double(s->kv_bytes));
            s->kv_landed = true;
            s->notice = n;
            PDQ_CHECK(kv_->SetLength(s->seq, s->prompt_tokens).ok());
            CacheBlocks(*s, s->kv_writer);
            // The Decode call gets a lease of its own from now.
            s->lease_end = std::min(s->deadline, absl::Now() + options_.reservation_lease);
            if (s->stream) StartDecoding(*s, n.first_token);
          }
        }
      });
    };
    spec.connected = [this, key = s->key] {
      Post([this, key] {
        for (auto& s : sequences_) {
          if (s->key == key) s->sender_connected = true;
        }
      });
    };
    // A prompt may wait in the prefill worker's queue: the receiver waits
    // for its first layer as long as the request may live, at most
    // max_prefill_wait.
    spec.first_layer_deadline = std::min(s->deadline, absl::Now() + options_.max_prefill_wait);
    absl::StatusOr<std::unique_ptr<kvtransfer::Inbound>> in = transport_->Expect(std::move(spec));
    if (!in.ok()) {
      PDQ_CHECK(kv_->RemoveSequence(s->seq).ok());
      kv_released_.push_back(s->request_id);
      done(in.status());
      return;
    }
    s->inbound = std::move(*in);
    LogLine(absl::StrCat("request ", s->request_id, ": reserved ", tokens, " tokens of KV for a ",
                         s->prompt_tokens, "-token prompt, ", hit, " of them cached"));
    sequences_.push_back(std::move(s));
    done(r);
  });
}

void Scheduler::Release(std::string reservation_id, std::function<void(absl::Status)> done) {
  Post([this, id = std::move(reservation_id), done = std::move(done)] {
    for (auto& s : sequences_) {
      if (s->reservation_id == id && !s->finished) {
        FinishSequence(*s, absl::CancelledError("the reservation was released"));
        done(absl::OkStatus());
        return;
      }
    }
    done(absl::NotFoundError(absl::StrCat("no reservation '", id, "'")));
  });
}

void Scheduler::Decode(std::string reservation_id, GenerationParams params,
                       std::shared_ptr<TokenStream> stream) {
  Post([this, id = std::move(reservation_id), params = std::move(params),
        stream = std::move(stream)]() mutable {
    for (auto& s : sequences_) {
      if (s->reservation_id != id || s->finished) continue;
      if (s->stream) {
        stream->Finish(absl::FailedPreconditionError("the reservation is already decoding"), {});
        return;
      }
      s->stream = std::move(stream);
      s->params = std::move(params);
      s->deadline = std::min(s->deadline, s->params.deadline);
      s->batch = s->params.batch;
      s->sampler = std::make_unique<Sampler>(s->params.sampling);
      s->text = std::make_unique<TextStream>(decode_->model().tokenizer(), s->params.stop);
      if (s->prefill_started) {
        // Prefilling (or prefilled) since the reservation, which drew or
        // draws the first token with the sampling it brought.
        if (s->params.resume) {
          FinishSequence(*s, absl::InvalidArgumentError(
                                 "a resumed stream's reservation cannot have started prefilling"));
          return;
        }
        if (!(s->params.sampling == s->first_sampling)) {
          FinishSequence(*s, absl::InvalidArgumentError(
                                 "the Decode call's sampling differs from its reservation's"));
          return;
        }
      } else {
        s->arrival = absl::Now();
      }
      if (s->params.resume_recomputed && !PrepareRecomputed(*s)) return;
      if (s->params.resume && !s->params.resume_recomputed && s->local_prefill) {
        FinishSequence(*s, absl::InvalidArgumentError(
                               "a moved stream's reservation must bring its KV, not prefill it"));
        return;
      }
      if (s->local_prefill && !s->prefill_started) {
        const int64_t missing = s->prompt_tokens - s->cached_tokens;
        if (queued_prompt_tokens_.load() + missing > options_.max_queued_prompt_tokens) {
          FinishSequence(*s, absl::ResourceExhaustedError("the prefill queue is full"));
          return;
        }
        s->first_sampling = s->params.sampling;
        QueueLocalPrefill(*s);
      } else if (s->stage == Stage::kAwaitingKv && s->kv_landed) {
        // Its KV landed, or its local prefill drew the first token.
        StartDecoding(*s, s->notice.first_token);
      }
      return;
    }
    stream->Finish(absl::NotFoundError(
                       absl::StrCat("no reservation '", id, "' (expired, released or never made)")),
                   {});
  });
}

void Scheduler::QueueLocalPrefill(Sequence& s) {
  s.stage = Stage::kQueued;
  s.prefilled = s.cached_tokens;
  s.prefill_started = true;
  queued_prompt_tokens_ += s.prompt_tokens - s.prefilled;
}

void Scheduler::Generate(std::vector<int32_t> prompt, GenerationParams params,
                         std::shared_ptr<TokenStream> stream) {
  Post([this, prompt = std::move(prompt), params = std::move(params),
        stream = std::move(stream)]() mutable {
    if (queued_prompt_tokens_.load() + (int64_t)prompt.size() > options_.max_queued_prompt_tokens) {
      stream->Finish(absl::ResourceExhaustedError("the prefill queue is full"), {});
      return;
    }
    const int64_t ctx = prefill_->model().config().max_context;
    const int64_t tokens = std::min(ctx, (int64_t)prompt.size() + params.max_tokens);
    auto s = std::make_unique<Sequence>();
    s->key = ++next_id_;
    s->kind = Kind::kBoth;
    s->request_id = params.request_id;
    s->batch = params.batch;
    s->seq = kv_->AddSequence();
    s->arrival = absl::Now();
    s->deadline = params.deadline;
    s->prompt_tokens = (int64_t)prompt.size();
    s->tokens = std::move(prompt);
    s->cache_seed = kv_->PrefixSeed(params.cache_salt);
    s->prefilled = AttachCachedPrefix(*s, s->prompt_tokens - 1, prefill_writer());
    if (absl::Status r = kv_->Reserve(s->seq, tokens); !r.ok()) {
      PDQ_CHECK(kv_->RemoveSequence(s->seq).ok());
      stream->Finish(r, {});
      return;
    }
    kv_taken_.push_back(s->request_id);
    s->kv_listed = true;
    s->first_sampling = params.sampling;
    s->stream = std::move(stream);
    s->params = std::move(params);
    s->sampler = std::make_unique<Sampler>(s->params.sampling);
    s->text = std::make_unique<TextStream>(decode_->model().tokenizer(), s->params.stop);
    queued_prompt_tokens_ += s->prompt_tokens - s->prefilled;
    if (s->params.resume && !s->params.resume_recomputed) {
      FinishSequence(*s, absl::InvalidArgumentError("a moved stream needs a reservation"));
      sequences_.push_back(std::move(s));
      return;
    }
    if (s->params.resume_recomputed && !PrepareRecomputed(*s)) {
      sequences_.push_back(std::move(s));
      return;
    }
    LogLine(absl::StrCat("request ", s->request_id, ": queued ", s->prompt_tokens,
                         " prompt tokens (prefill and decode here), ", s->prefilled, " cached"));
    sequences_.push_back(std::move(s));
  });
}

void Scheduler::Prefill(PrefillArgs args, std::shared_ptr<PrefillCall> call) {
  Post([this, args = std::move(args), call = std::move(call)]() mutable {
    if (queued_prompt_tokens_.load() + (int64_t)args.prompt.size() >
        options_.max_queued_prompt_tokens) {
      call->Finish(absl::ResourceExhaustedError("the prefill queue is full"));
      return;
    }
    const int64_t bt = kv_->layout().block_tokens;
    if (args.decode_cached_tokens < 0 || args.decode_cached_tokens % bt != 0 ||
        args.decode_cached_tokens >= (int64_t)args.prompt.size()) {
      call->Finish(absl::InvalidArgumentError(
          absl::StrCat("decode_cached_tokens ", args.decode_cached_tokens, " is not a multiple of ",
                       bt, " below the prompt's ", args.prompt.size(), " tokens")));
      return;
    }
    auto s = std::make_unique<Sequence>();
    s->key = ++next_id_;
    s->kind = Kind::kPrefillOnly;
    s->request_id = args.request_id;
    s->batch = args.batch;
    s->seq = kv_->AddSequence();
    s->arrival = absl::Now();
    s->deadline = args.deadline;
    s->prompt_tokens = (int64_t)args.prompt.size();
    s->tokens = std::move(args.prompt);
    s->skip_tokens = args.decode_cached_tokens;
    s->cache_seed = kv_->PrefixSeed(args.cache_salt);
    s->prefilled = AttachCachedPrefix(*s, s->prompt_tokens - 1, prefill_writer());
    if (absl::Status r = kv_->Reserve(s->seq, s->prompt_tokens); !r.ok()) {
      PDQ_CHECK(kv_->RemoveSequence(s->seq).ok());
      call->Finish(r);
      return;
    }
    s->first_sampling = args.sampling;
    s->first_skip = args.skip_samples;
    s->call = std::move(call);
    // The connection and handshake run while the prompt waits and computes.
    s->outbound = transport_->Connect(
        args.kv_address, args.transfer_token, args.deadline, [this, key = s->key](absl::Status st) {
          Post([this, key, st] {
            for (auto& s : sequences_) {
              if (s->key != key || s->finished) continue;
              if (!st.ok()) {
                FinishSequence(*s, absl::UnavailableError(absl::StrCat(
                                       "KV transfer to decode failed: ", st.message())));
              } else {
                FinishSequence(*s, absl::OkStatus());
              }
            }
          });
        });
    queued_prompt_tokens_ += s->prompt_tokens - s->prefilled;
    LogLine(absl::StrCat("request ", s->request_id, ": queued ", s->prompt_tokens,
                         " prompt tokens for prefill (", s->prefilled, " cached here, ",
                         s->skip_tokens, " held there), KV to ", args.kv_address));
    sequences_.push_back(std::move(s));
  });
}

void Scheduler::StartDecoding(Sequence& s, int32_t token) {
  s.stage = Stage::kDecoding;
  if (!s.params.resume || s.params.resume_recomputed) {
    s.sampler->SkipSamples(1);  // the prefill drew the first token
    EmitToken(s, token);
    return;
  }
  // A migrated stream: the source sent `token` to the client already, and
  // the KV holds everything before it.
  const std::vector<int32_t>& sent = s.params.resume_generated;
  if (sent.empty() || sent.back() != token || (int64_t)sent.size() >= s.params.max_tokens) {
    FinishSequence(s, absl::InvalidArgumentError(absl::StrCat(
                          "a resumed stream's last sent token (", sent.empty() ? -1 : sent.back(),
                          ") is not the one its KV notice brings (", token, ")")));
    return;
  }
  if (!ReplaySent(s)) return;
  s.last_token = token;
  if (!s.tokens.empty()) s.tokens.push_back(token);
  s.first_token_time = s.last_token_time = absl::Now();
  s.emitted = true;
  LogLine(absl::StrCat("request ", s.request_id, ": migrated here; decoding on after ", s.generated,
                       " tokens"));
}

bool Scheduler::ReplaySent(Sequence& s) {
  const std::vector<int32_t>& sent = s.params.resume_generated;
  s.sampler->SkipSamples((int)sent.size());
  for (int32_t t : sent) {
    if (absl::StatusOr<std::string> text = s.text->Push(t); !text.ok()) {
      FinishSequence(s, text.status());
      return false;
    }
  }
  s.generated = (int64_t)sent.size();
  s.summary_prompt_tokens = s.params.resume_prompt_tokens;
  return true;
}

bool Scheduler::PrepareRecomputed(Sequence& s) {
  const std::vector<int32_t>& sent = s.params.resume_generated;
  const int64_t original = s.params.resume_prompt_tokens;
  if (sent.empty() || (int64_t)sent.size() >= s.params.max_tokens || original < 1 ||
      original + (int64_t)sent.size() != s.prompt_tokens ||
      (!s.tokens.empty() && !std::equal(sent.begin(), sent.end(), s.tokens.begin() + original))) {
    FinishSequence(s, absl::InvalidArgumentError(
                          "a recomputed stream's prompt must be its original prompt followed by "
                          "every token sent, fewer than max_tokens"));
    return false;
  }
  if (!ReplaySent(s)) return false;
  LogLine(absl::StrCat("request ", s.request_id, ": recomputed here after ", s.generated,
                       " tokens sent elsewhere"));
  return true;
}

absl::StatusOr<Scheduler::Sequence*> Scheduler::MigratingSequence(const std::string& request_id,
                                                                  const std::string& key) {
  for (auto& s : sequences_) {
    if (s->finished || s->request_id != request_id || !s->stream) continue;
    // (Compared in constant time: the key is the stream's only guard
    // where the worker's port is reachable without a certificate.)
    const std::string& want = s->params.stream_key;
    unsigned char diff = want.size() != key.size() || want.empty();
    for (size_t i = 0; i < want.size() && i < key.size(); ++i) diff |= want[i] ^ key[i];
    if (diff != 0) {
      return absl::PermissionDeniedError(
          absl::StrCat("request ", request_id, ": the stream key does not match"));
    }
    if (transport_ == nullptr) {
      return absl::FailedPreconditionError("this worker has no KV transport to migrate with");
    }
    if (s->stage != Stage::kDecoding) {
      return absl::FailedPreconditionError(
          absl::StrCat("request ", request_id, " is not decoding yet"));
    }
    if ((int64_t)s->tokens.size() != *kv_->Length(s->seq) + 1) {
      return absl::FailedPreconditionError(
          absl::StrCat("request ", request_id, " was reserved without its prompt's ids"));
    }
    return s.get();
  }
  return absl::NotFoundError(absl::StrCat("no stream for request '", request_id, "' here"));
}

void Scheduler::Suspend(std::string request_id, std::string key,
                        std::function<void(absl::StatusOr<Suspended>)> done) {
  Post([this, id = std::move(request_id), key = std::move(key), done = std::move(done)] {
    absl::StatusOr<Sequence*> found = MigratingSequence(id, key);
    if (!found.ok()) return done(found.status());
    Sequence& s = **found;
    if (s.migration) return done(absl::FailedPreconditionError("its KV is being sent already"));
    s.suspended = true;
    s.suspend_end = absl::Now() + options_.migration_lease;
    Suspended out;
    out.tokens = s.tokens;
    out.kv_tokens = *kv_->Length(s.seq);
    out.prompt_tokens = s.summary_prompt_tokens >= 0 ? s.summary_prompt_tokens : s.prompt_tokens;
    out.lease = options_.migration_lease;
    // The prompt's KV came from the prefill (kv_writer; this worker's own
    // precision for role both), the rest from this worker's decode.
    const std::string prompt_writer = s.kind == Kind::kBoth ? prefill_writer() : s.kv_writer;
    out.kv_writer = prompt_writer == decode_writer() ? decode_writer() : "mixed";
    LogLine(absl::StrCat("request ", id, ": suspended for migration after ", s.generated,
                         " tokens (", out.kv_tokens, " tokens of KV)"));
    done(std::move(out));
  });
}

void Scheduler::SendKv(std::string request_id, std::string key, MigrationTarget target,
                       std::function<void(absl::StatusOr<KvSent>)> done) {
  Post([this, id = std::move(request_id), key = std::move(key), target = std::move(target),
        done = std::move(done)]() mutable {
    absl::StatusOr<Sequence*> found = MigratingSequence(id, key);
    if (!found.ok()) return done(found.status());
    Sequence& s = **found;
    if (!s.suspended || s.migration) {
      return done(absl::FailedPreconditionError("suspend the stream first (once)"));
    }
    const int64_t bt = kv_->layout().block_tokens;
    const int64_t tokens = *kv_->Length(s.seq);
    if (target.cached_tokens < 0 || target.cached_tokens % bt != 0 ||
        target.cached_tokens >= tokens) {
      return done(absl::InvalidArgumentError(
          absl::StrCat("target_cached_tokens ", target.cached_tokens, " is not a multiple of ", bt,
                       " below the ", tokens, " tokens of KV")));
    }
    s.migration = std::move(done);
    s.migration_start = absl::Now();
    s.suspend_end = absl::InfiniteFuture();  // the transfer decides now
    // A target that stops answering fails the move within the lease, and
    // the stream decodes on here.
    s.outbound = transport_->Connect(
        target.kv_address, target.transfer_token,
        std::min(s.deadline, absl::Now() + options_.migration_lease),
        [this, key = s.key](absl::Status st) {
          Post([this, key, st] {
            for (auto& sp : sequences_) {
              Sequence& q = *sp;
              if (q.key != key || q.finished || !q.migration) continue;
              auto reply = std::move(q.migration);
              q.migration = nullptr;
              q.outbound.reset();
              if (!st.ok()) {
                // The target did not take it: decode on here.
                q.suspended = false;
                LogLine(absl::StrCat("request ", q.request_id,
                                     ": migration failed, decoding on here: ", st.message()));
                reply(absl::UnavailableError(
                    absl::StrCat("sending the KV to the target failed: ", st.message())));
                return;
              }
              KvSent sent{Seconds(absl::Now() - q.migration_start), q.migration_bytes};
              WorkMetrics::Get().kv_sent.Add(double(sent.bytes));
              LogLine(absl::StrFormat(
                  "request %s: migrated after %d tokens: %d bytes of KV sent and verified in "
                  "%.1f ms",
                  q.request_id, q.generated, sent.bytes, sent.seconds * 1e3));
              q.stream->Finish(absl::AbortedError("migrated to another decode worker"), {});
              q.stream = nullptr;
              FinishSequence(q, absl::OkStatus());
              reply(sent);
              return;
            }
          });
        });
    for (int l = 0; l < kv_->layout().num_layers; ++l) {
      std::vector<KvSpan> spans = *kv_->LayerSpans(s.seq, l, tokens);
      spans.erase(spans.begin(), spans.begin() + 2 * (target.cached_tokens / bt));
      s.migration_bytes += SpanBytes(spans);
      s.outbound->PostLayer(l, std::move(spans));
    }
    s.outbound->PostDone({s.last_token, tokens, 0});
  });
}

void Scheduler::Resume(std::string request_id, std::string key,
                       std::function<void(absl::Status)> done) {
  Post([this, id = std::move(request_id), key = std::move(key), done = std::move(done)] {
    absl::StatusOr<Sequence*> found = MigratingSequence(id, key);
    if (!found.ok()) return done(found.status());
    Sequence& s = **found;
    if (s.migration) return done(absl::FailedPreconditionError("its KV is being sent"));
    if (s.suspended) {
      s.suspended = false;
      LogLine(absl::StrCat("request ", id, ": not migrated; decoding on here"));
    }
    done(absl::OkStatus());
  });
}

// ---- The loop ---------------------------------------------------------------

void Scheduler::Loop() {
  absl::Time next_wake = absl::InfiniteFuture();
  bool busy = false;
  for (;;) {
    std::deque<std::function<void()>> commands;
    bool stopping;
    {
      std::unique_lock lock(mu_);
      auto ready = [&] { return stopping_ || wake_ || !commands_.empty(); };
      if (!busy) {
        if (next_wake == absl::InfiniteFuture()) {
          cv_.wait(lock, ready);
        } else {
          cv_.wait_until(lock, absl::ToChronoTime(next_wake), ready);
        }
      }
      commands.swap(commands_);
      wake_ = false;
      stopping = stopping_;
    }
    const absl::Time iteration_start = absl::Now();
    for (auto& c : commands) c();
    if (stopping) break;
    next_wake = absl::InfiniteFuture();
    Housekeeping(absl::Now(), &next_wake);
    last_step_ = {};
    Step();
    std::erase_if(sequences_, [](const auto& s) { return s->finished; });
    busy = false;
    for (const auto& s : sequences_) {
      busy |= s->stage == Stage::kQueued ||
              (s->stage == Stage::kDecoding && s->paused_since == absl::InfiniteFuture() &&
               !s->suspended);
    }
    UpdateLoad();
    if (last_step_.rows > 0) {
      WorkMetrics::Get().decode_step_overhead.Add(
          std::max(0.0, Seconds(absl::Now() - iteration_start) - last_step_.pass_seconds));
    }
  }
  for (;;) {
    for (auto& s : sequences_) {
      if (!s->finished) FinishSequence(*s, absl::UnavailableError("the worker is shutting down"));
    }
    sequences_.clear();
    // Transport callbacks may still have queued commands; answer them too.
    std::deque<std::function<void()>> commands;
    {
      std::lock_guard lock(mu_);
      commands.swap(commands_);
    }
    if (commands.empty()) break;
    for (auto& c : commands) c();
  }
}

void Scheduler::Housekeeping(absl::Time now, absl::Time* next_wake) {
  for (auto& sp : sequences_) {
    Sequence& s = *sp;
    if (s.finished) continue;
    if ((s.stream && s.stream->Cancelled()) || (s.call && s.call->Cancelled())) {
      FinishSequence(s, absl::CancelledError("the request was cancelled"));
      continue;
    }
    if (now >= s.deadline) {
      FinishSequence(s, absl::DeadlineExceededError("the request's deadline passed"));
      continue;
    }
    if (s.stage == Stage::kAwaitingKv && !s.kv_landed && !s.sender_connected &&
        now >= s.lease_end) {
      FinishSequence(
          s, absl::UnavailableError("the KV did not arrive within the reservation's lease"));
      continue;
    }
    if (s.stage == Stage::kAwaitingKv && s.kv_landed && !s.stream && now >= s.lease_end) {
      FinishSequence(s, absl::UnavailableError("no Decode call came for the reservation"));
      continue;
    }
    if (s.suspended && !s.migration) {
      if (now >= s.suspend_end) {
        s.suspended = false;
        LogLine(absl::StrCat("request ", s.request_id,
                             ": no migration came within its lease; decoding on here"));
      } else {
        *next_wake = std::min(*next_wake, s.suspend_end);
      }
    }
    if (s.stage == Stage::kDecoding) {
      if (s.stream->Unsent() >= options_.max_unsent_tokens) {
        if (s.paused_since == absl::InfiniteFuture()) s.paused_since = now;
        if (now - s.paused_since >= options_.stalled_stream_timeout) {
          FinishSequence(s, absl::ResourceExhaustedError(absl::StrCat(
                                "the client took no tokens for ",
                                absl::FormatDuration(options_.stalled_stream_timeout))));
          continue;
        }
        *next_wake = std::min(*next_wake, s.paused_since + options_.stalled_stream_timeout);
      } else {
        s.paused_since = absl::InfiniteFuture();
      }
    }
    *next_wake = std::min(*next_wake, s.deadline);
    // (A reservation whose sender is connected waits on the transport.)
    if (s.stage == Stage::kAwaitingKv && (s.kv_landed || !s.sender_connected)) {
      *next_wake = std::min(*next_wake, s.lease_end);
    }
  }
}

void Scheduler::Step() {
  const absl::Time step_start = absl::Now();
  // What this step computes: the decode rows and prompt chunks of
  // policy::FormStep (policy/batch.h: the simulator forms steps with it too).
  const bool fused = prefill_context() == decode_;
  std::vector<policy::StreamView> views(sequences_.size());
  for (size_t i = 0; i < sequences_.size(); ++i) {
    const Sequence& s = *sequences_[i];
    policy::StreamView& v = views[i];
    if (s.finished) continue;
    if (s.stage == Stage::kQueued) v.stage = policy::StreamView::Stage::kPrompt;
    if (s.stage == Stage::kDecoding && s.paused_since == absl::InfiniteFuture() && !s.suspended) {
      v.stage = policy::StreamView::Stage::kDecoding;
      v.kv_tokens = *kv_->Length(s.seq);
    }
    v.batch_priority = s.batch;
    v.prefilled = s.prefilled;
    v.prompt_tokens = s.prompt_tokens;
  }
  policy::BatchOptions options;
  options.max_decode_batch = options_.max_decode_batch;
  options.token_budget = options_.prefill_token_budget;
  options.tpot_target = Seconds(options_.tpot_target);
  options.prompt_share = options_.prompt_share;
  options.block_tokens = kv_->layout().block_tokens;
  options.fused = fused;
  const policy::StepComposition c =
      policy::FormStep(views, options, fused ? decode_cost_ : prefill_cost_, decode_cost_);
  if (c.rows.empty() && c.prompts.empty()) return;
  const policy::StepPlan& plan = c.plan;
  std::vector<Sequence*> rows, queued;
  for (size_t i : c.rows) rows.push_back(sequences_[i].get());
  for (size_t i : c.prompts) queued.push_back(sequences_[i].get());
  std::vector<Chunk> chunks;
  for (size_t i = 0; i < queued.size(); ++i) {
    Sequence& s = *queued[i];
    const int64_t n = c.chunk[i];
    if (n > 0) chunks.push_back({&s, n, s.prefilled + n == s.prompt_tokens});
  }
  std::optional<StepTrace> trace;
  if (options_.step_observer) trace = TraceStep(views, rows, chunks);
  // The ones that ran go to the back, so a full batch rotates fairly.
  policy::RanToBack(sequences_, c.rows);
  if (!rows.empty()) {
    step_stats_.decode_steps += 1;
    step_stats_.bounded_steps += plan.bounded;
    step_stats_.max_prefill_tokens_with_decode =
        std::max(step_stats_.max_prefill_tokens_with_decode.load(), plan.prefill_tokens);
  }
  double pass_seconds = 0, prompt_seconds = 0;
  if (fused) {
    pass_seconds = RunPass(decode_, decode_cost_, chunks, rows);
  } else {
    // Two models: the prompt chunk first (the plan left the decode pass
    // its time), then the decode rows.
    if (!chunks.empty()) prompt_seconds = RunPass(prefill_context(), prefill_cost_, chunks, {});
    if (!rows.empty()) pass_seconds = RunPass(decode_, decode_cost_, {}, rows);
  }
  last_step_ = {(int64_t)rows.size(), pass_seconds + prompt_seconds};
  if (trace) {
    trace->pass_seconds = pass_seconds;
    trace->prompt_seconds = prompt_seconds;
    options_.step_observer(*trace);
  }
  // What the steps did, in the log every 10 s of steps with both kinds of
  // work: how prompts and decoding shared them, and how well the cost model
  // predicted them.
  const double took = Seconds(absl::Now() - step_start);
  if (!queued.empty() && !rows.empty()) {
    StepLog& g = step_log_;
    ++g.steps;
    g.rows += (int64_t)rows.size();
    g.prompt_tokens += plan.prefill_tokens;
    g.bounded += plan.bounded;
    g.predicted += plan.predicted_seconds;
    g.target += plan.target_seconds;
    g.seconds += took;
    g.longest = std::max(g.longest, took);
    if (g.seconds >= 10) {
      LogLine(absl::StrFormat(
          "steps while prompts waited and streams decoded: %d in %.1f s, %.1f decode rows and "
          "%.0f prompt tokens a step, %.0f%% cut short by the target (%.1f ms on average); "
          "step %.1f ms on "
          "average (predicted %.1f), longest %.1f ms; cost model: prompt pass %s%s",
          g.steps, g.seconds, double(g.rows) / g.steps, double(g.prompt_tokens) / g.steps,
          100.0 * g.bounded / g.steps, g.target / g.steps * 1e3, g.seconds / g.steps * 1e3,
          g.predicted / g.steps * 1e3, g.longest * 1e3,
          (fused ? decode_cost_ : prefill_cost_).Describe(),
          fused ? "" : absl::StrCat(", decode pass ", decode_cost_.Describe())));
      g = StepLog{};
    }
  }
  // The prefill rate while prompts wait, decode steps included: what the
  // router predicts a new prompt's time to its first token from.
  if (!queued.empty()) {
    rate_tokens_ += plan.prefill_tokens;
    rate_seconds_ += took;
    if (rate_seconds_ >= 0.5) {
      const double rate = double(rate_tokens_) / rate_seconds_;
      const double old = prefill_rate_.load();
      prefill_rate_ = old == 0 ? rate : 0.5 * old + 0.5 * rate;
      rate_tokens_ = 0;
      rate_seconds_ = 0;
    }
  }
}

StepTrace Scheduler::TraceStep(const std::vector<policy::StreamView>& views,
                               const std::vector<Sequence*>& rows,
                               const std::vector<Chunk>& chunks) const {
  StepTrace t;
  t.fused = prefill_context() == decode_;
  for (size_t i = 0; i < sequences_.size(); ++i) {
    if (!sequences_[i]->finished) t.streams.push_back({sequences_[i]->request_id, views[i]});
  }
  for (const Sequence* s : rows) t.rows.push_back(s->request_id);
  for (const Chunk& c : chunks) t.chunks.emplace_back(c.s->request_id, c.n);
  return t;
}

double Scheduler::RunPass(Context* ctx, policy::StepCostModel& cost,
                          const std::vector<Chunk>& chunks, const std::vector<Sequence*>& rows) {
  if (chunks.empty() && rows.empty()) return 0;
  const std::string writer = PrecisionName(ctx->model().precision());
  const int64_t bt = kv_->layout().block_tokens;
  // Decode rows first (one token each), then the prompt chunks.
  std::vector<BatchEntry> batch;
  policy::StepWork work;
  step_tokens_.resize(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    step_tokens_[i] = rows[i]->last_token;
    batch.push_back({rows[i]->seq, {&step_tokens_[i], 1}, 1});
    work.AddDecodeRow(*kv_->Length(rows[i]->seq));
  }
  for (const Chunk& c : chunks) {
    if (c.s->prefilled == c.s->cached_tokens) c.s->compute_start = absl::Now();
    batch.push_back({c.s->seq, std::span<const int32_t>(c.s->tokens).subspan(c.s->prefilled, c.n),
                     c.last ? 1 : 0, /*prompt=*/true});
    work.AddChunk(c.s->prefilled, c.n);
  }
  // Each finished layer of a prompt's last chunk goes to its decode worker
  // while the next layers compute.
  const bool sends = std::any_of(chunks.begin(), chunks.end(),
                                 [](const Chunk& c) { return c.last && c.s->outbound; });
  if (sends) {
    ctx->SetLayerObserver([&](int layer) {
      for (const Chunk& c : chunks) {
        if (c.last && c.s->outbound) {
          std::vector<KvSpan> spans = *kv_->LayerSpans(c.s->seq, layer, c.s->prompt_tokens);
          // Blocks the receiver holds already are not sent.
          spans.erase(spans.begin(), spans.begin() + 2 * (c.s->skip_tokens / bt));
          WorkMetrics::Get().kv_sent.Add(double(SpanBytes(spans)));
          c.s->outbound->PostLayer(layer, std::move(spans));
        }
      }
    });
  }
  // What the decode rows read: the weights once, and each row's KV.
  const KvLayout& layout = kv_->layout();
  const double kv_bytes_per_token =
      double(layout.block_bytes()) / layout.block_tokens * layout.num_layers;
  double bytes = double(ctx->model().weight_bytes_per_token());
  for (Sequence* s : rows) bytes += kv_bytes_per_token * double(*kv_->Length(s->seq) + 1);

  const absl::Time start = absl::Now();
  const absl::Status all = ctx->Forward(*kv_, batch, &logits_);
  const double seconds = Seconds(absl::Now() - start);
  if (sends) ctx->SetLayerObserver(nullptr);
  if (all.ok()) cost.Observe(work, seconds);
  WorkMetrics& wm = WorkMetrics::Get();
  if (!chunks.empty()) {
    wm.prefill_busy.Add(seconds);
    wm.prefill_passes.Add();
    double ops = 0;
    for (const Chunk& c : chunks) {
      ops += ctx->model().config().ForwardFlops(c.s->prefilled, c.n, c.last ? 1 : 0);
    }
    wm.prefill_ops.Add(ops);
  }
  if (!rows.empty()) {
    wm.decode_bytes.Add(bytes);
    wm.decode_step_seconds.Observe(seconds);
    wm.decode_steps.Add();
    wm.decode_step_rows.Add(double(rows.size()));
    wm.step_prefill_tokens.Observe(double(work.prefill_tokens));
  }
  for (size_t i = 0; i < rows.size(); ++i) {
    const absl::Status& st = all.ok() ? logits_.status[i] : all;
    if (!st.ok()) {
      FinishSequence(*rows[i], st);
      continue;
    }
    EmitToken(*rows[i], rows[i]->sampler->Sample(logits_.Row(i, 0), logits_.vocab_size));
  }
  for (size_t j = 0; j < chunks.size(); ++j) {
    const size_t i = rows.size() + j;
    Sequence& s = *chunks[j].s;
    const absl::Status& st = all.ok() ? logits_.status[i] : all;
    if (!st.ok()) {
      FinishSequence(s, st);
      continue;
    }
    s.prefilled += chunks[j].n;
    queued_prompt_tokens_ -= chunks[j].n;
    wm.prefill_tokens.Add(double(chunks[j].n));
    if (!chunks[j].last) continue;
    s.compute_end = absl::Now();
    wm.prefill_seconds.Observe(Seconds(s.compute_end - s.compute_start));
    CacheBlocks(s, writer);
    Sampler first(s.first_sampling);
    first.SkipSamples((int)s.first_skip);
    // (A stream's own sampler draws it; without one, a prefill's sampling.)
    const int32_t token = s.kind != Kind::kPrefillOnly && s.stream
                              ? s.sampler->Sample(logits_.Row(i, 0), logits_.vocab_size)
                              : first.Sample(logits_.Row(i, 0), logits_.vocab_size);
    if (s.kind == Kind::kPrefillOnly) {
      s.first_token = token;
      s.stage = Stage::kSending;
      s.outbound->PostDone({token, s.prompt_tokens, 0});
    } else if (!s.stream) {
      // A local prefill started with its reservation: the token waits for
      // the Decode call, as a transfer's first token does.
      s.stage = Stage::kAwaitingKv;
      s.notice.first_token = token;
      s.lease_end = std::min(s.deadline, absl::Now() + options_.reservation_lease);
      Wake();  // one more turn of the loop, whose housekeeping waits for the lease
    } else {
      s.stage = Stage::kDecoding;
      EmitToken(s, token);
    }
  }
  return seconds;
}

void Scheduler::EmitToken(Sequence& s, int32_t token) {
  const absl::Time now = absl::Now();
  if (!s.emitted) {
    s.first_token_time = now;
    s.emitted = true;
  }
  const Tokenizer& tok = decode_->model().tokenizer();
  const GenerationParams& p = s.params;
  FinishReason reason = FinishReason::kLength;
  bool done = false;
  if ((!p.ignore_eos && tok.IsEndOfGeneration(token)) ||
      std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), token) !=
          p.stop_token_ids.end()) {
    reason =
        tok.IsEndOfGeneration(token) && !p.ignore_eos ? FinishReason::kEos : FinishReason::kStop;
    done = true;
  } else {
    ++s.generated;
    s.last_token = token;
    // (A reservation made without the prompt's ids caches nothing: its
    // tokens would not name its KV.)
    if (!s.tokens.empty()) s.tokens.push_back(token);
    s.last_token_time = now;
    absl::StatusOr<std::string> text = s.text->Push(token);
    if (!text.ok()) {
      FinishSequence(s, text.status());
      return;
    }
    std::string piece = std::move(*text);
    if (s.text->stopped()) {
      reason = FinishReason::kStop;
      done = true;
    } else if (s.generated >= p.max_tokens) {
      reason = FinishReason::kLength;
      done = true;
    } else if (*kv_->Length(s.seq) + 1 > decode_->model().config().max_context) {
      reason = FinishReason::kContextFull;
      done = true;
    }
    if (done && !s.text->stopped()) piece += s.text->Finish();
    s.stream->Send({token}, piece);
    WorkMetrics::Get().generated_tokens.Add();
  }
  if (!done) return;
  const absl::Time finishing = absl::Now();
  Summary sum;
  sum.reason = reason;
  sum.prompt_tokens = s.summary_prompt_tokens >= 0 ? s.summary_prompt_tokens : s.prompt_tokens;
  sum.output_tokens = s.generated;
  sum.cached_tokens = s.cached_tokens;
  sum.ttft_seconds = Seconds(s.first_token_time - s.arrival);
  sum.mean_tpot_seconds =
      s.generated > 1 ? Seconds(s.last_token_time - s.first_token_time) / (s.generated - 1) : 0.0;
  LogLine(
      absl::StrFormat("request %s: finished (%s), %d prompt + %d output tokens, ttft %.1f ms, "
                      "tpot %.1f ms",
                      s.request_id, ReasonName(reason), sum.prompt_tokens, s.generated,
                      sum.ttft_seconds * 1e3, sum.mean_tpot_seconds * 1e3));
  s.stream->Finish(absl::OkStatus(), sum);
  s.stream = nullptr;
  FinishSequence(s, absl::OkStatus());
  WorkMetrics& wm = WorkMetrics::Get();
  wm.streams_finished.Add();
  wm.stream_finish_seconds.Add(Seconds(absl::Now() - finishing));
}

void Scheduler::FinishSequence(Sequence& s, const absl::Status& status) {
  if (s.finished) return;
  s.finished = true;
  if (s.stage == Stage::kQueued) queued_prompt_tokens_ -= s.prompt_tokens - s.prefilled;
  // Abort transfers first: once the handles are gone nothing touches the
  // blocks, and only then do they return to the pool.
  s.inbound.reset();
  s.outbound.reset();
  if (s.migration) {
    auto reply = std::move(s.migration);
    s.migration = nullptr;
    reply(absl::Status(status.ok() ? absl::StatusCode::kAborted : status.code(),
                       absl::StrCat("the stream ended before its KV was sent: ",
                                    status.ok() ? "finished" : status.message())));
  }
  if (s.stream) {
    LogLine(absl::StrCat("request ", s.request_id, ": ", status.ToString()));
    s.stream->Finish(status.ok() ? absl::InternalError("finished without a summary") : status, {});
    s.stream = nullptr;
  }
  if (s.call) {
    if (status.ok()) {
      PrefillResult r;
      r.first_token = s.first_token;
      r.prompt_tokens = s.prompt_tokens;
      r.cached_tokens = s.cached_tokens;
      r.prefill_seconds = Seconds(s.compute_end - s.compute_start);
      r.transfer_seconds = Seconds(absl::Now() - s.compute_end);
      WorkMetrics::Get().kv_transfer_seconds.Observe(r.transfer_seconds);
      LogLine(absl::StrFormat(
          "request %s: prefilled %d tokens in %.1f ms, KV acknowledged %.1f ms "
          "after compute",
          s.request_id, s.prompt_tokens, r.prefill_seconds * 1e3, r.transfer_seconds * 1e3));
      s.call->Finish(r);
    } else {
      LogLine(absl::StrCat("request ", s.request_id, ": prefill failed: ", status.ToString()));
      s.call->Finish(status);
    }
    s.call = nullptr;
  } else if (s.kind == Kind::kDecodeReservation && !status.ok()) {
    LogLine(absl::StrCat("request ", s.request_id, ": reservation freed: ", status.message()));
  }
  // What the sequence stored stays reusable (tokens up to its length only:
  // a failed or cut transfer or forward pass never moved it).
  if (s.kind != Kind::kPrefillOnly) {
    CacheBlocks(s, s.stage == Stage::kQueued ? prefill_writer() : decode_writer());
  }
  PDQ_CHECK(kv_->RemoveSequence(s.seq).ok());
  if (s.kv_listed) kv_released_.push_back(s.request_id);
}

int64_t Scheduler::AttachCachedPrefix(Sequence& s, int64_t max_tokens, const std::string& writer) {
  if (!options_.prefix_cache || s.tokens.empty()) return 0;
  CacheMetrics m(options_.pool);
  m.lookups.Add();
  m.lookup_tokens.Add(double(s.prompt_tokens));
  const std::span<const int32_t> prompt(s.tokens.data(), (size_t)s.prompt_tokens);
  const int64_t hit = *kv_->AttachPrefix(s.seq, prompt, s.cache_seed, max_tokens,
                                         options_.reuse_any_precision ? "" : writer);
  s.cached_tokens = hit;
  if (hit > 0) {
    const int64_t bt = kv_->layout().block_tokens;
    std::span<const int32_t> blocks = *kv_->BlockTable(s.seq);
    for (int64_t b = 0; b < hit / bt; ++b) {
      m.hit_tokens(std::string(kv_->BlockWriter(blocks[b]))).Add(double(bt));
    }
  }
  return hit;
}

void Scheduler::CacheBlocks(Sequence& s, const std::string& writer) {
  if (!options_.prefix_cache || s.tokens.empty()) return;
  PDQ_CHECK(kv_->CachePrefix(s.seq, s.tokens, s.cache_seed, writer).ok());
}

std::string Scheduler::prefill_writer() const {
  return PrecisionName(prefill_context()->model().precision());
}

std::string Scheduler::decode_writer() const {
  return decode_ != nullptr ? PrecisionName(decode_->model().precision()) : prefill_writer();
}

void Scheduler::PublishCacheEvents() {
  PrefixEvents e = kv_->TakePrefixEvents();
  if (e.stored.empty() && e.removed.empty() && !e.overflowed) return;
  std::lock_guard lock(cache_mu_);
  if (e.overflowed) {
    const std::vector<uint64_t> all = kv_->CachedHashes();
    cached_hashes_ = absl::flat_hash_set<uint64_t>(all.begin(), all.end());
    for (auto& [name, p] : pending_) p.full = true;
    return;
  }
  for (uint64_t h : e.removed) cached_hashes_.erase(h);
  for (uint64_t h : e.stored) cached_hashes_.insert(h);
  // Net changes (disjoint lists), netted again against what is pending for
  // each router.
  for (auto& [name, p] : pending_) {
    if (p.full) continue;
    for (uint64_t h : e.removed) {
      if (p.stored.erase(h) == 0) p.removed.insert(h);
    }
    for (uint64_t h : e.stored) {
      if (p.removed.erase(h) == 0) p.stored.insert(h);
    }
    if (p.stored.size() + p.removed.size() > (1 << 16)) {
      p.full = true;
      p.stored.clear();
      p.removed.clear();
    }
  }
}

CacheUpdate Scheduler::TakeCacheUpdate(const std::string& router, bool want_full) {
  std::lock_guard lock(cache_mu_);
  CacheUpdate out;
  // A router heard of for the first time gets the whole set.
  auto [it, added] = pending_.try_emplace(router);
  PendingCacheUpdate& p = it->second;
  if (added) {
    // It heard of none of the requests the last sample counts as taken:
    // all of them (its own in-flight requests among them leave its books;
    // later takes come as usual), with that sample's counts below.
    p.kv_taken.assign(sampled_ids_.begin(), sampled_ids_.end());
  }
  if (want_full || p.full) {
    out.full = true;
    out.stored.assign(cached_hashes_.begin(), cached_hashes_.end());
  } else {
    out.stored.assign(p.stored.begin(), p.stored.end());
    out.removed.assign(p.removed.begin(), p.removed.end());
  }
  out.kv_taken = std::move(p.kv_taken);
  out.kv_released = std::move(p.kv_released);
  // Without a sample since its last update: the last one again, whose
  // lists went with that update (never the latest load, whose lists a
  // later update brings).
  out.kv_blocks_free = p.kv_blocks_free >= 0 ? p.kv_blocks_free : sampled_free_;
  out.sequences_held = p.sequences_held >= 0 ? p.sequences_held : sampled_held_;
  p = PendingCacheUpdate{};
  p.full = false;
  return out;
}

void Scheduler::ForgetCacheRouter(const std::string& router) {
  std::lock_guard lock(cache_mu_);
  pending_.erase(router);
}

void Scheduler::UpdateLoad() {
  PublishCacheEvents();
  kv_blocks_free_ = kv_->num_free_blocks();
  {
    // The free blocks, the requests they count as taken and the sequences
    // holding them, together, for the routers' books (a bounded list: a
    // router that stops taking its updates keeps only the first ones, and
    // its books err towards full).
    int64_t held = 0;
    for (const auto& s : sequences_) held += !s->finished && s->kind != Kind::kPrefillOnly;
    sequences_held_ = held;
    std::lock_guard lock(cache_mu_);
    for (auto& [name, p] : pending_) {
      for (const std::string& id : kv_taken_) {
        if (p.kv_taken.size() < (1 << 16)) p.kv_taken.push_back(id);
      }
      for (const std::string& id : kv_released_) {
        if (p.kv_released.size() < (1 << 16)) p.kv_released.push_back(id);
      }
      p.kv_blocks_free = kv_blocks_free_.load();
      p.sequences_held = held;
    }
    // The same sample for routers heard of later.
    for (const std::string& id : kv_taken_) sampled_ids_.insert(id);
    for (const std::string& id : kv_released_) sampled_ids_.erase(id);
    sampled_free_ = kv_blocks_free_.load();
    sampled_held_ = held;
    kv_taken_.clear();
    kv_released_.clear();
  }
  const PrefixCacheStats cache = kv_->prefix_stats();
  kv_blocks_cached_ = cache.cached_blocks;
  if (cache.evictions > evictions_seen_) {
    CacheMetrics(options_.pool).evictions.Add(double(cache.evictions - evictions_seen_));
    evictions_seen_ = cache.evictions;
  }
  int64_t active = 0, reservations = 0;
  for (const auto& s : sequences_) {
    if (s->finished) continue;
    active += s->stage == Stage::kDecoding;
    reservations += s->kind == Kind::kDecodeReservation && s->stage == Stage::kAwaitingKv;
  }
  active_ = active;
  reservations_ = reservations;
  // Blocks holding data: all but the free list (cached ones no sequence
  // holds included: their pages stay resident).
  const int64_t used =
      (kv_->num_blocks() - kv_->num_free_blocks() + cache.evictable_blocks) * kv_block_bytes_;
  kv_bytes_used_ = used;
  if (used > kv_bytes_used_peak_.load()) kv_bytes_used_peak_ = used;
  int64_t ws = 0;
  if (prefill_ != nullptr) ws += prefill_->workspace_bytes();
  if (decode_ != nullptr && decode_ != prefill_) ws += decode_->workspace_bytes();
  workspace_bytes_ = ws;
}

}  // namespace pdq::worker
