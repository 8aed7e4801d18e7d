// Admission control: whether the router takes a request now or refuses it
// at once (RESOURCE_EXHAUSTED; HTTP 429 with Retry-After), so a loaded
// deployment sheds what it cannot serve in time instead of queueing every
// request until all miss their deadlines. Pure: decisions are functions of
// a snapshot of the router's own books and the workers' measured rates, and
// the rate limiter takes the time as an argument.
#pragma once

#include <cstdint>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"

namespace pdq::router {

enum class Priority { kInteractive = 0, kBatch = 1 };

struct AdmissionOptions {
  // Requests admitted and still waiting for their first token, at most;
  // batch requests are refused once half of this waits. 0: no bound.
  int64_t max_waiting_requests = 256;
  // Refuse a request whose predicted time to first token is over this
  // because of the prompts waiting ahead of it (one whose own prompt alone
  // takes longer is taken: waiting would not help it), and always one
  // predicted to miss its own deadline. While no prefill rate is measured,
  // a request is taken only when no prompt waits ahead of it. Zero: the
  // deadline only.
  absl::Duration ttft_target = absl::ZeroDuration();
  // Refuse a request predicted to miss its own deadline (else it is taken
  // and fails with DEADLINE_EXCEEDED if the deadline passes first).
  bool refuse_past_deadline = true;
  // Per client (API key, else client id): prompt + max_tokens tokens a
  // second, with bursts of up to rate_burst_tokens. 0: no limit.
  double rate_tokens_per_second = 0;
  double rate_burst_tokens = 0;  // 0: ten seconds of the rate
};

// What the router knows when a request arrives.
struct AdmissionSnapshot {
  int64_t waiting_requests = 0;  // admitted, no first token yet
  // Their prompt tokens still to compute, by priority class.
  int64_t waiting_interactive_tokens = 0;
  int64_t waiting_batch_tokens = 0;
  // What the workers that prefill compute together, measured (their
  // heartbeats); 0 while none has measured, then no prediction is made
  // (and with a target, prompts are taken one at a time).
  double prefill_tokens_per_second = 0;
  // How much longer than predicted recent admitted requests took to their
  // first token (an average of actual / predicted; 1: as predicted): the
  // measured rate lags when the decode batch grows.
  double ttft_correction = 1;
  // The most KV blocks one live worker that decodes could give this
  // request by the router's books: its last heartbeat's free blocks (cached
  // ones no sequence holds count: they are evicted for it), less those of
  // requests sent to it since, plus those of requests ended since and of
  // the prompt its prefix cache holds. -1 while no such worker has reported.
  int64_t kv_room_blocks = -1;
  // The most streams one live worker that decodes could take before it
  // holds as many as its decode batch (RouterOptions::max_streams_per_worker),
  // by the router's books: what its last heartbeat said it holds, plus
  // requests sent to it since, less those ended since. -1: no bound (a worker
  // without one, or none has reported). kv_room_blocks is then of the
  // workers with such room.
  int64_t stream_room = -1;
};

// Folds one admitted request's actual time to first token against its
// uncorrected prediction into `correction` (an exponential average of the ratio, each
// ratio within [0.5, 10]).
void ObserveTtft(absl::Duration predicted, absl::Duration actual, double* correction);

struct AdmissionRequest {
  int64_t prompt_tokens = 0;  // still to compute (cached ones left out)
  Priority priority = Priority::kInteractive;
  absl::Duration time_left = absl::InfiniteDuration();  // until its deadline
  int64_t kv_blocks = 0;  // prompt + max_tokens, in KV blocks: what it reserves
};

enum class Refusal { kNone, kQueueFull, kTtft, kRateLimit, kKvFull, kBatchFull };
// "queue_full", "ttft", "rate_limit", "kv_full", "batch_full" (the /metrics
// label); "" for kNone.
const char* RefusalName(Refusal r);

struct AdmissionDecision {
  Refusal refusal = Refusal::kNone;
  bool admitted() const { return refusal == Refusal::kNone; }
  // Predicted time to the first token; zero when no rate is known. And the
  // same before ttft_correction (what ObserveTtft compares with).
  absl::Duration predicted_ttft, uncorrected_ttft;
  // When a retry could succeed (Retry-After); zero when admitted.
  absl::Duration retry_after;
  std::string message;  // why, for the client
};

// Whether to take the request, before the rate limit (RateLimiter).
AdmissionDecision Admit(const AdmissionOptions& o, const AdmissionSnapshot& s,
                        const AdmissionRequest& r);

// Token buckets per client. Not thread-safe.
class RateLimiter {
 public:
  explicit RateLimiter(const AdmissionOptions& o);
  // Takes `tokens` from `client`'s bucket at `now`, or refuses (kRateLimit,
  // with when the bucket will hold them) and takes nothing.
  AdmissionDecision Take(const std::string& client, double tokens, absl::Time now);
  size_t clients() const { return buckets_.size(); }

 private:
  struct Bucket {
    double tokens = 0;
    absl::Time updated;
  };
  double rate_, burst_;
  absl::Time last_sweep_ = absl::InfinitePast();
  absl::flat_hash_map<std::string, Bucket> buckets_;
};

}  // namespace pdq::router
