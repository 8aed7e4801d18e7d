// The engine side of a worker process: one thread that owns the contexts and
// the KV cache (no lock around the model) and runs prefill batches under a
// token budget and continuous-batching decode steps. gRPC handlers and the KV
// transport talk to it only through its command queue; everything it calls
// back runs on its thread and must not block.
//
// Roles: a prefill worker computes prompts and sends their KV to a decode
// worker's reservation; a decode worker reserves blocks, receives KV and
// decodes; a "both" worker does both over one cache with no transfer (the
// monolithic baseline), optionally with a prefill model of another precision.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/context.h"
#include "engine/kv_cache.h"
#include "engine/sampler.h"
#include "kvtransfer/transport.h"
#include "policy/batch.h"
#include "policy/step_plan.h"

namespace pdq::worker {

enum class Role { kPrefill, kDecode, kBoth };
const char* RoleName(Role role);
absl::StatusOr<Role> ParseRole(const std::string& name);

// One step as the scheduler formed and timed it, for
// SchedulerOptions::step_observer.
struct StepTrace {
  struct Stream {
    std::string request_id;
    policy::StreamView view;
  };
  std::vector<Stream> streams;                          // before the step, in the scheduler's order
  std::vector<std::string> rows;                        // request ids of the decode rows
  std::vector<std::pair<std::string, int64_t>> chunks;  // (request id, prompt tokens)
  bool fused = true;
  double pass_seconds = 0;    // the decode model's pass (everything, when fused)
  double prompt_seconds = 0;  // the prompt pass, when not fused
};

struct SchedulerOptions {
  Role role = Role::kBoth;
  // Prompt tokens per prefill step; longer prompts run in chunks.
  int64_t prefill_token_budget = 2048;
  // Prompt tokens waiting for prefill beyond which new prompts are refused.
  int64_t max_queued_prompt_tokens = 1 << 17;
  int max_decode_batch = 64;
  // While streams decode, each step takes only the prompt work that keeps
  // the step (the time between a stream's tokens) within this, by the
  // worker's measured step times (policy/step_plan.h); prompts progress by
  // at least one KV block a step. Zero (the default, as measured: see
  // bench/RESULTS.md): every step takes prefill_token_budget, and decoding
  // waits for it.
  absl::Duration tpot_target = absl::ZeroDuration();
  // With no tpot_target: the share of such a step prompt work may take, the
  // rest being what the step costs without it (policy::StepInput::
  // prompt_share); 0: no bound.
  double prompt_share = 0;
  // Time policy::CalibrationPasses before serving, so a bounded step's plan
  // knows a prompt pass's fixed cost from the first request on (worth it
  // only when steps are bounded; about a second on one core for the 135M
  // model).
  bool calibrate_step_costs = false;
  // A stream whose client has not taken this many tokens is paused...
  int64_t max_unsent_tokens = 64;
  // ...and cancelled when it stays paused this long.
  absl::Duration stalled_stream_timeout = absl::Seconds(30);
  // How long a reservation waits for the prefill worker to connect (it
  // does when it queues the prompt) and, once the KV landed, for its Decode
  // call. A connected sender is waited for on its connection instead.
  absl::Duration reservation_lease = absl::Seconds(30);
  // How long a reservation waits for its first layer after the sender
  // connected (its prompt queued at the prefill worker), at most; the
  // request's deadline when sooner.
  absl::Duration max_prefill_wait = absl::Minutes(10);
  // Keep whole prompt and answer blocks after a request ends and reuse them
  // for later prompts that start the same way (engine/kv_cache.h).
  bool prefix_cache = true;
  // Reuse cached blocks whatever precision wrote them (measured to cost no
  // accuracy: README, "KV reuse across requests"). Off, a prompt reuses
  // only blocks written at the precision that would compute it here (a
  // W4A16-written answer is recomputed by a W8A8 prefill), so answers are
  // the same as without the cache.
  bool reuse_any_precision = true;
  // Labels the prefix-cache metrics (the worker's --pool).
  std::string pool;
  // How long a stream suspended for migration waits for its KV to be sent
  // before it decodes on here.
  absl::Duration migration_lease = absl::Seconds(10);
  // Called on the scheduler's thread after every step (tests: the
  // simulator's parity with the scheduler, tests/sim_parity_test.cc).
  std::function<void(const StepTrace&)> step_observer;
};

enum class FinishReason { kEos = 1, kStop = 2, kLength = 3, kContextFull = 4 };

struct GenerationParams {
  std::string request_id;
  SamplingParams sampling;
  int max_tokens = 16;
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  absl::Time deadline = absl::InfiniteFuture();
  std::string cache_salt;  // role both: requests share cached KV only under equal salts
  bool batch = false;      // batch priority: prompts prefilled here wait for interactive ones
  // A stream migrated here from another decode worker (live migration):
  // the reservation's KV holds the prompt and all generated tokens but the
  // last, the KV notice brings the last, which the client already has.
  // `resume_generated`: every token sent so far (replayed into the stop
  // strings and the sampler's position); `resume_prompt_tokens`: the
  // original prompt's length, for the summary.
  bool resume = false;
  int64_t resume_prompt_tokens = 0;
  std::vector<int32_t> resume_generated;
  // Recomputed instead (its decode worker was lost): the prompt here is the
  // original one plus every token sent, and the token after it is new.
  bool resume_recomputed = false;
  // The router's secret for this stream; a request to move it must bring
  // it (empty: the stream cannot be moved).
  std::string stream_key;
};

// Live migration, source side: what a suspended stream holds.
struct Suspended {
  std::vector<int32_t> tokens;  // prompt + generated (the last one not in the KV)
  int64_t kv_tokens = 0;
  int64_t prompt_tokens = 0;
  absl::Duration lease;
  std::string kv_writer;  // the precision that wrote the KV, or "mixed"
};
struct MigrationTarget {
  std::string kv_address;
  std::string transfer_token;
  int64_t cached_tokens = 0;  // leading tokens the target holds: not sent
};
struct KvSent {
  double seconds = 0;
  int64_t bytes = 0;
};

struct Summary {
  FinishReason reason = FinishReason::kLength;
  int64_t prompt_tokens = 0;
  int64_t output_tokens = 0;
  int64_t cached_tokens = 0;     // prompt tokens reused from the prefix cache
  double ttft_seconds = 0;       // from the call's arrival to its first token
  double mean_tpot_seconds = 0;  // between later tokens
};

// Where a decode's tokens go (a gRPC stream). Thread-safe.
class TokenStream {
 public:
  virtual ~TokenStream() = default;
  virtual void Send(const std::vector<int32_t>& ids, const std::string& text) = 0;
  // Called once: OK with the summary after a normal finish, else why not.
  virtual void Finish(const absl::Status& status, const Summary& summary) = 0;
  // Tokens sent but not yet taken by the client.
  virtual int64_t Unsent() const = 0;
  virtual bool Cancelled() const = 0;
};

struct PrefillResult {
  int32_t first_token = -1;
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;    // reused from this worker's prefix cache
  double prefill_seconds = 0;   // queue wait excluded
  double transfer_seconds = 0;  // from the end of compute to the receiver's acknowledgement
};

// A prefill call. Thread-safe.
class PrefillCall {
 public:
  virtual ~PrefillCall() = default;
  virtual void Finish(const absl::StatusOr<PrefillResult>& result) = 0;  // once
  virtual bool Cancelled() const = 0;
};

struct ReserveArgs {
  std::string request_id;
  int64_t prompt_tokens = 0;
  int64_t max_tokens = 0;
  KvLayout sender;
  absl::Time deadline = absl::InfiniteFuture();
  // The prompt's ids (may be empty: then nothing is reused) and its salt.
  std::vector<int32_t> prompt;
  std::string cache_salt;
  // When part of the prompt is cached here and at most this many tokens
  // are missing, they are prefilled here instead of by a prefill worker;
  // 0: never.
  int64_t local_prefill_max_tokens = 0;
  // The precision of the prefill that will write the KV ("w8a8"), recorded
  // on the blocks it fills.
  std::string kv_writer;
  // Leading prompt tokens the router's chosen prefill worker holds cached
  // (0: none or unknown): a prefill here at another precision needs more.
  int64_t prefill_cached_tokens = 0;
  // Set: a local prefill starts with the reservation and draws its first
  // token with these (the Decode call must bring the same); unset: it waits
  // for the Decode call.
  std::optional<SamplingParams> first_sampling;
  bool batch = false;  // batch priority, for a local prefill started here
};
struct Reservation {
  std::string id;
  std::string transfer_token;
  absl::Duration lease;
  int64_t cached_tokens = 0;   // leading prompt tokens held here: not sent
  bool local_prefill = false;  // prefilled here; no transfer
};

struct PrefillArgs {
  std::string request_id;
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  std::string kv_address;
  std::string transfer_token;
  absl::Time deadline = absl::InfiniteFuture();
  int64_t decode_cached_tokens = 0;  // the receiver holds these; they are not sent
  std::string cache_salt;
  bool batch = false;        // batch priority: computed after every interactive prompt waiting
  int64_t skip_samples = 0;  // the first pick continues a stream that drew this many
};

// What the router balances on (and /metrics shows).
struct SchedulerLoad {
  int64_t queued_prompt_tokens = 0;
  int64_t kv_blocks_free = 0;
  int64_t kv_blocks_total = 0;
  int64_t active_sequences = 0;
  int64_t reservations = 0;
  // Sequences holding a KV reservation to decode (WorkerLoad::sequences_held).
  int64_t sequences_held = 0;
  int64_t kv_blocks_cached = 0;  // in the prefix cache (held by a sequence or not)
  // Prompt tokens a second: one prompt's at start, then computed while
  // prompts waited, decode steps included (what a new prompt's wait is
  // predicted from); 0: not measured.
  double prefill_tokens_per_second = 0;
  // Memory, apart: the weights held (both weight sets of a two-precision
  // process), the KV cache (allocated; holding data now: in use or cached;
  // the most that ever held data, what is resident once touched) and the
  // forward passes' workspaces.
  int64_t weight_bytes = 0;
  int64_t kv_bytes_total = 0, kv_bytes_used = 0, kv_bytes_used_peak = 0;
  int64_t workspace_bytes = 0;
};

// How the steps went while streams decoded (for tests and /metrics).
struct StepStats {
  std::atomic<int64_t> decode_steps{0};
  // Steps whose prompt work the TPOT target cut short.
  std::atomic<int64_t> bounded_steps{0};
  std::atomic<int64_t> max_prefill_tokens_with_decode{0};
};

// Changes to the set of block hashes the prefix cache holds, for the router.
struct CacheUpdate {
  bool full = false;  // `stored` is the whole set
  std::vector<uint64_t> stored, removed;
  // The requests whose KV blocks were taken since the router's last update
  // (WorkerLoad::kv_taken_request_ids), and the free blocks counted with
  // them (-1: none counted yet).
  std::vector<std::string> kv_taken;
  // And those of them whose blocks were freed again
  // (WorkerLoad::kv_released_request_ids).
  std::vector<std::string> kv_released;
  int64_t kv_blocks_free = -1;
  // The sequences holding a KV reservation to decode, counted with them
  // (WorkerLoad::sequences_held; -1: none counted yet).
  int64_t sequences_held = -1;
};

class Scheduler {
 public:
  // `prefill` runs prompts, `decode` continues them (the same context, or
  // two on one model layout); either may be null when the role does not
  // use it. `transport` is over `kv`'s memory; null for kBoth.
  Scheduler(const SchedulerOptions& options, Context* prefill, Context* decode,
            std::unique_ptr<KvCache> kv, kvtransfer::Transport* transport);
  // Fails whatever is in flight with Unavailable and joins the thread.
  ~Scheduler();
  // The step cost models after the start-up calibration ("" without one),
  // as logged.
  const std::string& calibration() const { return calibration_; }

