#include "router/admission.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"

namespace pdq::router {

const char* RefusalName(Refusal r) {
  switch (r) {
    case Refusal::kNone:
      return "";
    case Refusal::kQueueFull:
      return "queue_full";
    case Refusal::kTtft:
      return "ttft";
    case Refusal::kRateLimit:
      return "rate_limit";
    case Refusal::kKvFull:
      return "kv_full";
    case Refusal::kBatchFull:
      return "batch_full";
  }
  return "?";
}

namespace {

std::string Ms(absl::Duration d) { return absl::StrFormat("%.0f ms", absl::ToDoubleMilliseconds(d)); }

}  // namespace

AdmissionDecision Admit(const AdmissionOptions& o, const AdmissionSnapshot& s,
                        const AdmissionRequest& r) {
  AdmissionDecision d;
  const bool batch = r.priority == Priority::kBatch;
  // Interactive prompts are computed before batch ones (the workers order
  // their queues so): an interactive request waits only for those.
  const int64_t ahead = s.waiting_interactive_tokens + (batch ? s.waiting_batch_tokens : 0);
  const double rate = s.prefill_tokens_per_second;
  if (rate > 0) {
    d.uncorrected_ttft = absl::Seconds(double(ahead + r.prompt_tokens) / rate);
    d.predicted_ttft = d.uncorrected_ttft * std::max(1.0, s.ttft_correction);
  }
  // The queue bound: batch requests get half of it, so interactive ones
  // always find room.
  if (o.max_waiting_requests > 0) {
    const int64_t bound = batch ? std::max<int64_t>(1, o.max_waiting_requests / 2)
                                : o.max_waiting_requests;
    if (s.waiting_requests >= bound) {
      d.refusal = Refusal::kQueueFull;
      d.message = absl::StrFormat(
          "the router is at its bound of %d %srequests waiting for their first token; retry "
          "later",
          bound, batch ? "batch " : "");
      // Those ahead drain at the measured rate; without one, a second.
      d.retry_after = rate > 0 ? absl::Seconds(double(ahead) / rate / 2) : absl::Seconds(1);
    }
  }
  // Every worker that decodes holds a full decode batch: one more stream
  // would take turns with the others (each step advances at most the batch),
  // slowing all of them and adding no tokens a second.
  if (d.admitted() && s.stream_room == 0) {
    d.refusal = Refusal::kBatchFull;
    d.message =
        "every worker that decodes holds as many streams as its decode batch (the router's "
        "--max-streams-per-worker); retry later";
    d.retry_after = absl::Seconds(1);  // streams end and free their places
  }
  // No worker has room for its KV (by the router's books): a worker asked
  // would refuse the reservation, a loaded worker's round trip later.
  if (d.admitted() && s.kv_room_blocks >= 0 && r.kv_blocks > s.kv_room_blocks) {
    d.refusal = Refusal::kKvFull;
    d.message = absl::StrFormat(
        "KV cache full: the request needs %d blocks (prompt + max_tokens) and no worker has "
        "more than %d free by the router's count; retry later",
        r.kv_blocks, s.kv_room_blocks);
    d.retry_after = absl::Seconds(1);  // streams end and free theirs
  }
  const absl::Duration deadline =
      o.refuse_past_deadline ? r.time_left : absl::InfiniteDuration();
  if (d.admitted() && rate > 0) {
    // The target refuses what the queue ahead would delay past it; a prompt
    // that alone takes longer than the target cannot do better by waiting,
    // so only its deadline can refuse it.
    const absl::Duration alone = d.predicted_ttft * (double(r.prompt_tokens) /
                                                     double(std::max<int64_t>(1, ahead + r.prompt_tokens)));
    const absl::Duration target = o.ttft_target > absl::ZeroDuration() && alone <= o.ttft_target
                                      ? o.ttft_target
                                      : absl::InfiniteDuration();
    const absl::Duration limit = std::min(target, deadline);
    if (d.predicted_ttft > limit) {
      d.refusal = Refusal::kTtft;
      d.message = absl::StrFormat(
          "predicted time to first token %s (%d prompt tokens waiting ahead at %.0f tokens/s) "
          "is over the %s %s; retry later",
          Ms(d.predicted_ttft), ahead, rate, Ms(limit),
          limit == deadline ? "left before the deadline" : "target");
      // When the queue ahead will have drained enough for this to fit.
      d.retry_after = d.predicted_ttft - limit;
    }
  }
  if (d.admitted() && rate <= 0 && o.ttft_target > absl::ZeroDuration() && ahead > 0) {
    // No worker has reported a prefill rate yet (they measure one at start;
    // a worker that could not learns it from its first prompts): the target
    // cannot be judged, so prompts are taken one at a time rather than all
    // at once.
    d.refusal = Refusal::kTtft;
    d.message = absl::StrFormat(
        "no worker has measured its prefill rate yet and %d prompt tokens wait ahead, so the "
        "%s target cannot be judged; retry shortly",
        ahead, Ms(o.ttft_target));
    d.retry_after = absl::Seconds(1);
  }
  if (!d.admitted()) d.retry_after = std::max(d.retry_after, absl::Milliseconds(100));
  return d;
}

void ObserveTtft(absl::Duration predicted, absl::Duration actual, double* correction) {
  if (predicted <= absl::ZeroDuration()) return;
  const double ratio = std::clamp(absl::FDivDuration(actual, predicted), 0.5, 10.0);
  *correction = 0.8 * *correction + 0.2 * ratio;
}

RateLimiter::RateLimiter(const AdmissionOptions& o)
    : rate_(o.rate_tokens_per_second),
      burst_(o.rate_burst_tokens > 0 ? o.rate_burst_tokens : 10 * o.rate_tokens_per_second) {}

AdmissionDecision RateLimiter::Take(const std::string& client, double tokens, absl::Time now) {
  AdmissionDecision d;
  if (rate_ <= 0) return d;
  // Idle buckets are full: forget them rather than keep one per client
  // forever.
  if (buckets_.size() > 100000 && now - last_sweep_ >= absl::Seconds(1)) {
    last_sweep_ = now;
    absl::erase_if(buckets_, [&](const auto& kv) {
      return kv.second.tokens + rate_ * absl::ToDoubleSeconds(now - kv.second.updated) >= burst_;
    });
  }
  auto [it, fresh] = buckets_.try_emplace(client, Bucket{burst_, now});
  Bucket& b = it->second;
  if (!fresh && now > b.updated) {
    b.tokens = std::min(burst_, b.tokens + rate_ * absl::ToDoubleSeconds(now - b.updated));
    b.updated = now;
  }
  if (tokens > burst_) {
    d.refusal = Refusal::kRateLimit;
    d.message = absl::StrFormat(
        "the request's %.0f tokens (prompt + max_tokens) exceed this client's burst of %.0f",
        tokens, burst_);
    d.retry_after = absl::Seconds(burst_ / rate_);
    return d;
  }
  if (b.tokens < tokens) {
    d.refusal = Refusal::kRateLimit;
    d.retry_after = absl::Seconds((tokens - b.tokens) / rate_);
    d.message = absl::StrFormat(
        "rate limit: this client may send %.0f tokens (prompt + max_tokens) a second; retry in "
        "%s",
        rate_, Ms(d.retry_after));
    return d;
  }
  b.tokens -= tokens;
  return d;
}

}  // namespace pdq::router
