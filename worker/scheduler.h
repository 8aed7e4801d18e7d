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
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/context.h"
#include "engine/kv_cache.h"
#include "engine/sampler.h"
#include "kvtransfer/transport.h"

namespace pdq::worker {

enum class Role { kPrefill, kDecode, kBoth };
const char* RoleName(Role role);
absl::StatusOr<Role> ParseRole(const std::string& name);

struct SchedulerOptions {
  Role role = Role::kBoth;
  // Prompt tokens per prefill step; longer prompts run in chunks.
  int64_t prefill_token_budget = 2048;
  // Prompt tokens waiting for prefill beyond which new prompts are refused.
  int64_t max_queued_prompt_tokens = 1 << 17;
  int max_decode_batch = 64;
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
};

struct Summary {
  FinishReason reason = FinishReason::kLength;
  int64_t prompt_tokens = 0;
  int64_t output_tokens = 0;
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
};
struct Reservation {
  std::string id;
  std::string transfer_token;
  absl::Duration lease;
};

struct PrefillArgs {
  std::string request_id;
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  std::string kv_address;
  std::string transfer_token;
  absl::Time deadline = absl::InfiniteFuture();
};

// What the router balances on (and /metrics shows).
struct SchedulerLoad {
  int64_t queued_prompt_tokens = 0;
  int64_t kv_blocks_free = 0;
  int64_t kv_blocks_total = 0;
  int64_t active_sequences = 0;
  int64_t reservations = 0;
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
  // A stream or call changed (cancelled, a write finished): look again.
  void Wake();

  SchedulerLoad load() const;
  const KvCache& kv() const { return *kv_; }  // layout and sizes only

 private:
  struct Sequence;
  struct Inbox;
  void Loop();
  void Post(std::function<void()> command);
  // One prefill step over the queue's head; one decode step over every
  // runnable sequence.
  void PrefillStep();
  void DecodeStep();
  void Housekeeping(absl::Time now, absl::Time* next_wake);
  // Emits a generated token (the first from a prefill, or a later one) and
  // decides whether the sequence is finished.
  void EmitToken(Sequence& s, int32_t token);
  void FinishSequence(Sequence& s, const absl::Status& status);
  void UpdateLoad();
  std::string NewId();

  const SchedulerOptions options_;
  Context* const prefill_;
  Context* const decode_;
  std::unique_ptr<KvCache> kv_;
  kvtransfer::Transport* const transport_;

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

  std::atomic<int64_t> queued_prompt_tokens_{0}, kv_blocks_free_{0}, active_{0}, reservations_{0};
  std::thread thread_;
};

}  // namespace pdq::worker