  // Decode side: blocks for prompt + max tokens, and where the KV lands.
  // ResourceExhausted when the blocks are not free; FailedPrecondition when
  // the sender's layout differs.
  void Reserve(ReserveArgs args, std::function<void(absl::StatusOr<Reservation>)> done);
  // Frees a reservation (and aborts its transfer). NotFound for unknown ids.
  void Release(std::string reservation_id, std::function<void(absl::Status)> done);
  // Decodes from a reservation once its KV has landed.
  void Decode(std::string reservation_id, GenerationParams params,
              std::shared_ptr<TokenStream> stream);
  // Both phases here (role kBoth).
  void Generate(std::vector<int32_t> prompt, GenerationParams params,
                std::shared_ptr<TokenStream> stream);
  // Prefill side: computes the prompt and sends its KV to the reservation.
  void Prefill(PrefillArgs args, std::shared_ptr<PrefillCall> call);
  // Live migration, on the worker decoding `request_id`: Suspend stops it
  // between steps (it decodes on by itself after `migration_lease`);
  // SendKv sends its KV to the target's reservation and, once verified
  // there, ends its stream (Aborted, "migrated") and frees it, or on a
  // failed transfer lets it decode on; Resume lets it decode on.
  // FailedPrecondition when it is not decoding here (or has no KV
  // transport), NotFound when unknown.
  // Each must bring the stream's key (GenerationParams::stream_key):
  // PermissionDenied otherwise.
  void Suspend(std::string request_id, std::string key,
               std::function<void(absl::StatusOr<Suspended>)> done);
  void SendKv(std::string request_id, std::string key, MigrationTarget target,
              std::function<void(absl::StatusOr<KvSent>)> done);
  void Resume(std::string request_id, std::string key, std::function<void(absl::Status)> done);
  // A stream or call changed (cancelled, a write finished): look again.
  void Wake();

