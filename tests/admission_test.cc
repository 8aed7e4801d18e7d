// Admission control's decisions (router/admission.h) on their own: pure
// functions of a snapshot, the rate limiter on an injected clock.
#include "router/admission.h"

#include "gtest/gtest.h"

namespace pdq::router {
namespace {

AdmissionRequest Req(int64_t tokens, Priority p = Priority::kInteractive,
                     absl::Duration left = absl::InfiniteDuration()) {
  AdmissionRequest r;
  r.prompt_tokens = tokens;
  r.priority = p;
  r.time_left = left;
  return r;
}

TEST(AdmissionTest, AnIdleRouterTakesEverything) {
  AdmissionOptions o;
  o.ttft_target = absl::Seconds(1);
  AdmissionSnapshot s;
  s.prefill_tokens_per_second = 1000;
  const AdmissionDecision d = Admit(o, s, Req(500));
  EXPECT_TRUE(d.admitted());
  EXPECT_EQ(d.predicted_ttft, absl::Milliseconds(500));
  EXPECT_EQ(d.retry_after, absl::ZeroDuration());
}

TEST(AdmissionTest, TheWaitingBoundRefusesAndLeavesBatchHalf) {
  AdmissionOptions o;
  o.max_waiting_requests = 10;
  AdmissionSnapshot s;
  s.waiting_requests = 5;
  EXPECT_TRUE(Admit(o, s, Req(10)).admitted());
  const AdmissionDecision batch = Admit(o, s, Req(10, Priority::kBatch));
  EXPECT_EQ(batch.refusal, Refusal::kQueueFull);
  EXPECT_NE(batch.message.find("5 batch requests"), std::string::npos) << batch.message;
  EXPECT_GE(batch.retry_after, absl::Milliseconds(100));
  s.waiting_requests = 10;
  EXPECT_EQ(Admit(o, s, Req(10)).refusal, Refusal::kQueueFull);
  o.max_waiting_requests = 0;  // no bound
  s.waiting_requests = 1 << 20;
  EXPECT_TRUE(Admit(o, s, Req(10, Priority::kBatch)).admitted());
}

TEST(AdmissionTest, ARequestNoWorkersKvCacheHoldsIsRefused) {
  AdmissionOptions o;
  AdmissionSnapshot s;
  AdmissionRequest r = Req(100);
  r.kv_blocks = 20;
  EXPECT_TRUE(Admit(o, s, r).admitted()) << "no worker reported yet: the worker decides";
  s.kv_room_blocks = 20;
  EXPECT_TRUE(Admit(o, s, r).admitted());
  s.kv_room_blocks = 0;  // overbooked workers report none, not "unknown"
  EXPECT_EQ(Admit(o, s, r).refusal, Refusal::kKvFull);
  s.kv_room_blocks = 19;
  const AdmissionDecision d = Admit(o, s, r);
  EXPECT_EQ(d.refusal, Refusal::kKvFull);
  EXPECT_STREQ(RefusalName(d.refusal), "kv_full");
  EXPECT_NE(d.message.find("KV cache full"), std::string::npos) << d.message;
  EXPECT_NE(d.message.find("20 blocks"), std::string::npos) << d.message;
  EXPECT_GE(d.retry_after, absl::Milliseconds(100));
}

TEST(AdmissionTest, ARequestNoWorkerHasAPlaceInItsDecodeBatchForIsRefused) {
  AdmissionOptions o;
  AdmissionSnapshot s;
  AdmissionRequest r = Req(100);
  r.kv_blocks = 20;
  EXPECT_TRUE(Admit(o, s, r).admitted()) << "no bound known: the workers take turns";
  s.stream_room = 1;
  EXPECT_TRUE(Admit(o, s, r).admitted());
  s.stream_room = 0;
  const AdmissionDecision d = Admit(o, s, r);
  EXPECT_EQ(d.refusal, Refusal::kBatchFull);
  EXPECT_STREQ(RefusalName(d.refusal), "batch_full");
  EXPECT_NE(d.message.find("decode batch"), std::string::npos) << d.message;
  EXPECT_GE(d.retry_after, absl::Milliseconds(100));
  // The waiting bound is judged first.
  o.max_waiting_requests = 1;
  s.waiting_requests = 1;
  EXPECT_EQ(Admit(o, s, r).refusal, Refusal::kQueueFull);
}

TEST(AdmissionTest, APredictedTtftOverTheTargetIsRefusedWithWhenToRetry) {
  AdmissionOptions o;
  o.ttft_target = absl::Seconds(2);
  AdmissionSnapshot s;
  s.prefill_tokens_per_second = 1000;
  s.waiting_interactive_tokens = 2500;
  const AdmissionDecision d = Admit(o, s, Req(500));
  EXPECT_EQ(d.refusal, Refusal::kTtft);
  EXPECT_EQ(d.predicted_ttft, absl::Seconds(3));
  EXPECT_EQ(d.retry_after, absl::Seconds(1));  // when the queue ahead has drained enough
  EXPECT_NE(d.message.find("3000 ms"), std::string::npos) << d.message;
}

TEST(AdmissionTest, APromptLongerThanTheTargetAloneIsTakenWhenNothingWaits) {
  AdmissionOptions o;
  o.ttft_target = absl::Seconds(1);
  AdmissionSnapshot s;
  s.prefill_tokens_per_second = 1000;
  // 3 s of prompt: no wait would bring it under the target, so it is taken...
  EXPECT_TRUE(Admit(o, s, Req(3000)).admitted());
  // ...unless its deadline comes first,
  EXPECT_EQ(Admit(o, s, Req(3000, Priority::kInteractive, absl::Seconds(2))).refusal,
            Refusal::kTtft);
  // and behind a queue a prompt that alone fits is refused for the queue.
  s.waiting_interactive_tokens = 2000;
  EXPECT_EQ(Admit(o, s, Req(500)).refusal, Refusal::kTtft);
}

TEST(AdmissionTest, TheDeadlineRefusesEvenWithoutATarget) {
  AdmissionOptions o;  // no target
  AdmissionSnapshot s;
  s.prefill_tokens_per_second = 100;
  s.waiting_interactive_tokens = 1000;
  EXPECT_TRUE(Admit(o, s, Req(100)).admitted());
  const AdmissionDecision d = Admit(o, s, Req(100, Priority::kInteractive, absl::Seconds(5)));
  EXPECT_EQ(d.refusal, Refusal::kTtft);
  EXPECT_NE(d.message.find("deadline"), std::string::npos) << d.message;
  // A tighter target than the deadline wins, and the other way round.
  o.ttft_target = absl::Seconds(20);
  EXPECT_EQ(Admit(o, s, Req(100, Priority::kInteractive, absl::Seconds(5))).refusal,
            Refusal::kTtft);
  EXPECT_TRUE(Admit(o, s, Req(100, Priority::kInteractive, absl::Seconds(15))).admitted());
  // Told to, it takes them anyway (the target still holds).
  o.refuse_past_deadline = false;
  EXPECT_TRUE(Admit(o, s, Req(100, Priority::kInteractive, absl::Seconds(5))).admitted());
  o.ttft_target = absl::Seconds(10);
  EXPECT_EQ(Admit(o, s, Req(100, Priority::kInteractive, absl::Seconds(5))).refusal,
            Refusal::kTtft);
}

TEST(AdmissionTest, InteractiveRequestsDoNotWaitForBatchOnes) {
  AdmissionOptions o;
  o.ttft_target = absl::Seconds(1);
  AdmissionSnapshot s;
  s.prefill_tokens_per_second = 1000;
  s.waiting_batch_tokens = 100000;  // a big batch job queued
  s.waiting_interactive_tokens = 200;
  const AdmissionDecision i = Admit(o, s, Req(300));
  EXPECT_TRUE(i.admitted());
  EXPECT_EQ(i.predicted_ttft, absl::Milliseconds(500));
  EXPECT_EQ(Admit(o, s, Req(300, Priority::kBatch)).refusal, Refusal::kTtft);
}

TEST(AdmissionTest, PredictionsLearnFromTheTtftsAdmittedRequestsHad) {
  double correction = 1;
  // Requests took three times what was predicted (the decode batch grew).
  for (int i = 0; i < 30; ++i) ObserveTtft(absl::Seconds(1), absl::Seconds(3), &correction);
  EXPECT_NEAR(correction, 3, 0.01);
  AdmissionOptions o;
  o.ttft_target = absl::Seconds(2);
  AdmissionSnapshot s;
  s.prefill_tokens_per_second = 1000;
  s.waiting_interactive_tokens = 500;
  EXPECT_TRUE(Admit(o, s, Req(500)).admitted());  // 1 s as measured
  s.ttft_correction = correction;
  const AdmissionDecision d = Admit(o, s, Req(500));
  EXPECT_EQ(d.refusal, Refusal::kTtft);
  EXPECT_NEAR(absl::ToDoubleSeconds(d.predicted_ttft), 3, 0.01);
  EXPECT_EQ(d.uncorrected_ttft, absl::Seconds(1));
  // Faster than predicted never makes a prediction shorter than the rate's.
  for (int i = 0; i < 30; ++i) ObserveTtft(absl::Seconds(1), absl::Milliseconds(100), &correction);
  EXPECT_NEAR(correction, 0.5, 0.01);
  s.ttft_correction = correction;
  EXPECT_EQ(Admit(o, s, Req(500)).predicted_ttft, absl::Seconds(1));
  // Nothing was predicted: nothing learnt.
  ObserveTtft(absl::ZeroDuration(), absl::Seconds(9), &correction);
  EXPECT_NEAR(correction, 0.5, 0.01);
}

TEST(AdmissionTest, WithoutAMeasuredRateATargetTakesOnePromptAtATime) {
  AdmissionOptions o;
  o.ttft_target = absl::Milliseconds(1);
  AdmissionSnapshot s;
  // Nothing waits: taken, whatever its size, with nothing predicted.
  AdmissionDecision d = Admit(o, s, Req(1 << 20));
  EXPECT_TRUE(d.admitted());
  EXPECT_EQ(d.predicted_ttft, absl::ZeroDuration());
  // A prompt waits ahead: the target cannot be judged, so not all at once.
  s.waiting_requests = 1;
  s.waiting_interactive_tokens = 100;
  d = Admit(o, s, Req(100));
  EXPECT_EQ(d.refusal, Refusal::kTtft);
  EXPECT_NE(d.message.find("no worker has measured its prefill rate"), std::string::npos)
      << d.message;
  EXPECT_EQ(d.retry_after, absl::Seconds(1));
  // Interactive prompts do not wait for batch ones.
  s.waiting_interactive_tokens = 0;
  s.waiting_batch_tokens = 100;
  EXPECT_TRUE(Admit(o, s, Req(100)).admitted());
  EXPECT_EQ(Admit(o, s, Req(100, Priority::kBatch)).refusal, Refusal::kTtft);
  // Without a target only the bound and the deadline decide.
  o.ttft_target = absl::ZeroDuration();
  s.waiting_interactive_tokens = 1 << 30;
  EXPECT_TRUE(Admit(o, s, Req(100)).admitted());
}

TEST(RateLimiterTest, ABucketPerClientRefillsAtTheRate) {
  AdmissionOptions o;
  o.rate_tokens_per_second = 100;
  o.rate_burst_tokens = 300;
  RateLimiter rl(o);
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  EXPECT_TRUE(rl.Take("a", 200, t0).admitted());
  EXPECT_TRUE(rl.Take("a", 100, t0).admitted());
  const AdmissionDecision d = rl.Take("a", 50, t0);
  EXPECT_EQ(d.refusal, Refusal::kRateLimit);
  EXPECT_EQ(d.retry_after, absl::Milliseconds(500));
  // Another client has its own bucket.
  EXPECT_TRUE(rl.Take("b", 300, t0).admitted());
  // Half a second later "a" has 50 again; a refusal took nothing.
  EXPECT_TRUE(rl.Take("a", 50, t0 + absl::Milliseconds(500)).admitted());
  EXPECT_FALSE(rl.Take("a", 1, t0 + absl::Milliseconds(500)).admitted());
  // Never more than the burst, however long idle.
  EXPECT_FALSE(rl.Take("a", 301, t0 + absl::Hours(1)).admitted());
  EXPECT_TRUE(rl.Take("a", 300, t0 + absl::Hours(1)).admitted());
}

TEST(RateLimiterTest, NoRateNoLimitAndTheDefaultBurstIsTenSeconds) {
  RateLimiter none{AdmissionOptions{}};
  EXPECT_TRUE(none.Take("a", 1e12, absl::Now()).admitted());
  AdmissionOptions o;
  o.rate_tokens_per_second = 10;
  RateLimiter rl(o);
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  EXPECT_TRUE(rl.Take("a", 100, t0).admitted());
  EXPECT_FALSE(rl.Take("a", 1, t0).admitted());
}

TEST(RateLimiterTest, IdleClientsAreForgotten) {
  AdmissionOptions o;
  o.rate_tokens_per_second = 1000;
  RateLimiter rl(o);
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  for (int i = 0; i <= 100000; ++i) ASSERT_TRUE(rl.Take(std::to_string(i), 1, t0).admitted());
  EXPECT_EQ(rl.clients(), 100001u);
  // An hour later every bucket is full again: the next newcomer clears them.
  EXPECT_TRUE(rl.Take("new", 1, t0 + absl::Hours(1)).admitted());
  EXPECT_EQ(rl.clients(), 1u);
}

}  // namespace
}  // namespace pdq::router