  SchedulerLoad load() const;
  // Streams one decode step holds at most (SchedulerOptions::max_decode_batch).
  int max_decode_batch() const { return options_.max_decode_batch; }
  // What changed in the prefix cache since the last call for `router` (each
  // router the worker registers with keeps its own account), or with
  // `want_full`, on the first call, or when changes were dropped, the whole
  // set. Thread-safe.
  CacheUpdate TakeCacheUpdate(const std::string& router, bool want_full);
  // Stops keeping `router`'s account (a router no longer registered with).
  void ForgetCacheRouter(const std::string& router);
  const KvCache& kv() const { return *kv_; }  // layout and sizes only
  const StepStats& step_stats() const { return step_stats_; }

 private:
  struct Sequence;
  struct Inbox;
  void Loop();
  void Post(std::function<void()> command);
  // One step: the decode rows and the prompt chunks the step plan allows,
  // in one forward pass when one model runs both.
  struct Chunk {
    Sequence* s;
    int64_t n;
    bool last;  // the prompt's end
  };
  void Step();
  StepTrace TraceStep(const std::vector<policy::StreamView>& views,
                      const std::vector<Sequence*>& rows, const std::vector<Chunk>& chunks) const;
  // Times policy::CalibrationPasses into the cost models (before the loop
  // starts); what it learnt, for the log.
  absl::StatusOr<std::string> CalibrateStepCosts();
  // Times one pass of a 128-token prompt (before the loop
  // starts): the prefill rate the first heartbeat reports, so the router's
  // admission predicts time to first token from the first request on
  // instead of taking every request until prompts have been timed under
  // load. Tokens a second.
  absl::StatusOr<double> MeasurePrefillRate();
  // Runs one forward pass; its time in seconds.
  double RunPass(Context* ctx, policy::StepCostModel& cost, const std::vector<Chunk>& chunks,
                 const std::vector<Sequence*>& rows);
  void Housekeeping(absl::Time now, absl::Time* next_wake);
  // Emits a generated token (the first from a prefill, or a later one) and
  // decides whether the sequence is finished.
  void EmitToken(Sequence& s, int32_t token);
  // The KV landed and the Decode call came: the first token goes out, or a
  // migrated stream picks up after `token` (sent by the source already).
  void StartDecoding(Sequence& s, int32_t token);
  // Queues a reservation's missing prompt tokens for prefilling here.
  void QueueLocalPrefill(Sequence& s);
  // A recomputed stream (GenerationParams::resume_recomputed): the sampler,
  // stop strings and counts where the lost worker left them, before its
  // next token comes. False (the sequence finished) when they do not fit.
  bool PrepareRecomputed(Sequence& s);
  // A stream continued here (moved or recomputed): the sampler's position,
  // the stop strings' state and the counts after the tokens sent elsewhere.
  // False (the sequence finished) when their text does not decode.
  bool ReplaySent(Sequence& s);
  // The decoding sequence serving `request_id`, or why not.
  absl::StatusOr<Sequence*> MigratingSequence(const std::string& request_id,
                                              const std::string& key);
  void FinishSequence(Sequence& s, const absl::Status& status);
  // Prefix cache: reuses what the cache holds of s.tokens (at most
  // `max_tokens`, written by `writer` unless any precision may be reused)
  // for the new sequence s.seq; returns the tokens reused.
  int64_t AttachCachedPrefix(Sequence& s, int64_t max_tokens, const std::string& writer);
  // Offers s's stored blocks to the cache, new ones recorded as `writer`'s.
  void CacheBlocks(Sequence& s, const std::string& writer);
  // The context prompts run on (a decode worker prefills short suffixes
  // with its decode context) and the names of the two precisions.
  Context* prefill_context() const { return prefill_ != nullptr ? prefill_ : decode_; }
  std::string prefill_writer() const;
  std::string decode_writer() const;
  void UpdateLoad();
  std::string NewId();

  const SchedulerOptions options_;
  Context* const prefill_;
  Context* const decode_;
  std::unique_ptr<KvCache> kv_;
  kvtransfer::Transport* const transport_;
  // What load() reports that never changes: the weights held (each model
  // once) and the bytes of one KV block over all layers.
  const int64_t weight_bytes_;
  const int64_t kv_block_bytes_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> commands_;  // guarded by mu_
  bool stopping_ = false;                       // guarded by mu_
  bool wake_ = false;                           // guarded by mu_

  // Owned by the scheduler thread.
  std::vector<std::unique_ptr<Sequence>> sequences_;
  uint64_t next_id_ = 0;
  uint64_t id_salt_ = 0;
  std::vector<int32_t> step_tokens_;
  Logits logits_;
  // Measured step times of the pass over each context (one when fused).
  policy::StepCostModel prefill_cost_, decode_cost_;
  std::string calibration_;
  StepStats step_stats_;
  struct StepLog {
    int64_t steps = 0, rows = 0, prompt_tokens = 0, bounded = 0;
    double predicted = 0, target = 0, seconds = 0, longest = 0;
  } step_log_;
  // The decode rows and forward-pass seconds of the loop iteration's step
  // (pdq_decode_step_overhead_seconds_total: the rest of the iteration).
  struct LastStep {
    int64_t rows = 0;
    double pass_seconds = 0;
  } last_step_;

  // The prefill rate: tokens and step time summed while prompts waited,
  // folded into the published rate every half second or so.
  int64_t rate_tokens_ = 0;
  double rate_seconds_ = 0;
  std::atomic<double> prefill_rate_{0};
  std::atomic<int64_t> kv_bytes_used_{0}, kv_bytes_used_peak_{0}, workspace_bytes_{0};
  std::atomic<int64_t> queued_prompt_tokens_{0}, kv_blocks_free_{0}, active_{0}, reservations_{0},
      sequences_held_{0}, kv_blocks_cached_{0};
  int64_t evictions_seen_ = 0;
  // The cache's block hashes as the routers should see them: the set now
  // and, per router, what changed since TakeCacheUpdate last ran for it.
  std::mutex cache_mu_;
  absl::flat_hash_set<uint64_t> cached_hashes_;  // guarded by cache_mu_
  // The net change since a router's last update; `full`: send the whole
  // set instead.
  struct PendingCacheUpdate {
    absl::flat_hash_set<uint64_t> stored, removed;
    bool full = true;
    std::vector<std::string> kv_taken, kv_released;
    int64_t kv_blocks_free = -1;
    int64_t sequences_held = -1;
  };
  // Requests whose KV blocks were taken (and of those, freed again) since
  // the last UpdateLoad (the scheduler thread's), published to every
  // router's pending update there.
  std::vector<std::string> kv_taken_, kv_released_;
  absl::flat_hash_map<std::string, PendingCacheUpdate> pending_;  // guarded by cache_mu_
  // The last sample as a whole (guarded by cache_mu_): the requests it
  // counts as taken, its free blocks and held sequences (-1: none yet). A
  // router heard of after it gets all of it (a request it sent before the
  // worker's first heartbeat to it is listed then, not counted twice); an
  // update without a newer sample repeats its counts.
  absl::flat_hash_set<std::string> sampled_ids_;
  int64_t sampled_free_ = -1, sampled_held_ = -1;
  void PublishCacheEvents();
  std::thread thread_;
};

}  // namespace pdq::worker
