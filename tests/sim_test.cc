// The cluster simulator (sim/sim.h) against results known without it:
// queueing theory, hand-computed step and transfer times, and the policy's
// own rules (batch size, the TPOT target, KV capacity).
#include "sim/sim.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>
#include <tuple>

#include "common/arrivals.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "policy/traffic_split.h"
#include "sim/plan.h"
#include "sim/profile.h"
#include "sim/worker_sim.h"

namespace pdq::sim {
namespace {

// One monolithic worker whose pass costs `fixed` + `per_token` a prompt
// token + `per_row` a decode row.
Deployment OneWorker(double fixed, double per_token, double per_row) {
  Deployment d;
  d.monolithic = 1;
  d.monolithic_worker.pass = {fixed, per_row, per_token, 0, 0, {}};
  return d;
}

// `clients` back to back (closed loop), `requests` measured after `warmup`
// unmeasured ones.
Workload ClosedLoop(int clients, int64_t prompt_tokens, int64_t output_tokens, int requests,
                    int warmup = 0) {
  Workload w;
  w.arrivals = Workload::Arrivals::kClosedLoop;
  w.concurrency = clients;
  w.prompt_tokens = prompt_tokens;
  w.output_tokens = output_tokens;
  w.requests = requests;
  w.warmup = warmup;
  return w;
}

double MeanTtft(const RunResult& r) {
  double sum = 0;
  int n = 0;
  for (const RequestRecord& q : r.requests) {
    if (!q.measured) continue;
    sum += q.ttft();
    ++n;
  }
  return sum / n;
}

TEST(SimTest, OnePromptAStepIsAnMD1Queue) {
  // 100-token prompts, one a step (the budget), one token each: a server
  // with deterministic service S = 20 ms under Poisson arrivals at 70% load.
  // Pollaczek-Khinchine: mean wait rho S / (2 (1 - rho)).
  Deployment d = OneWorker(0.01, 1e-4, 0);
  d.monolithic_worker.batch.token_budget = 100;
  Workload w;
  w.prompt_tokens = 100;
  w.output_tokens = 1;
  const double s = 0.02, rho = 0.7;
  w.rate = rho / s;
  w.requests = 40000;
  w.warmup = 1000;
  const RunResult r = *Simulate(d, w);
  const double expected = rho * s / (2 * (1 - rho)) + s;
  EXPECT_NEAR(MeanTtft(r), expected, 0.04 * expected);
}

TEST(SimTest, PoissonArrivalsAreThoseTheBenchSendsForTheSeed) {
  // pdq bench --rate R --arrival-seed S sends at PoissonArrivalTimes(R, n, S)
  // (harness/load_generator.cc); the simulator's seed S must arrive there too,
  // the first at 0, warm-up included, whatever the lengths draw.
  Deployment d = OneWorker(0.01, 1e-4, 1e-3);
  Workload w;
  w.rate = 7.5;
  w.requests = 40;
  w.warmup = 5;
  w.length_spread = 0.5;
  for (uint64_t seed : {1, 2, 9}) {
    w.seed = seed;
    const RunResult r = *Simulate(d, w);
    const std::vector<double> sent = PoissonArrivalTimes(7.5, 45, seed);
    ASSERT_EQ(r.requests.size(), sent.size());
    for (size_t i = 0; i < sent.size(); ++i) EXPECT_DOUBLE_EQ(r.requests[i].arrival, sent[i]) << i;
  }
  EXPECT_EQ(PoissonArrivalTimes(7.5, 3, 1)[0], 0);
  EXPECT_NE(PoissonArrivalTimes(7.5, 3, 1)[1], PoissonArrivalTimes(7.5, 3, 2)[1]);
}

TEST(SimTest, ARequestAloneTakesItsStepTimes) {
  // 1 ms + 0.1 ms a prompt token + 0.5 ms a row; one client at a time.
  Deployment d = OneWorker(1e-3, 1e-4, 5e-4);
  d.monolithic_worker.pass.per_pair = 1e-8;
  d.monolithic_worker.pass.per_decode_pair = 3e-8;
  d.router_seconds = 2e-4;
  d.random_router_time = false;  // each request's router time the mean
  Workload w = ClosedLoop(1, 200, 5, 3);
  const RunResult r = *Simulate(d, w);
  policy::StepWork prompt;
  prompt.AddChunk(0, 200);
  const double ttft = 2e-4 + d.monolithic_worker.pass.Seconds(prompt);
  double decode = 0;
  for (int k = 0; k < 4; ++k) {
    policy::StepWork row;
    row.AddDecodeRow(200 + k);
    decode += d.monolithic_worker.pass.Seconds(row);
  }
  for (const RequestRecord& q : r.requests) {
    EXPECT_NEAR(q.ttft(), ttft, 1e-12);
    EXPECT_NEAR(q.finish - q.first_token, decode, 1e-12);
  }
  EXPECT_NEAR(r.requests[2].arrival, 2 * (ttft + decode), 1e-12);
}

// Router times drawn per request (the default): their mean is the
// profile's, a seed draws the same ones again, and another seed other ones,
// so the races between requests sent at once (which of them share a step)
// go another way; with the mean for each (--router-time fixed) every seed
// runs alike.
TEST(SimTest, RouterTimesAreDrawnPerRequest) {
  Deployment d = OneWorker(1e-3, 1e-4, 5e-4);
  d.router_seconds = 5e-4;
  // One client: a request's TTFT is its router time and its prompt's pass.
  const Workload one = ClosedLoop(1, 100, 2, 4000);
  const RunResult r = *Simulate(d, one);
  policy::StepWork prompt;
  prompt.AddChunk(0, 100);
  const double pass = d.monolithic_worker.pass.Seconds(prompt);
  double sum = 0, least = 1, most = 0;
  for (const RequestRecord& q : r.requests) {
    const double router = q.ttft() - pass;
    sum += router;
    least = std::min(least, router);
    most = std::max(most, router);
  }
  EXPECT_NEAR(sum / double(r.requests.size()), 5e-4, 0.05 * 5e-4);  // 4000 draws: ~1.6% s.e.
  EXPECT_LT(least, 5e-5);  // exponential: a tenth of the draws fall below 0.1 x the mean
  EXPECT_GT(most, 2e-3);   // and 1.8% above 4 x
  const RunResult again = *Simulate(d, one);
  ASSERT_EQ(again.requests.size(), r.requests.size());
  for (size_t i = 0; i < r.requests.size(); ++i) {
    EXPECT_EQ(again.requests[i].first_token, r.requests[i].first_token);
  }

  // Four clients sending at once to a worker whose steps take about a
  // router time (0.3 ms a prompt), two seeds: how the steps were composed.
  d = OneWorker(1e-4, 2e-6, 5e-5);
  d.router_seconds = 5e-4;
  RunOptions traced;
  traced.trace_steps = true;
  auto compositions = [&](uint64_t seed) {
    Workload four = ClosedLoop(4, 100, 20, 40);
    four.seed = seed;
    std::vector<size_t> chunks;
    const RunResult run = *Simulate(d, four, traced);
    for (const StepRecord& s : run.steps) chunks.push_back(s.chunks.size());
    return chunks;
  };
  EXPECT_NE(compositions(1), compositions(2));
  d.random_router_time = false;
  EXPECT_EQ(compositions(1), compositions(2));
}

// The warm-up requests are the first to end, as pdq bench counts them, not
// the first sent: of eight requests sent at once, the one a step took alone
// (its router time drawn shortest) ends first and is not measured.
TEST(SimTest, TheWarmupIsTheFirstRequestToEnd) {
  Deployment d = OneWorker(1e-3, 1e-5, 1e-4);
  d.router_seconds = 5e-4;
  int not_first_sent = 0;
  for (uint64_t seed = 1; seed <= 10; ++seed) {
    Workload w = ClosedLoop(8, 128, 16, 8, /*warmup=*/1);
    w.seed = seed;
    const RunResult r = *Simulate(d, w);
    ASSERT_EQ(r.requests.size(), 9u);
    const RequestRecord* warm = nullptr;
    double first_end = INFINITY;
    for (const RequestRecord& q : r.requests) {
      first_end = std::min(first_end, q.finish);
      if (q.measured) continue;
      EXPECT_EQ(warm, nullptr) << "seed " << seed << ": two warm-up requests";
      warm = &q;
    }
    ASSERT_NE(warm, nullptr) << "seed " << seed;
    EXPECT_EQ(warm->finish, first_end) << "seed " << seed;
    not_first_sent += warm->id != 0;
    EXPECT_EQ(Summarize(r, Targets{}).measured, 8);
    // What a run that drops its ramp leaves out instead: the first sent.
    w.warmup_first_to_end = false;
    const RunResult sent = *Simulate(d, w);
    for (const RequestRecord& q : sent.requests) EXPECT_EQ(q.measured, q.id != 0);
  }
  EXPECT_GT(not_first_sent, 0);  // which one is a race the router times decide
}

// The loop's time ending a stream (stream_finish_seconds) holds it after
// the stream's last token left: the client's next request, sent then,
// waits for it, and the step is that much longer; a row's token leaves
// after the pass and its share of the per-row overhead.
TEST(SimTest, EndingAStreamHoldsTheLoop) {
  Deployment d = OneWorker(1e-3, 0, 0);  // every pass 1 ms
  d.router_seconds = 2e-4;
  d.random_router_time = false;
  d.monolithic_worker.step_overhead_per_row = 1e-4;
  d.monolithic_worker.stream_finish_seconds = 1e-3;
  const Workload w = ClosedLoop(1, 16, 2, 2);
  const RunResult r = *Simulate(d, w);
  ASSERT_EQ(r.requests.size(), 2u);
  // Routed at 0.2 ms, prompt pass to 1.2 ms (its first token), the row's
  // pass to 2.2 ms, its token out at 2.3 ms; the next request reaches the
  // router then, the worker at 2.5 ms, and waits for the loop to end the
  // stream (3.3 ms) before its own prompt pass (to 4.3 ms).
  EXPECT_NEAR(r.requests[0].first_token, 1.2e-3, 1e-12);
  EXPECT_NEAR(r.requests[0].finish, 2.3e-3, 1e-12);
  EXPECT_NEAR(r.requests[1].arrival, 2.3e-3, 1e-12);
  EXPECT_NEAR(r.requests[1].ttft(), 2.0e-3, 1e-12);
  ASSERT_EQ(r.workers.size(), 1u);
  EXPECT_NEAR(r.workers[0].busy_seconds, 4 * 1e-3 + 2 * 1e-4 + 2 * 1e-3, 1e-12);
  // Without it the worker is idle when the request comes, and starts it.
  d.monolithic_worker.stream_finish_seconds = 0;
  const RunResult free = *Simulate(d, w);
  EXPECT_NEAR(free.requests[1].ttft(), 2e-4 + 1e-3, 1e-12);
  // Two rows in a step, one of them ending its stream: its token leaves
  // after its place among the rows' shares (0.1 ms each), the loop ends it
  // (1 ms), and its client's next request (0.2 ms through the router)
  // arrives before the loop comes round and rides the next step.
  d.monolithic_worker.stream_finish_seconds = 1e-3;
  RunOptions traced;
  traced.trace_steps = true;
  const RunResult two = *Simulate(d, ClosedLoop(2, 16, 3, 3), traced);
  // Steps: [P0], [R0, P1], [R0 (its last), R1], [R1 (its last), P2] ...
  ASSERT_GE(two.steps.size(), 4u);
  const StepRecord& third = two.steps[2];
  ASSERT_EQ(third.rows.size(), 2u);
  ASSERT_EQ(third.chunks.size(), 0u);
  const int at = two.requests[third.rows[0]].id == 0 ? 0 : 1;  // request 0's place
  ASSERT_EQ(third.rows[at], 0);
  const double pass_end = third.start + 1e-3;
  EXPECT_NEAR(two.requests[0].finish, pass_end + (at + 1) * 1e-4, 1e-12);
  EXPECT_NEAR(third.seconds, 1e-3 + 2 * 1e-4 + 1e-3, 1e-12);  // the trace holds the hold too
  const StepRecord& fourth = two.steps[3];
  EXPECT_NEAR(fourth.start, third.start + third.seconds, 1e-12);
  ASSERT_EQ(fourth.chunks.size(), 1u);
  const RequestRecord& next = two.requests[fourth.chunks[0].first];
  EXPECT_EQ(next.client, two.requests[0].client);
  EXPECT_NEAR(next.arrival, two.requests[0].finish, 1e-12);
  ASSERT_EQ(fourth.rows.size(), 1u);
  EXPECT_EQ(fourth.rows[0], 1);
  // Negative or not finite: refused.
  d.monolithic_worker.stream_finish_seconds = -1e-3;
  EXPECT_NE(Simulate(d, w).status().message().find("stream_finish_seconds"), std::string::npos);
}

// 10 closed-loop clients against one worker whose decode batch is 4, the
// router bounding streams to the batch or not; steps traced.
RunResult TenClientsOnABatchOfFour(bool bound_streams, Workload* w) {
  Deployment d = OneWorker(1e-3, 1e-5, 1e-4);
  d.monolithic_worker.batch.max_decode_batch = 4;
  d.bound_streams = bound_streams;
  *w = ClosedLoop(10, 32, 20, 50, /*warmup=*/20);
  RunOptions o;
  o.trace_steps = true;
  return *Simulate(d, *w, o);
}

TEST(SimTest, DecodeRowsNeverExceedTheBatchSizeAndEveryRequestEnds) {
  Workload w;
  const RunResult r = TenClientsOnABatchOfFour(false, &w);  // streams past the batch take turns
  size_t most = 0;
  for (const StepRecord& s : r.steps) most = std::max(most, s.rows.size());
  EXPECT_EQ(most, 4u);
  int64_t rows = 0;
  for (const StepRecord& s : r.steps) rows += (int64_t)s.rows.size();
  // Every request's tokens after the first are decode rows.
  EXPECT_EQ(rows, int64_t(w.requests + w.warmup) * (w.output_tokens - 1));
  for (const RequestRecord& q : r.requests) EXPECT_GT(q.finish, q.first_token);
}

TEST(SimTest, TheRouterRefusesStreamsPastTheDecodeBatch) {
  // As the router's --max-streams-per-worker batch: 10 clients against a
  // batch of 4 get at most 4 streams in flight; the others are refused and
  // try again when one ends.
  Workload w;
  const RunResult r = TenClientsOnABatchOfFour(true, &w);
  int64_t refused = 0, served = 0;
  for (const RequestRecord& q : r.requests) {
    refused += q.refused();
    served += !q.refused();
    // The worker has KV for every client: a full batch refused them all.
    EXPECT_EQ(q.refusal, q.refused() ? Refusal::kBatchFull : Refusal::kNone) << q.id;
  }
  EXPECT_GT(refused, 0);
  EXPECT_GT(served, 0);
  int64_t rows = 0;
  for (const StepRecord& s : r.steps) {
    EXPECT_LE(s.rows.size(), 4u);
    rows += (int64_t)s.rows.size();
  }
  EXPECT_EQ(rows, served * (w.output_tokens - 1));  // every served request ran to its end
}

TEST(SimTest, ATpotTargetKeepsDecodingStepsShortUnderLongPrompts) {
  // Long prompts keep arriving beside decoding streams: without a target
  // the streams wait for whole 2000-token steps (0.1 s); with a 20 ms one,
  // the steps that decode stay near it (the worker's policy, its cost model
  // learned online from the simulated steps), and prompts pay for it.
  Deployment d = OneWorker(2e-3, 5e-5, 3e-4);
  Workload w;
  w.rate = 3;
  w.prompt_tokens = 2000;
  w.output_tokens = 100;
  w.requests = 200;
  RunOptions o;
  o.trace_steps = true;
  auto decode_step_p99 = [&](const RunResult& r) {
    std::vector<double> v;
    for (const StepRecord& s : r.steps) {
      if (!s.rows.empty()) v.push_back(s.seconds);
    }
    std::sort(v.begin(), v.end());
    return v[v.size() * 99 / 100];
  };
  const RunResult off = *Simulate(d, w, o);
  d.monolithic_worker.batch.tpot_target = 0.02;
  const RunResult on = *Simulate(d, w, o);
  EXPECT_GT(decode_step_p99(off), 0.09);
  EXPECT_LT(decode_step_p99(on), 0.025);
  EXPECT_GT(Summarize(on, {}).ttft_p50, Summarize(off, {}).ttft_p50);
}

TEST(SimTest, TheKvOfALongPromptIsOnTheWireAfterItsPass) {
  // 1P+1D, one request: the KV (1000 tokens x 100 kB = 100 MB over 1 GB/s,
  // 0.1 s) streams from the start of the prompt's pass (20 ms), so it lands
  // 0.1 s after the pass started, plus the latency.
  Deployment d;
  d.prefill = d.decode = 1;
  d.prefill_worker.pass = {0.01, 0, 1e-5, 0, 0, {}};
  d.decode_worker.pass = {1e-3, 1e-4, 0, 0, 0, {}};
  d.kv_bytes_per_token = 100000;
  d.num_layers = 10;
  d.link = {1e9, 1e-3};
  Workload w = ClosedLoop(1, 1000, 3, 1);
  const RunResult r = *Simulate(d, w);
  EXPECT_NEAR(r.requests[0].ttft(), 0.1 + 1e-3, 1e-12);
  // A short prompt's KV leaves with the last layer, after its pass.
  w.prompt_tokens = 100;  // 10 MB: 10 ms on the wire, 1 ms a layer
  const RunResult s = *Simulate(d, w);
  EXPECT_NEAR(s.requests[0].ttft(), 0.011 + 0.001 + 1e-3, 1e-12);
  EXPECT_NEAR(s.requests[0].finish - s.requests[0].first_token, 2 * 1.1e-3, 1e-12);
}

TEST(SimTest, ABusyDecodeWorkerSendsALandedPromptsFirstTokenAfterItsStep) {
  // 1P+1D, two prompts one prefill step apart (a 100-token budget): the
  // first's KV lands at an idle decode worker, which sends its first token
  // and starts a 50 ms step; the second's lands during that step, and its
  // first token goes out when the step ends (the worker takes the landed KV
  // between steps, as worker/scheduler.cc does).
  Deployment d;
  d.prefill = d.decode = 1;
  d.prefill_worker.pass = {0.01, 0, 1e-5, 0, 0, {}};
  d.prefill_worker.batch.token_budget = 100;
  d.decode_worker.pass = {0.05, 1e-4, 0, 0, 0, {}};
  d.kv_bytes_per_token = 1000;
  d.num_layers = 1;
  Workload w = ClosedLoop(2, 100, 4, 2);
  const RunResult r = *Simulate(d, w);
  const RequestRecord &a = r.requests[0], &b = r.requests[1];
  ASSERT_LT(a.first_token, b.first_token);
  EXPECT_NEAR(b.first_token, a.first_token + 0.05 + 1e-4, 1e-12);
  // Its KV landed well before: a prefill step (11 ms) after the first's.
  EXPECT_GT(b.first_token - a.first_token, 0.03);
  // Two tokens each: the first stream ends in that step, and the loop
  // holds 20 ms ending it before it sends the landed prompt's first token.
  d.decode_worker.stream_finish_seconds = 0.02;
  const RunResult held = *Simulate(d, ClosedLoop(2, 100, 2, 2));
  const RequestRecord &c = held.requests[0], &e = held.requests[1];
  EXPECT_NEAR(c.finish, c.first_token + 0.05 + 1e-4, 1e-12);
  EXPECT_NEAR(e.first_token, c.first_token + 0.05 + 1e-4 + 0.02, 1e-12);
}

TEST(SimTest, ABusyDecodeWorkerAnswersAReservationAfterItsStep) {
  // 1P+1D: the router sends a prompt to its prefill worker once the decode
  // worker has answered the Reserve call, which that worker's loop runs
  // between its steps (worker/scheduler.cc), stream-end holds included.
  // Open loop at 5 a second against 50 ms decode steps: a request that
  // arrives while the decode worker is stepping has its prompt's pass start
  // when that step ends (or when the prefill worker is next free), one that
  // arrives at an idle decode worker at once.
  Deployment d;
  d.prefill = d.decode = 1;
  d.prefill_worker.pass = {0.01, 0, 0, 0, 0, {}};
  d.decode_worker.pass = {0.05, 0, 0, 0, 0, {}};
  d.kv_bytes_per_token = 1000;
  d.link = {1e9, 0};
  Workload w;
  w.arrivals = Workload::Arrivals::kPoisson;
  w.rate = 5;
  w.requests = 40;
  w.warmup = 0;
  w.prompt_tokens = 100;
  w.output_tokens = 8;
  RunOptions o;
  o.trace_steps = true;
  for (double holds : {0.0, 0.02}) {
    d.decode_worker.stream_finish_seconds = holds;
    const RunResult r = *Simulate(d, w, o);
    // The end of `worker`'s step in flight at t, or -1.
    auto in_flight_end = [&](int worker, double t) {
      for (const StepRecord& s : r.steps) {
        if (s.worker == worker && s.start < t && t < s.start + s.seconds)
          return s.start + s.seconds;
      }
      return -1.0;
    };
    int waited = 0, at_once = 0;
    for (const RequestRecord& q : r.requests) {
      ASSERT_FALSE(q.refused());
      double pass_start = -1;
      for (const StepRecord& s : r.steps) {
        for (const auto& [id, tokens] : s.chunks) {
          if (id == q.id && s.worker == q.prefill_worker) pass_start = s.start;
        }
      }
      const double reserved = std::max(q.arrival, in_flight_end(q.decode_worker, q.arrival));
      // Then the prefill worker's first moment free: after its other
      // requests' passes running (or starting) then, one after another.
      double free = reserved;
      for (bool moved = true; moved;) {
        moved = false;
        for (const StepRecord& s : r.steps) {
          const bool own = std::any_of(s.chunks.begin(), s.chunks.end(),
                                       [&](const auto& c) { return c.first == q.id; });
          if (s.worker == q.prefill_worker && !own && s.start <= free &&
              free < s.start + s.seconds) {
            free = s.start + s.seconds;
            moved = true;
          }
        }
      }
      ++(reserved > q.arrival ? waited : at_once);
      EXPECT_NEAR(pass_start, free, 1e-12) << "request " << q.id << ", holds " << holds;
    }
    EXPECT_GT(waited, 10);  // most arrive while the decode worker steps
    EXPECT_GT(at_once, 0);  // and some while it is idle
  }
}

TEST(SimTest, TransfersShareALink) {
  // Two prefill workers send to one decode worker at once: its link carries
  // one KV at a time, so the second lands a transfer later.
  Deployment d;
  d.prefill = 2;
  d.decode = 1;
  d.prefill_worker.pass = {0.01, 0, 0, 0, 0, {}};
  d.decode_worker.pass = {1e-3, 1e-4, 0, 0, 0, {}};
  d.kv_bytes_per_token = 1000000;
  d.num_layers = 100;  // the last layer leaves 1 ms after the pass
  d.link = {1e9, 0};
  Workload w = ClosedLoop(2, 100, 1, 2);  // prompts: 0.1 s on the wire
  const RunResult r = *Simulate(d, w);
  std::vector<double> ttft = {r.requests[0].ttft(), r.requests[1].ttft()};
  std::sort(ttft.begin(), ttft.end());
  EXPECT_NEAR(ttft[0], 0.1, 1e-12);
  EXPECT_NEAR(ttft[1], 0.2, 1e-12);
  EXPECT_NE(r.requests[0].prefill_worker, r.requests[1].prefill_worker);
}

TEST(SimTest, TheRouterSeesQueuedPromptsAsOfTheLastHeartbeat) {
  // 2P+1D routing on queued prompt tokens alone (no weight on requests in
  // flight): two 1000-token prompts at once. Read exactly, the second sees
  // the first queued and takes the other prefill worker; with heartbeats
  // every 100 s both find the workers as they were (idle) and the tie goes
  // to the first, so the second waits a prompt's pass.
  Deployment d;
  d.prefill = 2;
  d.decode = 1;
  d.prefill_worker.pass = {0, 0, 1e-3, 0, 0, {}};  // 1 s a prompt
  d.decode_worker.pass = {1e-3, 1e-4, 0, 0, 0, {}};
  d.kv_bytes_per_token = 1;
  d.link = {1e9, 0};
  d.load_tokens = 0;
  Workload w = ClosedLoop(2, 1000, 1, 2);
  d.heartbeat_seconds = 0;
  const RunResult exact = *Simulate(d, w);
  EXPECT_NE(exact.requests[0].prefill_worker, exact.requests[1].prefill_worker);
  EXPECT_NEAR(std::max(exact.requests[0].ttft(), exact.requests[1].ttft()), 1.0,
              1e-5);  // + 1 kB of KV
  d.heartbeat_seconds = 100;
  const RunResult stale = *Simulate(d, w);
  EXPECT_EQ(stale.requests[0].prefill_worker, stale.requests[1].prefill_worker);
  EXPECT_NEAR(std::max(stale.requests[0].ttft(), stale.requests[1].ttft()), 2.0, 1e-5);
}

TEST(SimTest, APrefillWorkerCountsARequestUntilItsKvLanded) {
  // Prompts of 10 ms, answers of about 1.7 s (3 to 4 streams decoding at
  // 5 ms + 1 ms a row a step): a request is the prefill worker's only
  // while its prompt computes and its KV travels, so at each arrival both
  // prefill workers are (almost always) idle and the first takes it; were
  // requests counted there until they end, the decoding ones would push
  // half of the prompts to the second.
  Deployment d;
  d.prefill = 2;
  d.decode = 1;
  d.prefill_worker.pass = {0, 0, 1e-4, 0, 0, {}};
  d.decode_worker.pass = {5e-3, 1e-3, 0, 0, 0, {}};
  d.kv_bytes_per_token = 1;
  d.heartbeat_seconds = 0;
  Workload w;
  w.rate = 2;
  w.prompt_tokens = 100;
  w.output_tokens = 200;
  w.requests = 200;
  w.warmup = 0;
  const RunResult r = *Simulate(d, w);
  int first = 0;
  for (const RequestRecord& q : r.requests)
    first += q.prefill_worker == r.requests[0].prefill_worker;
  EXPECT_GT(first, 180);
}

TEST(SimTest, TheBusiestPoolIsNamedTheBound) {
  // 1P+1D under closed loop at 4 clients: prompts take 1 ms a pass, each
  // decode step 20 ms, so the decode worker steps all the time and the
  // prefill worker almost never.
  Deployment d;
  d.prefill = d.decode = 1;
  d.prefill_worker.pass = {1e-3, 0, 0, 0, 0, {}};
  d.decode_worker.pass = {0.02, 0, 0, 0, 0, {}};
  d.kv_bytes_per_token = 1000;
  Workload w = ClosedLoop(4, 100, 50, 40, 4);
  RunSummary s = Summarize(*Simulate(d, w), Targets{});
  EXPECT_GT(s.busy.decode, 0.95);
  EXPECT_LT(s.busy.prefill, 0.05);
  EXPECT_GE(s.busy.link, 0);
  EXPECT_LT(s.busy.monolithic, 0);  // no such pool
  EXPECT_EQ(NameBottleneck(s.busy, {}).rfind("the decode workers, ", 0), 0u)
      << NameBottleneck(s.busy, {});
  // The other way round: long prompts at 1 s a pass, one output token each.
  d.prefill_worker.pass = {1.0, 0, 0, 0, 0, {}};
  d.decode_worker.pass = {1e-3, 0, 0, 0, 0, {}};
  w.output_tokens = 2;
  s = Summarize(*Simulate(d, w), Targets{});
  EXPECT_EQ(NameBottleneck(s.busy, {}).rfind("the prefill workers, ", 0), 0u)
      << NameBottleneck(s.busy, {});
  // Open loop far below capacity: nothing is saturated.
  w.arrivals = Workload::Arrivals::kPoisson;
  w.rate = 0.05;  // a request every 20 s, served in about 1 s
  s = Summarize(*Simulate(d, w), Targets{});
  EXPECT_LT(s.busy.prefill, 0.2);
  EXPECT_NE(NameBottleneck(s.busy, {}).find("no pool saturated"), std::string::npos)
      << NameBottleneck(s.busy, {});
  EXPECT_EQ(
      NameBottleneck(s.busy, {.kv_full = 3}).rfind("KV memory (3 requests found no worker", 0), 0u);
  EXPECT_EQ(NameBottleneck(s.busy, {.kv_full = 2, .batch_full = 5})
                .rfind("the decode batch (5 requests found no place in a decode worker's batch) "
                       "and KV memory (2 requests",
                       0),
            0u)
      << NameBottleneck(s.busy, {.kv_full = 2, .batch_full = 5});
}

TEST(SimTest, GoodputSaysHowFarItMovesWithTheLatencies) {
  static_assert(kGoodputMargin == 0.10, "the requests below sit within 10% of the targets");
  // Five requests against TTFT 1.5 s and TPOT 50 ms: one well within, one
  // just within (TTFT 1.45 s: 10% longer misses), one just over (1.6 s: 10%
  // shorter meets), one far over, one just within on TPOT (48 ms: 10%
  // longer misses). The span: the first arrival (0) to the last finish (9.58 s).
  RunResult r;
  auto add = [&](double arrival, double ttft, double tpot) {
    RequestRecord q;
    q.id = int64_t(r.requests.size());
    q.measured = true;
    q.output_tokens = 11;
    q.arrival = arrival;
    q.first_token = arrival + ttft;
    q.finish = q.first_token + 10 * tpot;
    r.requests.push_back(q);
  };
  add(0, 1.0, 0.01);
  add(1, 1.45, 0.01);
  add(2, 1.6, 0.01);
  add(3, 3.0, 0.01);
  add(9, 0.1, 0.048);
  const RunSummary s = Summarize(r, Targets{1.5, 0.05});
  EXPECT_NEAR(s.goodput, 3 / 9.58, 1e-9);
  EXPECT_NEAR(s.goodput_if_slower, 1 / 9.58, 1e-9);
  EXPECT_NEAR(s.goodput_if_faster, 4 / 9.58, 1e-9);
  EXPECT_DOUBLE_EQ(s.met_fraction, 3.0 / 5);
}

TEST(SimTest, RequestsThatFindNoKvRoomAreRefusedAndTheRestServed) {
  Deployment d = OneWorker(1e-3, 1e-5, 1e-4);
  d.monolithic_worker.kv_blocks = 10;  // 160 tokens: two requests of 80
  Workload w = ClosedLoop(4, 60, 20, 40);
  const RunResult r = *Simulate(d, w);
  const RunSummary s = Summarize(r, {});
  EXPECT_GT(s.refusals.total(), 0);
  EXPECT_EQ(s.refusals.kv_full, s.refusals.total());  // 4 clients never fill a batch of 64
  // A refused client tries again when a request ends (not at once, which
  // would spend every request at the first instant): of the two clients
  // without room, one gets the slot each time a request ends.
  EXPECT_GE(s.measured, 10);
  EXPECT_EQ(s.refusals.total() + s.measured, 40);
  // Numbered clients (pdq bench --client-ids) run the same, and each one's
  // requests, refused ones and their retries included, follow one another.
  Workload numbered = w;
  numbered.client_ids = true;
  const RunResult n = *Simulate(d, numbered);
  ASSERT_EQ(n.requests.size(), r.requests.size());
  std::vector<double> last_end(4, -1);
  std::set<int> clients;
  for (size_t i = 0; i < n.requests.size(); ++i) {
    const RequestRecord& q = n.requests[i];
    EXPECT_EQ(q.finish, r.requests[i].finish) << q.id;
    EXPECT_EQ(q.refused(), r.requests[i].refused()) << q.id;
    ASSERT_GE(q.client, 0);
    ASSERT_LT(q.client, 4);
    EXPECT_GE(q.arrival, last_end[q.client]) << "client " << q.client << ", request " << q.id;
    last_end[q.client] = q.finish;
    clients.insert(q.client);
  }
  EXPECT_EQ(clients.size(), 4u);
  w.concurrency = 2;
  EXPECT_EQ(Summarize(*Simulate(d, w), {}).refusals.total(), 0);
}

TEST(SimTest, ASeedDecidesTheRun) {
  Deployment d = OneWorker(1e-3, 1e-5, 1e-4);
  d.monolithic_worker.noise = 0.1;
  Workload w;
  w.rate = 20;
  w.length_spread = 0.5;
  w.requests = 100;
  const RunResult a = *Simulate(d, w), b = *Simulate(d, w);
  ASSERT_EQ(a.requests.size(), b.requests.size());
  for (size_t i = 0; i < a.requests.size(); ++i) {
    EXPECT_EQ(a.requests[i].finish, b.requests[i].finish);
  }
  w.seed = 2;
  EXPECT_NE(Simulate(d, w)->end_time, a.end_time);
  const SeedSummary s = *RunSeeds(d, w, {}, 5);
  EXPECT_EQ(s.seeds, 5);
  EXPECT_GT(s.ttft_p90.half_width, 0);
  EXPECT_GT(s.ttft_p90.mean, s.ttft_p50.mean);
}

TEST(SimTest, BadDeploymentsAndWorkloadsAreRefusedByName) {
  Deployment d = OneWorker(1e-3, 1e-5, 1e-4);
  Workload w;
  EXPECT_TRUE(Validate(d, w).ok());
  Deployment none;
  EXPECT_FALSE(Validate(none, w).ok());
  Deployment only_decode = d;
  only_decode.decode = 1;
  only_decode.decode_worker.pass = {1e-3, 1e-4, 0, 0, 0, {}};
  EXPECT_FALSE(Validate(only_decode, w).ok());
  Deployment free = OneWorker(0, 0, 1e-4);
  EXPECT_NE(Validate(free, w).message().find("no time"), std::string::npos);
  Deployment negative = OneWorker(-1, 1e-5, 1e-4);
  EXPECT_NE(Validate(negative, w).message().find("coefficients"), std::string::npos);
  Workload long_one = w;
  long_one.prompt_tokens = 9000;
  EXPECT_NE(Validate(d, long_one).message().find("max_context"), std::string::npos);
  Workload no_rate = w;
  no_rate.rate = 0;
  EXPECT_NE(Validate(d, no_rate).message().find("rate"), std::string::npos);
  EXPECT_FALSE(Simulate(d, no_rate).ok());
  EXPECT_FALSE(RunSeeds(d, w, {}, 0).ok());
}

// An A/B rollout of two one-worker arms, "fast" (weight 1) and "slow"
// (weight 3, every pass four times dearer).
Deployment TwoArms() {
  Deployment d;
  Arm fast;
  static_cast<Workers&>(fast) = OneWorker(1e-3, 1e-5, 1e-4);
  fast.pool = "fast";
  fast.weight = 1;
  Arm slow = fast;
  slow.pool = "slow";
  slow.weight = 3;
  slow.monolithic_worker.pass = {4e-3, 4e-4, 4e-5, 0, 0, {}};
  d.arms = {fast, slow};
  return d;
}

TEST(SimTest, AnAbRolloutDrawsEachRequestsArmByWeightAndOnlyItsWorkersServeIt) {
  const Deployment d = TwoArms();
  EXPECT_EQ(d.Name(), "fast=1:1M,slow=3:1M");
  Workload w;
  w.rate = 50;
  w.requests = 2000;
  w.prompt_tokens = 16;
  w.output_tokens = 8;
  const RunResult r = *Simulate(d, w);
  ASSERT_EQ(r.workers.size(), 2u);
  EXPECT_EQ(r.workers[0].arm, 0);
  EXPECT_EQ(r.workers[1].arm, 1);
  int slow = 0;
  for (const RequestRecord& q : r.requests) {
    ASSERT_FALSE(q.refused());
    EXPECT_EQ(r.workers[q.decode_worker].arm, q.arm) << q.id;
    slow += q.arm == 1;
  }
  // 2020 Bernoulli(0.75) draws: a standard deviation of 0.0096.
  EXPECT_NEAR(double(slow) / double(r.requests.size()), 0.75, 5 * 0.0096);
  // Each arm alone: its own requests and worker, its own pace.
  const RunSummary fast_arm = Summarize(r, {}, 0), slow_arm = Summarize(r, {}, 1);
  const RunSummary all = Summarize(r, {});
  EXPECT_EQ(fast_arm.measured + slow_arm.measured, all.measured);
  EXPECT_GT(slow_arm.tpot_p50, 2 * fast_arm.tpot_p50);
  EXPECT_GT(slow_arm.busy.monolithic, fast_arm.busy.monolithic);
  const SeedSummary seeds = *RunSeeds(d, w, {}, 3);
  ASSERT_EQ(seeds.arms.size(), 2u);
  EXPECT_EQ(seeds.arms[1].pool, "slow");
  EXPECT_NEAR(seeds.arms[1].measured.mean / seeds.measured.mean, 0.75, 0.05);
}

TEST(SimTest, AnArmsFiguresAreOverTheSeedsThatDrewIt) {
  // One client, two requests a seed: some seeds draw the fast arm none. Each
  // request runs alone, so the arm's TPOT is one request's in every seed
  // that drew it, and a seed without it must not count as 0.
  const Deployment d = TwoArms();
  const Workload w = ClosedLoop(1, 16, 8, 2);
  const SeedSummary s = *RunSeeds(d, w, {}, 20);
  Deployment fast_alone;
  static_cast<Workers&>(fast_alone) = d.arms[0];
  const RunResult one = *Simulate(fast_alone, ClosedLoop(1, 16, 8, 1));
  ASSERT_GT(s.arms[0].seeds, 0);
  ASSERT_LT(s.arms[0].seeds, 20);  // some seeds drew it none
  EXPECT_NEAR(s.arms[0].tpot_p50.mean, one.requests[0].tpot(), 1e-12);
  EXPECT_NEAR(s.arms[0].ttft_p50.mean, one.requests[0].ttft(), 1e-12);
  EXPECT_NEAR(s.arms[0].measured.mean + s.arms[1].measured.mean, 2, 1e-12);
  EXPECT_LT(s.arms[0].measured.mean, 1);  // its share, counting the seeds without it
}

TEST(SimTest, AnArmsPromptsGoToItsOwnPrefillWorkers) {
  Deployment d;
  for (const char* pool : {"a", "b"}) {
    Arm arm;
    arm.pool = pool;
    arm.prefill = arm.decode = 1;
    arm.prefill_worker.pass = {1e-3, 0, 1e-5, 0, 0, {}};
    arm.decode_worker.pass = {1e-3, 1e-4, 0, 0, 0, {}};
    d.arms.push_back(arm);
  }
  d.kv_bytes_per_token = 1000;
  Workload w;
  w.rate = 20;
  w.requests = 200;
  w.prompt_tokens = 64;
  w.output_tokens = 4;
  const RunResult r = *Simulate(d, w);
  int b = 0;
  for (const RequestRecord& q : r.requests) {
    ASSERT_FALSE(q.refused());
    EXPECT_EQ(r.workers[q.prefill_worker].arm, q.arm) << q.id;
    EXPECT_EQ(r.workers[q.decode_worker].arm, q.arm) << q.id;
    b += q.arm;
  }
  EXPECT_GT(b, 50);
  EXPECT_LT(b, 150);
}

TEST(SimTest, OneArmOfAllTheWeightIsTheDeploymentWithoutASplit) {
  // The draw takes its own random numbers: the arrivals, lengths and noise
  // of a seed stay those of the same deployment without arms.
  Deployment plain = OneWorker(1e-3, 1e-5, 1e-4);
  plain.monolithic = 2;
  plain.monolithic_worker.noise = 0.1;
  Deployment split;
  Arm all;
  static_cast<Workers&>(all) = plain;
  all.pool = "all";
  split.arms = {all};
  Workload w;
  w.rate = 40;
  w.length_spread = 0.5;
  w.requests = 200;
  const RunResult a = *Simulate(plain, w), b = *Simulate(split, w);
  ASSERT_EQ(a.requests.size(), b.requests.size());
  for (size_t i = 0; i < a.requests.size(); ++i) {
    EXPECT_EQ(a.requests[i].arrival, b.requests[i].arrival);
    EXPECT_EQ(a.requests[i].finish, b.requests[i].finish);
    EXPECT_EQ(a.requests[i].decode_worker, b.requests[i].decode_worker);
  }
}

TEST(SimTest, BadAbRolloutsAreRefusedByName) {
  Workload w;
  EXPECT_TRUE(Validate(TwoArms(), w).ok());
  Deployment counts = TwoArms();
  counts.monolithic = 1;
  EXPECT_NE(Validate(counts, w).message().find("own counts must be 0"), std::string::npos);
  Deployment weight = TwoArms();
  weight.arms[1].weight = 0;
  EXPECT_NE(Validate(weight, w).message().find("weight of pool 'slow'"), std::string::npos);
  Deployment twice = TwoArms();
  twice.arms[1].pool = "fast";
  EXPECT_NE(Validate(twice, w).message().find("named twice"), std::string::npos);
  Deployment empty = TwoArms();
  empty.arms[1].monolithic = 0;
  EXPECT_NE(Validate(empty, w).message().find("arm 'slow': a deployment needs"), std::string::npos);
  Deployment free = TwoArms();
  free.arms[0].monolithic_worker.pass = {};
  EXPECT_NE(Validate(free, w).message().find("arm 'fast': monolithic_worker"), std::string::npos);
  Workload long_one = w;
  long_one.prompt_tokens = 9000;
  EXPECT_NE(Validate(TwoArms(), long_one).message().find("arm 'fast': the workload's longest"),
            std::string::npos);
  Deployment scaled = TwoArms();
  scaled.monolithic_hpa = HpaSpec{};
  EXPECT_NE(Validate(scaled, w).message().find("not modelled"), std::string::npos);
  Deployment sticky_alone = TwoArms();
  sticky_alone.arms.clear();
  sticky_alone.monolithic = 1;
  sticky_alone.monolithic_worker = TwoArms().arms[0].monolithic_worker;
  sticky_alone.split_sticky = true;
  EXPECT_NE(Validate(sticky_alone, w).message().find("sticky split needs"), std::string::npos);
  Workload open_ids = w;
  open_ids.client_ids = true;
  EXPECT_NE(Validate(TwoArms(), open_ids).message().find("not with open-loop"), std::string::npos);
}

// pdq bench --client-ids against a router with --split-sticky: every
// request of a client goes to the pool its id hashes to, the router's
// (policy::TrafficSplit::IndexOfClient of BenchClientId), whatever the
// seed; without ids, or without stickiness, each request is drawn.
TEST(SimTest, StickyClientsKeepThePoolTheirIdHashesTo) {
  Deployment d = TwoArms();
  d.split_sticky = true;
  Workload w = ClosedLoop(8, 16, 8, 200);
  w.client_ids = true;
  const policy::TrafficSplit split =
      *policy::TrafficSplit::Make({{"fast", d.arms[0].weight}, {"slow", d.arms[1].weight}});
  std::vector<int> arms_seen;
  for (uint64_t seed : {1, 2}) {
    w.seed = seed;
    const RunResult r = *Simulate(d, w);
    std::vector<int> per_client(8, 0);
    std::vector<double> last_finish(8, -1);
    for (const RequestRecord& q : r.requests) {  // in the order they were sent
      ASSERT_GE(q.client, 0);
      ASSERT_LT(q.client, 8);
      EXPECT_EQ(q.arm, split.IndexOfClient(BenchClientId(q.client))) << "client " << q.client;
      ASSERT_FALSE(q.refused());
      EXPECT_EQ(r.workers[q.decode_worker].arm, q.arm);
      // A client sends its next request when its last has ended, not before.
      EXPECT_GE(q.arrival, last_finish[q.client]) << "request " << q.id;
      last_finish[q.client] = q.finish;
      ++per_client[q.client];
    }
    // The faster pool's clients sent more of the 200 (closed loop).
    for (int c = 0; c < 8; ++c) EXPECT_GT(per_client[c], 0) << c;
    int fast = 0, slow = 0, fast_clients = 0;
    for (int c = 0; c < 8; ++c) {
      const bool in_fast = split.IndexOfClient(BenchClientId(c)) == 0;
      (in_fast ? fast : slow) += per_client[c];
      fast_clients += in_fast;
    }
    if (fast_clients > 0 && fast_clients < 8) {
      EXPECT_GT(double(fast) / fast_clients, double(slow) / (8 - fast_clients));
    }
    for (const RequestRecord& q : r.requests) arms_seen.push_back(q.arm);
  }
  // Both seeds sent the same clients to the same pools: the same runs.
  EXPECT_TRUE(std::equal(arms_seen.begin(), arms_seen.begin() + 200, arms_seen.begin() + 200));
  // Without ids a client's requests are drawn: some client sees both pools.
  for (bool ids : {false, true}) {
    Deployment drawn = TwoArms();
    drawn.split_sticky = ids;  // ids without stickiness, then stickiness without ids
    Workload v = ClosedLoop(8, 16, 8, 200);
    v.client_ids = !ids;
    const RunResult r = *Simulate(drawn, v);
    std::vector<std::set<int>> pools(8);
    for (const RequestRecord& q : r.requests) pools[q.client].insert(q.arm);
    EXPECT_TRUE(
        std::any_of(pools.begin(), pools.end(), [](const auto& p) { return p.size() == 2; }));
  }
}

// A profile of one precision whose decode steps are dear next to its
// prompts, and a 10 GB/s link.
Profile DecodeBoundProfile() {
  Profile p;
  p.cpu = "test";
  p.num_layers = 10;
  p.kv_bytes_per_token = 10000;
  p.block_tokens = 16;
  p.max_context = 4096;
  PassProfile pass;
  pass.precision = "fp16";
  pass.threads = 1;
  pass.time = {5e-3, 2e-3, 2e-5, 0, 0, {}};
  p.passes = {pass};
  p.links = {{"tcp", {1e10, 1e-4}}};
  return p;
}

// For the co-located tests: `p`'s first pass copied as a w4a16 pass, and
// the fp16/w4a16 split probe at its thread count, factors left to the test.
SplitProfile AddW4a16PassAndSplit(Profile* p) {
  PassProfile w4 = p->passes[0];
  w4.precision = "w4a16";
  p->passes.push_back(w4);
  SplitProfile split;
  split.prefill_precision = "fp16";
  split.decode_precision = "w4a16";
  split.threads = p->passes[0].threads;
  return split;
}

// 30 requests/s of 200 tokens in and 40 out on DecodeBoundProfile's worker.
PlanQuery DecodeBoundQuery() {
  PlanQuery q;
  q.workload.rate = 30;
  q.workload.prompt_tokens = 200;
  q.workload.output_tokens = 40;
  q.workload.requests = 150;
  q.targets = {0.5, 0.03};
  q.pairs = {{"fp16", "fp16"}};
  q.max_workers = 8;
  return q;
}

TEST(SimPlanTest, TheSmallestDeploymentThatMeetsTheTargetsIsRecommended) {
  const PlanQuery q = DecodeBoundQuery();
  const Profile profile = DecodeBoundProfile();
  const SimPlan plan = *PlanBySimulation(profile, q, {});
  ASSERT_GE(plan.best, 0);
  const PlanOption& best = plan.options[plan.best];
  EXPECT_TRUE(best.meets);
  EXPECT_EQ(best.workers, plan.workers);
  // Keeping up, it delivers every arrival's tokens: the cost is the
  // workers' price over them.
  EXPECT_NEAR(best.cost_per_million_output_tokens,
              best.workers * q.worker_hour_price / 3600 /
                  (q.workload.rate * double(q.workload.output_tokens)) * 1e6,
              1e-9 * best.cost_per_million_output_tokens);
  std::printf("recommended: %s\n", Describe(best).c_str());
  // Every shape of that size was tried: n monolithic and n - 1 splits.
  EXPECT_EQ((int)plan.options.size(), plan.workers);
  EXPECT_GT(plan.workers, 1);  // the load needs more than one worker
  // A deployment of the same shape one worker smaller does not meet.
  Deployment smaller;
  ASSERT_TRUE(ParseDeployment(best.deployment, &smaller).ok());
  int& one = smaller.monolithic > 0 ? smaller.monolithic : smaller.decode;
  --one;
  if (smaller.monolithic + smaller.prefill + smaller.decode > 0 &&
      (smaller.monolithic > 0 || smaller.decode > 0)) {
    Precisions p;
    p.monolithic = p.prefill = p.decode = "fp16";
    ASSERT_TRUE(SpecsFromProfile(profile, p, {}, &smaller).ok());
    const SeedSummary s = *RunSeeds(smaller, q.workload, q.targets, q.seeds);
    EXPECT_LT(s.met_fraction.mean - s.met_fraction.half_width, q.attainment);
  }
  const std::vector<Sensitivity> s = *PlanSensitivity(profile, q, {}, plan, 0.2);
  ASSERT_EQ(s.size(), 6u);
  // Dearer decode steps never make a smaller deployment enough.
  for (const Sensitivity& x : s) {
    if (x.term == "decode" && x.factor > 1) {
      Deployment d;
      ASSERT_TRUE(ParseDeployment(x.recommendation.substr(0, x.recommendation.find(' ')), &d).ok());
      EXPECT_GE(d.monolithic + d.prefill + d.decode, plan.workers) << x.recommendation;
    }
  }
}

// Each term of plan's sensitivity scales its own coefficients and no other's:
// decode the step's fixed and per-row time, decode attention (not prompt
// attention), the row steps and the loop's time; prompt the prompt tokens
// and their attention; link the KV links' time.
TEST(SimPlanTest, ScalingAProfileTermScalesItsCoefficientsOnly) {
  Profile p = DecodeBoundProfile();
  PassProfile& pass = p.passes[0];
  pass.time.per_pair = 3e-9;
  pass.time.per_decode_pair = 7e-9;
  pass.time.row_steps = {{1, 1e-4}, {8, 2e-4}};
  pass.step_overhead = 1e-4;
  pass.step_overhead_per_row = 1e-5;
  pass.stream_finish_seconds = 2e-4;
  SplitProfile split;
  split.prefill_precision = split.decode_precision = "fp16";
  split.decode_step_overhead = 3e-4;
  split.decode_step_overhead_per_row = 3e-5;
  p.splits = {split};

  const Profile d = *ScaleProfileTerm(p, "decode", 1.5);
  const PassProfile& dp = d.passes[0];
  EXPECT_DOUBLE_EQ(dp.time.fixed, 1.5 * pass.time.fixed);
  EXPECT_DOUBLE_EQ(dp.time.per_row, 1.5 * pass.time.per_row);
  EXPECT_DOUBLE_EQ(dp.time.per_decode_pair, 1.5 * 7e-9);
  EXPECT_DOUBLE_EQ(dp.time.row_steps[1].second, 1.5 * 2e-4);
  EXPECT_DOUBLE_EQ(dp.time.row_steps[1].first, 8);
  EXPECT_DOUBLE_EQ(dp.step_overhead, 1.5e-4);
  EXPECT_DOUBLE_EQ(dp.step_overhead_per_row, 1.5e-5);
  EXPECT_DOUBLE_EQ(dp.stream_finish_seconds, 3e-4);
  EXPECT_DOUBLE_EQ(d.splits[0].decode_step_overhead, 4.5e-4);
  EXPECT_DOUBLE_EQ(d.splits[0].decode_step_overhead_per_row, 4.5e-5);
  EXPECT_DOUBLE_EQ(dp.time.per_token, pass.time.per_token);
  EXPECT_DOUBLE_EQ(dp.time.per_pair, 3e-9);
  EXPECT_DOUBLE_EQ(d.links[0].link.bytes_per_second, p.links[0].link.bytes_per_second);

  const Profile q = *ScaleProfileTerm(p, "prompt", 1.5);
  EXPECT_DOUBLE_EQ(q.passes[0].time.per_token, 1.5 * pass.time.per_token);
  EXPECT_DOUBLE_EQ(q.passes[0].time.per_pair, 4.5e-9);
  EXPECT_DOUBLE_EQ(q.passes[0].time.per_decode_pair, 7e-9);
  EXPECT_DOUBLE_EQ(q.passes[0].time.fixed, pass.time.fixed);
  EXPECT_DOUBLE_EQ(q.passes[0].step_overhead, 1e-4);
  EXPECT_DOUBLE_EQ(q.passes[0].stream_finish_seconds, 2e-4);
  EXPECT_DOUBLE_EQ(q.splits[0].decode_step_overhead, 3e-4);

  const Profile l = *ScaleProfileTerm(p, "link", 2);
  EXPECT_DOUBLE_EQ(l.links[0].link.bytes_per_second, p.links[0].link.bytes_per_second / 2);
  EXPECT_DOUBLE_EQ(l.links[0].link.latency_seconds, 2 * p.links[0].link.latency_seconds);
  EXPECT_DOUBLE_EQ(l.passes[0].time.per_decode_pair, 7e-9);
  EXPECT_DOUBLE_EQ(l.passes[0].step_overhead_per_row, 1e-5);
  EXPECT_DOUBLE_EQ(l.splits[0].decode_step_overhead_per_row, 3e-5);

  EXPECT_FALSE(ScaleProfileTerm(p, "attention", 1.2).ok());
  EXPECT_FALSE(ScaleProfileTerm(p, "decode", 0).ok());
  EXPECT_FALSE(ScaleProfileTerm(p, "decode", std::nan("")).ok());
}

// Capacity at cluster scale: each deployment's rate meets the targets and a
// rate at most the tolerance above it misses them; a larger cluster serves
// more; goodput per core and cost follow from the rate's run.
TEST(SimPlanTest, AClusterSweepFindsEachDeploymentsHighestRateWithinTheTargets) {
  const Profile profile = DecodeBoundProfile();
  ClusterQuery cq;
  cq.plan = DecodeBoundQuery();
  cq.plan.seeds = 2;
  cq.plan.worker_hour_price = 3600;  // 1 a worker-second
  cq.nodes = {2, 4};
  cq.prefill_shares = {0.25, 0.5};
  const std::vector<ClusterPoint> points = *SweepCluster(profile, cq, {});
  // 2 nodes: 2M and 1P+1D (both shares round to one prefill worker); 4: 4M,
  // 1P+3D, 2P+2D.
  std::vector<std::string> shapes;
  for (const ClusterPoint& p : points) shapes.push_back(p.deployment);
  EXPECT_EQ(shapes, (std::vector<std::string>{"2M", "1P+1D", "4M", "1P+3D", "2P+2D"}));
  EXPECT_EQ(ClusterCoresPerNode(profile, {}), 1);
  auto meets = [&](const ClusterPoint& p, double rate) {
    Deployment d;
    EXPECT_TRUE(ParseDeployment(p.deployment, &d).ok());
    Precisions pr;
    pr.monolithic = pr.prefill = pr.decode = "fp16";
    EXPECT_TRUE(SpecsFromProfile(profile, pr, {}, &d).ok());
    Workload w = cq.plan.workload;
    w.rate = rate;
    const SeedSummary s = *RunSteady(d, w, cq.plan.targets, cq.plan.seeds, cq.plan.attainment);
    return s.refusals.total() == 0 &&
           s.met_fraction.mean - s.met_fraction.half_width >= cq.plan.attainment;
  };
  for (const ClusterPoint& p : points) {
    SCOPED_TRACE(p.deployment);
    ASSERT_GT(p.rate, 0);
    EXPECT_GT(p.missed_rate, p.rate);
    EXPECT_LE(p.missed_rate, p.rate * (1 + cq.tolerance) * (1 + 1e-9));
    EXPECT_TRUE(meets(p, p.rate));
    EXPECT_FALSE(meets(p, p.missed_rate));
    EXPECT_GE(p.runs, 3);  // bracketed, then bisected
    EXPECT_DOUBLE_EQ(p.goodput_tokens_per_second,
                     p.rate * p.result.met_fraction.mean * double(cq.plan.workload.output_tokens));
    EXPECT_GE(p.result.met_fraction.mean, cq.plan.attainment);
    EXPECT_DOUBLE_EQ(p.tokens_per_second_per_core, p.goodput_tokens_per_second / p.nodes);
    EXPECT_NEAR(p.cost_per_million_output_tokens, p.nodes / p.goodput_tokens_per_second * 1e6,
                1e-9 * p.cost_per_million_output_tokens);
  }
  EXPECT_GT(points[2].rate, 1.5 * points[0].rate) << "4 monolithic workers against 2";
  // Bad queries are refused.
  ClusterQuery bad = cq;
  bad.nodes = {1};
  EXPECT_EQ(SweepCluster(profile, bad, {}).status().code(), absl::StatusCode::kInvalidArgument);
  bad = cq;
  bad.prefill_shares = {1.0};
  EXPECT_EQ(SweepCluster(profile, bad, {}).status().code(), absl::StatusCode::kInvalidArgument);
}

// A monolithic pool under an HPA on active sequences, fed a busy phase
// then a quiet one: the HPA adds workers that serve only once started,
// removes them after its scale-down window, and a removed worker finishes
// what it holds (no request is refused or cut).
TEST(SimAutoscaleTest, AnHpaFollowsTheLoadAndDrainsWhatItRemoves) {
  Deployment d = OneWorker(0.01, 1e-4, 2e-3);  // at most 500 tokens/s a worker
  HpaSpec h;
  h.max_replicas = 6;
  h.metrics = {{PodMetric::kActiveSequences, 4}};
  d.monolithic_hpa = h;
  d.pod_start_seconds = 20;
  // The router's --max-streams-per-worker off: until new pods serve, the
  // first takes every stream (with the bound, past 64 it refuses).
  d.bound_streams = false;
  Workload w;
  w.prompt_tokens = 100;
  w.output_tokens = 50;
  w.phases = {{90, 10}, {400, 0.2}};  // 500 tokens/s asked, then 10
  w.warmup = 0;
  w.requests = 1000;  // past the quiet phase into the next busy one
  const RunResult r = *Simulate(d, w);

  ASSERT_FALSE(r.scaling.empty());
  EXPECT_EQ(r.scaling[0].from, 1);
  EXPECT_GT(r.scaling[0].to, 1);
  EXPECT_LE(r.scaling[0].time, 30);  // the first syncs of the busy phase
  double last_up = 0, first_down = -1;
  int peak = 1;
  for (const ScaleRecord& s : r.scaling) {
    EXPECT_EQ(s.role, Role::kBoth);
    EXPECT_LE(s.to, 6);
    if (s.to > s.from && first_down < 0) last_up = s.time;
    if (s.to < s.from && first_down < 0) first_down = s.time;
    peak = std::max(peak, s.to);
  }
  EXPECT_GE(peak, 4);
  // Down only once the window (300 s) has passed every higher recommendation.
  ASSERT_GT(first_down, 0) << "never scaled down in the quiet phase";
  EXPECT_GE(first_down, last_up + 300);
  EXPECT_LT(first_down, 90 + 400);

  // Every request finished, on a worker that was serving when it came.
  int removed_served = 0;
  for (const RequestRecord& q : r.requests) {
    ASSERT_FALSE(q.refused()) << q.id;
    EXPECT_GE(q.finish, q.first_token);
    const WorkerRecord& wr = r.workers[q.decode_worker];
    ASSERT_GE(wr.ready, 0) << q.id;
    EXPECT_LE(wr.ready, q.arrival + 1e-9) << q.id;
    EXPECT_GE(wr.gone, q.finish) << q.id;
    removed_served += wr.gone < r.end_time && q.decode_worker > 0;
  }
  EXPECT_GT(removed_served, 0) << "no request ran on a worker the HPA later removed";
  const RunSummary sum = Summarize(r, Targets{});
  EXPECT_EQ(sum.peak_workers, peak);
  EXPECT_GT(sum.mean_workers, 1);
  EXPECT_LT(sum.mean_workers, peak);
}

TEST(SimAutoscaleTest, BadAutoscalingIsRefusedByField) {
  Deployment d = OneWorker(0.01, 1e-4, 2e-3);
  Workload w;
  HpaSpec h;
  h.metrics = {{PodMetric::kActiveSequences, 4}};
  d.prefill_hpa = h;
  EXPECT_NE(Validate(d, w).message().find("prefill pool"), std::string::npos);
  d.prefill_hpa.reset();
  h.max_replicas = 0;
  d.monolithic_hpa = h;
  EXPECT_NE(Validate(d, w).message().find("monolithic HPA"), std::string::npos);
  d.monolithic_hpa.reset();
  w.phases = {{60, 0}};
  EXPECT_NE(Validate(d, w).message().find("no rate phase"), std::string::npos);
  w.phases = {{0, 1}};
  EXPECT_NE(Validate(d, w).message().find("seconds > 0"), std::string::npos);
}

TEST(SimPlanTest, AutoscalersAreChosenByReplayingTheRecommendation) {
  const PlanQuery q = DecodeBoundQuery();
  const Profile profile = DecodeBoundProfile();
  const SimPlan plan = *PlanBySimulation(profile, q, {});
  ASSERT_GE(plan.best, 0);
  const PlanOption& best = plan.options[plan.best];
  ASSERT_GT(best.workers, 2) << best.deployment;
  AutoscaleQuery a;
  a.phases = {{150, 0.1}, {40, 1}};  // mostly quiet: autoscaling should pay
  a.pod_start_seconds = 1;
  // Kubernetes' defaults but time scaled to the short trace: a sync every
  // second and a 30 s scale-down window.
  for (HpaSpec& h : a.base) {
    h.sync_seconds = 1;
    h.scale_down.stabilization_window_seconds = 30;
  }
  const AutoscalePlan r = *PlanAutoscaling(profile, q, {}, best, a);
  EXPECT_EQ(r.requests, 2 * (150 * 3 + 40 * 30));
  ASSERT_EQ(r.phases.size(), 2u);
  EXPECT_EQ(r.phases[1].rate, 30);
  // Prompts: what one worker computes in half the 0.5 s TTFT target.
  EXPECT_NEAR(r.queued_tokens, 0.25 * 200 / (5e-3 + 200 * 2e-5 + 200 * 201 / 2.0 * 0), 1e-6);
  ASSERT_FALSE(r.tries.empty());
  ASSERT_GE(r.chosen, 0);
  for (size_t i = 0; i < r.tries.size(); ++i) {
    EXPECT_EQ(r.tries[i].sequences, kSequenceTargets[i]);
    if (r.tries[i].meets) {
      EXPECT_GE(r.tries[i].replay.mean_workers.mean, r.tries[r.chosen].replay.mean_workers.mean);
    }
  }
  EXPECT_LT(r.tries[r.chosen].replay.mean_workers.mean, r.fixed.mean_workers.mean);
  EXPECT_NEAR(r.fixed.mean_workers.mean, best.workers, 1e-9);
  // The chosen HPAs scale exactly the recommendation's pools, up to twice
  // their planned size.
  Deployment d;
  ASSERT_TRUE(ParseDeployment(best.deployment, &d).ok());
  const int counts[3] = {d.prefill, d.decode, d.monolithic};  // by Role
  for (int role = 0; role < 3; ++role) {
    ASSERT_EQ(r.hpas[role].has_value(), counts[role] > 0) << role;
    if (r.hpas[role]) {
      EXPECT_EQ(r.hpas[role]->max_replicas, std::max(2, 2 * counts[role]));
    }
  }
}

// A deployment that falls behind its load looks as if it kept up in a run
// that ends within its ramp (it starts from idle workers); the plan's runs
// reach the steady state, where it misses, and one that keeps up still
// meets.
TEST(SimPlanTest, ADeploymentBehindItsLoadIsJudgedAtSteadyStateNotInItsRamp) {
  Deployment d;
  ASSERT_TRUE(ParseDeployment("1M", &d).ok());
  Precisions p;
  p.monolithic = p.prefill = p.decode = "fp16";
  ASSERT_TRUE(SpecsFromProfile(DecodeBoundProfile(), p, {}, &d).ok());
  auto meets = [](const SeedSummary& r) {
    return r.refusals.total() == 0 && r.met_fraction.mean - r.met_fraction.half_width >= 0.9;
  };
  // 600 output tokens/s asked of a worker that decodes at most 500 (a step
  // of 5 ms + 2 ms a row).
  Workload w;
  w.rate = 10;
  w.prompt_tokens = 20;
  w.output_tokens = 60;
  w.requests = 40;
  w.warmup = 0;
  const Targets t{2, 0.2};
  const SeedSummary ramp = *RunSeeds(d, w, t, 3);
  ASSERT_TRUE(meets(ramp)) << ramp.met_fraction.mean << " refused " << ramp.refusals.total();
  Workload ran;
  const SeedSummary steady = *RunSteady(d, w, t, 3, 0.9, &ran);
  EXPECT_GT(ran.warmup, 0);
  EXPECT_FALSE(meets(steady)) << steady.met_fraction.mean;
  // Half the load: about 4 streams at a time, each step 13 ms; it meets, and
  // its warm-up spans two lifetimes of arrivals.
  w.rate = 5;
  const SeedSummary easy = *RunSteady(d, w, t, 3, 0.9, &ran);
  EXPECT_TRUE(meets(easy)) << easy.met_fraction.mean << " refused " << easy.refusals.total();
  const double lifetime = easy.ttft_p90.mean + easy.tpot_p90.mean * 59;
  EXPECT_GE(ran.warmup, std::floor(kSteadyLifetimes * lifetime * w.rate));
  EXPECT_GE(ran.requests, 40);
}

TEST(SimPlanTest, APodStartsInItsModelLoadAndStartUpProbe) {
  Profile p = DecodeBoundProfile();
  Deployment d;
  ASSERT_TRUE(ParseDeployment("1P+1D", &d).ok());
  Precisions fp16{"fp16", "fp16", "fp16", ""};
  // A profile from before load times were measured: the caller must say.
  EXPECT_EQ(PodStartSeconds(p, fp16, {}, d).status().code(), absl::StatusCode::kNotFound);
  p.passes[0].load_seconds = 2.5;
  PassProfile w4 = p.passes[0];
  w4.precision = "w4a16";
  w4.load_seconds = 4;
  p.passes.push_back(w4);
  // The prefill worker: 2.5 s, then a 16- and a 128-token prompt at 5 ms +
  // 0.02 ms a token; the decode worker (no probe) loads in 2.5 s too.
  EXPECT_NEAR(*PodStartSeconds(p, fp16, {}, d), 2.5 + 0.005 + 16 * 2e-5 + 0.005 + 128 * 2e-5,
              1e-12);
  // W4A16 decode workers load slower and set the pace.
  EXPECT_NEAR(*PodStartSeconds(p, {"fp16", "w4a16", "fp16", ""}, {}, d), 4, 1e-12);
  // A monolithic worker with two models loads both.
  Deployment m;
  ASSERT_TRUE(ParseDeployment("2M", &m).ok());
  EXPECT_NEAR(*PodStartSeconds(p, {"fp16", "w4a16", "w4a16", "fp16"}, {}, m),
              6.5 + 0.005 + 16 * 2e-5 + 0.005 + 128 * 2e-5, 1e-12);
  EXPECT_EQ(ProfileFromJson(ProfileToJson(p))->Pass("w4a16")->load_seconds, 4);
}

// A pass measured served (pdq profile's served probe) runs in the simulator
// at its served time, all its parts scaled, unless the options ask for the
// passes as timed alone; both models of a two-precision monolithic worker
// take their own factor. The factor and its levels survive the file; a
// factor of 0 or less is refused by field.
TEST(SimPlanTest, ServedPassesTakeTheProfilesServedFactor) {
  Profile p = DecodeBoundProfile();
  PassProfile w8 = p.passes[0];
  w8.precision = "w8a8";
  p.passes.push_back(w8);
  p.passes[0].served_factor = 1.25;
  p.passes[0].served = {{4, 128, 512, 500, 3.9, 0.5, 0.0131, 0.0105, 0.001, -1}};
  Deployment d;
  ASSERT_TRUE(ParseDeployment("1M", &d).ok());
  ASSERT_TRUE(SpecsFromProfile(p, {"w8a8", "fp16", "fp16", "w8a8"}, {}, &d).ok());
  EXPECT_DOUBLE_EQ(d.monolithic_worker.pass.fixed, 5e-3 * 1.25);
  EXPECT_DOUBLE_EQ(d.monolithic_worker.pass.per_row, 2e-3 * 1.25);
  EXPECT_DOUBLE_EQ(d.monolithic_worker.pass.per_token, 2e-5 * 1.25);
  // Attention takes its own factor where the profile has one.
  p.passes[0].time.per_pair = 1e-7;
  p.passes[0].time.per_decode_pair = 5e-7;
  p.passes[0].served_pair_factor = 3;
  ASSERT_TRUE(SpecsFromProfile(p, {"w8a8", "fp16", "fp16", "w8a8"}, {}, &d).ok());
  EXPECT_DOUBLE_EQ(d.monolithic_worker.pass.per_pair, 3e-7);
  EXPECT_DOUBLE_EQ(d.monolithic_worker.pass.per_decode_pair, 15e-7);
  EXPECT_DOUBLE_EQ(d.monolithic_worker.pass.per_row, 2e-3 * 1.25);
  EXPECT_EQ(ProfileFromJson(ProfileToJson(p))->passes[0].served_pair_factor, 3);
  EXPECT_EQ(ProfileFromJson(ProfileToJson(p))->passes[0].time.per_decode_pair, 5e-7);
  {
    // A profile from before decode pairs were priced apart: its one price
    // for both.
    nlohmann::json j = nlohmann::json::parse(ProfileToJson(p));
    j["passes"][0].erase("per_decode_pair");
    EXPECT_EQ(ProfileFromJson(j.dump())->passes[0].time.per_decode_pair, 1e-7);
    j["passes"][0]["per_decode_pair"] = -1e-7;
    EXPECT_NE(ProfileFromJson(j.dump()).status().message().find("coefficients must be >= 0"),
              std::string::npos);
  }
  {
    // The served probe's prompt passes at one client price prompt tokens
    // and their attention; the rest keeps the steps' factors.
    Profile q = p;
    Deployment e = d;
    q.passes[0].served_prompt_factor = 0.8;
    q.passes[0].stream_finish_seconds = 4e-4;
    q.passes[0].served[0].streams_finished = 12;
    q.passes[0].served[0].finish_seconds = 4e-4;
    q.passes[0].served_prompts = {{1, 64, 3, 64, 0.006, 0.0075}, {1, 512, 3, 512, 0.02, 0.025}};
    ASSERT_TRUE(SpecsFromProfile(q, {"w8a8", "fp16", "fp16", ""}, {}, &e).ok());
    EXPECT_DOUBLE_EQ(e.monolithic_worker.pass.per_token, 2e-5 * 0.8);
    EXPECT_DOUBLE_EQ(e.monolithic_worker.pass.per_pair, 1e-7 * 0.8);
    EXPECT_DOUBLE_EQ(e.monolithic_worker.pass.per_decode_pair, 15e-7);
    EXPECT_DOUBLE_EQ(e.monolithic_worker.pass.fixed, 5e-3 * 1.25);
    EXPECT_DOUBLE_EQ(e.monolithic_worker.pass.per_row, 2e-3 * 1.25);
    EXPECT_DOUBLE_EQ(e.monolithic_worker.stream_finish_seconds, 4e-4);
    // Passes alone ignore it, and files keep it and its levels.
    WorkerOptions idle;
    idle.idle_passes = true;
    ASSERT_TRUE(SpecsFromProfile(q, {"w8a8", "fp16", "fp16", ""}, idle, &e).ok());
    EXPECT_DOUBLE_EQ(e.monolithic_worker.pass.per_token, 2e-5);
    EXPECT_EQ(e.monolithic_worker.stream_finish_seconds, 0);
    absl::StatusOr<Profile> read = ProfileFromJson(ProfileToJson(q));
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_EQ(read->passes[0].served_prompt_factor, 0.8);
    ASSERT_EQ(read->passes[0].served_prompts.size(), 2u);
    EXPECT_EQ(read->passes[0].served_prompts[1].prompt_tokens, 512);
    EXPECT_EQ(read->passes[0].served_prompts[1].pass_seconds, 0.02);
    EXPECT_EQ(read->passes[1].served_prompt_factor, 0);  // none measured: none written or read
    EXPECT_EQ(read->passes[0].stream_finish_seconds, 4e-4);
    EXPECT_EQ(read->passes[0].served[0].streams_finished, 12);
    EXPECT_EQ(read->passes[0].served[0].finish_seconds, 4e-4);
    EXPECT_EQ(read->passes[1].stream_finish_seconds, 0);
    nlohmann::json j = nlohmann::json::parse(ProfileToJson(q));
    EXPECT_FALSE(j["passes"][1].contains("served_prompt_factor"));
    j["passes"][0]["stream_finish_seconds"] = -1;
    EXPECT_NE(ProfileFromJson(j.dump()).status().message().find(
                  "passes[0].stream_finish_seconds must be >= 0"),
              std::string::npos);
    j["passes"][0]["stream_finish_seconds"] = 4e-4;
    j["passes"][0]["served_prompt_factor"] = -0.5;
    EXPECT_NE(ProfileFromJson(j.dump()).status().message().find(
                  "passes[0].served_prompt_factor must be >= 0"),
              std::string::npos);
  }
  p.passes[0].time.per_pair = 0;
  p.passes[0].time.per_decode_pair = 0;
  p.passes[0].served_pair_factor = 0;
  EXPECT_DOUBLE_EQ(d.monolithic_worker.prompt_pass.fixed, 5e-3);  // w8a8: not measured served
  WorkerOptions alone;
  alone.idle_passes = true;
  ASSERT_TRUE(SpecsFromProfile(p, {"w8a8", "fp16", "fp16", "w8a8"}, alone, &d).ok());
  EXPECT_DOUBLE_EQ(d.monolithic_worker.pass.fixed, 5e-3);
  // A request's decoding takes the served steps' time.
  Workload w = ClosedLoop(1, 100, 20, 2);
  ASSERT_TRUE(SpecsFromProfile(p, {"w8a8", "fp16", "fp16", ""}, {}, &d).ok());
  const RunResult served = *Simulate(d, w);
  ASSERT_TRUE(SpecsFromProfile(p, {"w8a8", "fp16", "fp16", ""}, alone, &d).ok());
  const RunResult idle = *Simulate(d, w);
  const RequestRecord &a = served.requests[0], &b = idle.requests[0];
  EXPECT_NEAR((a.finish - a.first_token) / (b.finish - b.first_token), 1.25, 1e-9);

  // Where the passes left their line by rows, served too.
  p.passes[0].time.row_steps = {{1, 1e-3}, {8, 4e-3}};
  ASSERT_TRUE(SpecsFromProfile(p, {"w8a8", "fp16", "fp16", ""}, {}, &d).ok());
  ASSERT_EQ(d.monolithic_worker.pass.row_steps.size(), 2u);
  EXPECT_DOUBLE_EQ(d.monolithic_worker.pass.row_steps[1].second, 4e-3 * 1.25);
  ASSERT_TRUE(SpecsFromProfile(p, {"w8a8", "fp16", "fp16", ""}, alone, &d).ok());
  EXPECT_DOUBLE_EQ(d.monolithic_worker.pass.row_steps[1].second, 4e-3);
  // ... and a request's decoding takes them: one row, 1 ms more a step.
  const RunResult stepped = *Simulate(d, w);
  const RequestRecord& c = stepped.requests[0];
  EXPECT_NEAR((c.finish - c.first_token) - (b.finish - b.first_token),
              double(w.output_tokens - 1) * 1e-3, 1e-9);

  // The stepping loop's time outside the passes: each step with decode
  // rows, after its pass (served only).
  p.passes[0].step_overhead = 2e-4;
  p.passes[0].step_overhead_per_row = 1e-4;
  p.passes[0].served[0].overhead_seconds = 3e-4;
  ASSERT_TRUE(SpecsFromProfile(p, {"w8a8", "fp16", "fp16", ""}, alone, &d).ok());
  EXPECT_EQ(d.monolithic_worker.step_overhead, 0);
  const RunResult alone_again = *Simulate(d, w);
  ASSERT_TRUE(SpecsFromProfile(p, {"w8a8", "fp16", "fp16", ""}, {}, &d).ok());
  EXPECT_EQ(d.monolithic_worker.step_overhead, 2e-4);
  EXPECT_EQ(d.monolithic_worker.step_overhead_per_row, 1e-4);
  {
    Deployment e = d;
    ASSERT_TRUE(SpecsFromProfile(p, {"w8a8", "fp16", "fp16", ""}, alone, &e).ok());
    e.monolithic_worker.step_overhead = 2e-4;
    e.monolithic_worker.step_overhead_per_row = 1e-4;
    const RunResult loop = *Simulate(e, w);
    const RequestRecord &x = loop.requests[0], &y = alone_again.requests[0];
    EXPECT_NEAR((x.finish - x.first_token) - (y.finish - y.first_token),
                double(w.output_tokens - 1) * 3e-4, 1e-9);
    e.monolithic_worker.step_overhead = -1;
    EXPECT_NE(Simulate(e, w).status().message().find("step_overhead"), std::string::npos);
  }

  const Profile q = *ProfileFromJson(ProfileToJson(p));
  EXPECT_EQ(q.passes[0].step_overhead, 2e-4);
  EXPECT_EQ(q.passes[0].step_overhead_per_row, 1e-4);
  EXPECT_EQ(q.passes[0].served[0].overhead_seconds, 3e-4);
  ASSERT_EQ(q.passes[0].time.row_steps.size(), 2u);
  EXPECT_EQ(q.passes[0].time.row_steps[1], std::make_pair(8.0, 4e-3));
  {
    Profile bad = p;
    bad.passes[0].time.row_steps = {{8, 1e-3}, {1, 4e-3}};
    EXPECT_NE(ProfileFromJson(ProfileToJson(bad))
                  .status()
                  .message()
                  .find("passes[0].row_steps' rows must be >= 1 and ascending"),
              std::string::npos);
    nlohmann::json j = nlohmann::json::parse(ProfileToJson(p));
    j["passes"][0]["row_steps"][0] = {"x", 1e-3};
    EXPECT_NE(ProfileFromJson(j.dump()).status().message().find(
                  "passes[0].row_steps must be [rows, seconds] pairs"),
              std::string::npos);
    // Fields older profiles lack are still checked where present: refused by
    // name, not thrown.
    const nlohmann::json good = nlohmann::json::parse(ProfileToJson(p));
    for (const auto& [where, field, value, says] :
         std::vector<std::tuple<std::string, std::string, nlohmann::json, std::string>>{
             {"pass", "step_overhead", "x", "passes[0].step_overhead must be a number"},
             {"pass", "load_seconds", "x", "passes[0].load_seconds must be a number"},
             {"pass", "row_steps", 3, "passes[0].row_steps must be an array"},
             {"pass", "served", "x", "passes[0].served must be an array"},
             {"level", "overhead_seconds", "x", "passes[0].served[0].overhead_seconds must be"},
             {"level", "prompt_tokens", 1.5,
              "passes[0].served[0].prompt_tokens must be an integer"},
             {"top", "links", "x", "profile: links must be an array"}}) {
      nlohmann::json bad = good;
      nlohmann::json& at = where == "pass"    ? bad["passes"][0]
                           : where == "level" ? bad["passes"][0]["served"][0]
                                              : bad;
      at[field] = value;
      EXPECT_NE(ProfileFromJson(bad.dump()).status().message().find(says), std::string::npos)
          << field << ": " << ProfileFromJson(bad.dump()).status();
    }
  }
  p.passes[0].time.row_steps.clear();
  EXPECT_EQ(q.passes[0].served_factor, 1.25);
  ASSERT_EQ(q.passes[0].served.size(), 1u);
  EXPECT_EQ(q.passes[0].served[0].clients, 4);
  EXPECT_EQ(q.passes[0].served[0].steps, 500);
  EXPECT_EQ(q.passes[0].served[0].model_seconds, 0.0105);
  EXPECT_EQ(q.passes[1].served_factor, 0);  // written without one, read without one
  std::string bad = ProfileToJson(p);
  bad.replace(bad.find("\"served_factor\": 1.25"), 21, "\"served_factor\": -1.0");
  EXPECT_NE(ProfileFromJson(bad).status().message().find("passes[0].served_factor must be > 0"),
            std::string::npos)
      << bad;
}

// A prefill and a decode worker sharing a machine (--co-located) run on the
// profile's split probe of their pair instead of their passes' served
// factors: the prefill pass times prefill_factor (attention too), the
// decode steps times decode_factor and decode_pair_factor, with the split's
// loop time outside them. A profile without that pair says how to measure
// it; the probe survives the file and a bad factor is refused by field.
TEST(SimPlanTest, AnAbRolloutsArmsComeFromTheRoutersSplitAndEachPoolsPrecisions) {
  Profile p = DecodeBoundProfile();
  PassProfile w4 = p.passes[0];
  w4.precision = "w4a16";
  w4.time.per_row = 5e-4;
  PassProfile w8 = p.passes[0];
  w8.precision = "w8a8";
  w8.time.per_token = 1e-5;
  p.passes.push_back(w4);
  p.passes.push_back(w8);
  Deployment d;
  d.monolithic = 3;
  const absl::StatusOr<std::vector<Precisions>> arms = ArmsFromProfile(
      p, "fp16=90, quant=10", "quant=1P+2D:w8a8/w4a16, fp16=1M:fp16", WorkerOptions{}, &d);
  ASSERT_TRUE(arms.ok()) << arms.status();
  EXPECT_EQ(d.monolithic, 0);
  ASSERT_EQ(d.arms.size(), 2u);
  EXPECT_EQ(d.Name(), "fp16=90:1M,quant=10:1P+2D");
  ASSERT_EQ(arms->size(), 2u);
  EXPECT_EQ((*arms)[0].monolithic, "fp16");
  EXPECT_EQ((*arms)[0].monolithic_prompt, "");
  EXPECT_EQ((*arms)[1].prefill, "w8a8");
  EXPECT_EQ((*arms)[1].decode, "w4a16");
  EXPECT_EQ(d.arms[1].decode_worker.pass.per_row, 5e-4);
  EXPECT_EQ(d.arms[1].prefill_worker.pass.per_token, 1e-5);
  EXPECT_EQ(d.kv_bytes_per_token, p.kv_bytes_per_token);
  EXPECT_EQ(d.link.bytes_per_second, 1e10);
  // A monolithic arm of a pair computes prompts on a second model.
  ASSERT_TRUE(ArmsFromProfile(p, "a=1", "a=2M:w8a8/w4a16", WorkerOptions{}, &d).ok());
  EXPECT_FALSE(d.arms[0].monolithic_worker.fused);
  EXPECT_EQ(d.arms[0].monolithic_worker.prompt_pass.per_token, 1e-5);
  Workload w;
  EXPECT_TRUE(Validate(d, w).ok());
  for (const auto& [split, arms_text, message] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"", "a=1M:fp16", "no pools"},
           {"a=0", "a=1M:fp16", "--split: the weight"},
           {"a=1,b=1", "a=1M:fp16", "pool 'b' of --split has no workers"},
           {"a=1", "a=1M:fp16,b=1M:fp16", "pool 'b' is not in --split"},
           {"a=1", "a=1M:fp16,a=2M:fp16", "named twice"},
           {"a=1", "a", "is not POOL=DEPLOYMENT:PREFILL/DECODE"},
           {"a=1", "a=1M", "pool 'a': '1M' is not DEPLOYMENT:PREFILL/DECODE"},
           {"a=1", "a=1M:fp16/", "is not DEPLOYMENT:PREFILL/DECODE"},
           {"a=1", "a=1X:fp16", "pool 'a': deployment: '1X'"},
           {"a=1", "a=1M:int3", "pool 'a': "},
       }) {
    const absl::StatusOr<std::vector<Precisions>> bad =
        ArmsFromProfile(p, split, arms_text, WorkerOptions{}, &d);
    ASSERT_FALSE(bad.ok()) << split << " " << arms_text;
    EXPECT_NE(bad.status().message().find(message), std::string::npos)
        << split << " " << arms_text << ": " << bad.status();
  }
}

// The served probe's one-row factor: a decode step of one row takes its
// pass times it, the factor falling linearly to the next point's and held
// there; a step with prompt tokens (in either model's pass), the passes as
// timed alone, a pass without a served factor and a co-located decode worker
// (the split probe's own fit) take none. The points survive the file and bad
// ones are refused by name.
TEST(SimTest, OneRowDecodeStepsTakeTheServedRowFactor) {
  WorkerSpec spec;
  spec.pass = {5e-3, 2e-3, 2e-5, 0, 0, {}};
  spec.row_factors = {{1, 1.5}, {3, 1}};
  EXPECT_EQ(RowFactorAt(spec.row_factors, 0), 1);
  EXPECT_DOUBLE_EQ(RowFactorAt(spec.row_factors, 1), 1.5);
  EXPECT_DOUBLE_EQ(RowFactorAt(spec.row_factors, 2), 1.25);
  EXPECT_DOUBLE_EQ(RowFactorAt(spec.row_factors, 16), 1);
  WorkerSim worker(Role::kBoth, spec);
  SimStep step;
  step.pass_work.decode_rows = 1;
  EXPECT_DOUBLE_EQ(worker.ModelTimes(step).pass, (5e-3 + 2e-3) * 1.5);
  step.pass_work.decode_rows = 2;
  EXPECT_DOUBLE_EQ(worker.ModelTimes(step).pass, (5e-3 + 4e-3) * 1.25);
  step.pass_work.prefill_tokens = 100;  // a prompt's tokens beside: not a decode step alone
  EXPECT_DOUBLE_EQ(worker.ModelTimes(step).pass, 5e-3 + 4e-3 + 100 * 2e-5);
  {
    // A two-model worker: a prompt chunk on the prompt model is beside too.
    WorkerSpec two = spec;
    two.fused = false;
    two.prompt_pass = spec.pass;
    WorkerSim w2(Role::kBoth, two);
    SimStep s;
    s.pass_work.decode_rows = 1;
    EXPECT_DOUBLE_EQ(w2.ModelTimes(s).pass, (5e-3 + 2e-3) * 1.5);
    s.prompt_work.prefill_tokens = 100;
    EXPECT_DOUBLE_EQ(w2.ModelTimes(s).pass, 5e-3 + 2e-3);
  }

  // From the profile: a request's one-row decoding takes it, as timed alone none.
  Profile p = DecodeBoundProfile();
  p.passes[0].served_factor = 1.25;
  p.passes[0].served = {{1, 128, 512, 500, 1, 0, 0.01, 0.007, 0.001, -1}};
  Deployment d;
  ASSERT_TRUE(ParseDeployment("1M", &d).ok());
  const Precisions fp16{"fp16", "fp16", "fp16", ""};
  ASSERT_TRUE(SpecsFromProfile(p, fp16, {}, &d).ok());
  const Workload w = ClosedLoop(1, 100, 20, 2);
  const RunResult before = *Simulate(d, w);
  p.passes[0].served_row_factors = {{1, 1.2}, {3, 1}};
  ASSERT_TRUE(SpecsFromProfile(p, fp16, {}, &d).ok());
  EXPECT_EQ(d.monolithic_worker.row_factors, p.passes[0].served_row_factors);
  const RunResult after = *Simulate(d, w);
  const RequestRecord &a = after.requests[0], &b = before.requests[0];
  EXPECT_NEAR((a.finish - a.first_token) / (b.finish - b.first_token), 1.2, 1e-9);
  WorkerOptions alone;
  alone.idle_passes = true;
  ASSERT_TRUE(SpecsFromProfile(p, fp16, alone, &d).ok());
  EXPECT_TRUE(d.monolithic_worker.row_factors.empty());
  {
    Profile unserved = p;  // factors over a fit the profile does not have
    unserved.passes[0].served_factor = 0;
    ASSERT_TRUE(SpecsFromProfile(unserved, fp16, {}, &d).ok());
    EXPECT_TRUE(d.monolithic_worker.row_factors.empty());
  }
  Deployment split;
  ASSERT_TRUE(ParseDeployment("1P+1D", &split).ok());
  ASSERT_TRUE(SpecsFromProfile(p, fp16, {}, &split).ok());
  EXPECT_EQ(split.decode_worker.row_factors, p.passes[0].served_row_factors);
  p.splits.push_back({"fp16", "fp16", 1, 1.1, {}, 1.2, 1.2, 0, 0, {}});
  WorkerOptions co;
  co.co_located = true;
  ASSERT_TRUE(SpecsFromProfile(p, fp16, co, &split).ok());
  EXPECT_TRUE(split.decode_worker.row_factors.empty());

  absl::StatusOr<Profile> read = ProfileFromJson(ProfileToJson(p));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->passes[0].served_row_factors, p.passes[0].served_row_factors);
  const nlohmann::json good = nlohmann::json::parse(ProfileToJson(p));
  EXPECT_FALSE(nlohmann::json::parse(ProfileToJson(DecodeBoundProfile()))["passes"][0].contains(
      "served_row_factors"));
  for (const auto& [value, says] : std::vector<std::pair<nlohmann::json, std::string>>{
           {nlohmann::json::parse("[[3, 1], [1, 1.2]]"),
            "passes[0].served_row_factors' rows must be >= 1 and ascending"},
           {nlohmann::json::parse("[[1, 0]]"), "their factors finite and > 0"},
           {nlohmann::json::parse("[[1]]"), "served_row_factors must be [rows, factor] pairs"},
           {"x", "passes[0].served_row_factors must be an array"}}) {
    nlohmann::json bad = good;
    bad["passes"][0]["served_row_factors"] = value;
    EXPECT_NE(ProfileFromJson(bad.dump()).status().message().find(says), std::string::npos)
        << value << ": " << ProfileFromJson(bad.dump()).status();
  }
  d.monolithic_worker.row_factors = {{0.5, 1.2}};
  EXPECT_NE(Simulate(d, w).status().message().find("row_factors' rows must be >= 1"),
            std::string::npos);
}

// A co-located decode worker runs on the split probe's factors only for
// steps that start while the prefill worker runs one: at one client (closed
// loop: the prompt, then its answer) its answers take as long as the two
// workers' apart; at eight, between that and the split probe's factors on
// every step. The prefill worker's passes take the split probe's always.
TEST(SimTest, CoLocatedWorkersTakeTheSplitFactorsOnlyWhileBothRun) {
  Profile p = DecodeBoundProfile();
  p.passes[0].served_factor = 1;
  SplitProfile split = AddW4a16PassAndSplit(&p);
  split.prefill_factor = split.decode_factor = split.decode_pair_factor = 1.5;
  p.splits.push_back(split);
  const Precisions pair{"fp16", "w4a16", "fp16", ""};
  Deployment apart, co;
  ASSERT_TRUE(ParseDeployment("1P+1D", &apart).ok());
  ASSERT_TRUE(ParseDeployment("1P+1D", &co).ok());
  ASSERT_TRUE(SpecsFromProfile(p, pair, {}, &apart).ok());
  WorkerOptions o;
  o.co_located = true;
  ASSERT_TRUE(SpecsFromProfile(p, pair, o, &co).ok());
  Deployment always = co;  // the split factors on every step
  always.decode_worker.neighbour_idle.reset();
  auto decode_seconds = [](const RunResult& r) {
    double s = 0;
    for (const RequestRecord& q : r.requests) s += q.finish - q.first_token;
    return s;
  };
  const Workload one = ClosedLoop(1, 200, 40, 4);
  const RunResult a = *Simulate(apart, one), c = *Simulate(co, one), b = *Simulate(always, one);
  EXPECT_NEAR(decode_seconds(c), decode_seconds(a), 1e-9);
  EXPECT_GT(decode_seconds(b), 1.3 * decode_seconds(a));
  EXPECT_NEAR(MeanTtft(c), MeanTtft(b), 1e-9);
  EXPECT_GT(MeanTtft(c), 1.3 * MeanTtft(a));
  const Workload eight = ClosedLoop(8, 2000, 40, 48);  // prompts long enough to overlap
  const double a8 = decode_seconds(*Simulate(apart, eight)),
               c8 = decode_seconds(*Simulate(co, eight)),
               b8 = decode_seconds(*Simulate(always, eight));
  EXPECT_GT(c8, 1.02 * a8) << a8 << " " << b8;
  EXPECT_LT(c8, 0.98 * b8);
  {
    // Step by step (two clients): a decode step takes the split factor
    // (x1.5 here, x1 apart) exactly when a prompt's pass is running as it
    // starts or starts at the same instant (its Prefill call answered by
    // the step's end); the last step of one answer and the next prompt meet
    // so, and must not count as beside an idle prefill worker.
    RunOptions traced;
    traced.trace_steps = true;
    const RunResult r = *Simulate(co, ClosedLoop(2, 200, 40, 12), traced);
    int beside = 0, alone = 0, at_once = 0;
    for (const StepRecord& s : r.steps) {
      if (r.workers[s.worker].role != Role::kDecode) continue;
      bool running = false, starting = false;
      for (const StepRecord& q : r.steps) {
        if (r.workers[q.worker].role != Role::kPrefill) continue;
        running |= q.start < s.start && s.start < q.start + q.seconds;
        starting |= q.start == s.start;
      }
      const double f = s.seconds / (5e-3 + 2e-3 * double(s.rows.size()));
      EXPECT_NEAR(f, running || starting ? 1.5 : 1.0, 1e-9) << s.start;
      (running || starting ? beside : alone) += 1;
      at_once += starting;
    }
    EXPECT_GT(beside, 0);
    EXPECT_GT(alone, 0);
    EXPECT_GT(at_once, 0);  // the case this checks
  }
  // A bad idle-neighbour spec is refused by name.
  co.decode_worker.neighbour_idle->step_overhead = -1;
  EXPECT_NE(Simulate(co, one).status().message().find("neighbour_idle: step_overhead"),
            std::string::npos);
}

TEST(SimPlanTest, CoLocatedWorkersTakeTheSplitProbesFactors) {
  Profile p = DecodeBoundProfile();
  p.passes[0].time.per_pair = 1e-7;
  p.passes[0].time.per_decode_pair = 4e-7;
  p.passes[0].served_factor = 1.25;
  p.passes[0].step_overhead = 5e-4;
  SplitProfile split = AddW4a16PassAndSplit(&p);
  split.prefill_factor = 1.2;
  split.decode_factor = 1.1;
  split.decode_pair_factor = 1.5;
  split.decode_step_overhead = 3e-4;
  split.decode_step_overhead_per_row = 2e-5;
  split.prefill_levels = {{8, 128, 20, 140, 0.13, 0.11}};
  split.decode_levels = {{8, 128, 256, 900, 7.5, 0, 0.02, 0.018, 0.002, 4e-4}};
  const Precisions pair{"fp16", "w4a16", "fp16", ""};
  Deployment d;
  ASSERT_TRUE(ParseDeployment("1P+1D", &d).ok());
  WorkerOptions co;
  co.co_located = true;
  // Without the pair's probe: NotFound, naming the command that measures it.
  const absl::Status missing = SpecsFromProfile(p, pair, co, &d);
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.message().find("--split-pairs fp16/w4a16"), std::string::npos) << missing;
  p.splits.push_back(split);
  ASSERT_TRUE(SpecsFromProfile(p, pair, co, &d).ok());
  EXPECT_DOUBLE_EQ(d.prefill_worker.pass.fixed, 5e-3 * 1.2);
  EXPECT_DOUBLE_EQ(d.prefill_worker.pass.per_token, 2e-5 * 1.2);
  EXPECT_DOUBLE_EQ(d.prefill_worker.pass.per_pair, 1e-7 * 1.2);
  EXPECT_DOUBLE_EQ(d.decode_worker.pass.per_row, 2e-3 * 1.1);
  EXPECT_DOUBLE_EQ(d.decode_worker.pass.per_pair, 1e-7 * 1.5);
  EXPECT_DOUBLE_EQ(d.decode_worker.pass.per_decode_pair, 4e-7 * 1.5);
  EXPECT_EQ(d.decode_worker.step_overhead, 3e-4);
  EXPECT_EQ(d.decode_worker.step_overhead_per_row, 2e-5);
  // While the prefill worker runs no step, the decode worker's run as the
  // one-worker probe served them; the prefill worker's passes have no such.
  EXPECT_TRUE(d.co_located);
  ASSERT_TRUE(d.decode_worker.neighbour_idle.has_value());
  EXPECT_FALSE(d.prefill_worker.neighbour_idle.has_value());
  EXPECT_DOUBLE_EQ(d.decode_worker.neighbour_idle->pass.per_row, 2e-3 * 1.25);
  EXPECT_EQ(d.decode_worker.neighbour_idle->step_overhead, 5e-4);
  // Not co-located: the passes' served factors and loop time, as before.
  ASSERT_TRUE(SpecsFromProfile(p, pair, {}, &d).ok());
  EXPECT_DOUBLE_EQ(d.prefill_worker.pass.fixed, 5e-3 * 1.25);
  EXPECT_EQ(d.decode_worker.step_overhead, 5e-4);
  EXPECT_FALSE(d.co_located);
  EXPECT_FALSE(d.decode_worker.neighbour_idle.has_value());
  // As timed alone, nothing served applies.
  co.idle_passes = true;
  ASSERT_TRUE(SpecsFromProfile(p, pair, co, &d).ok());
  EXPECT_DOUBLE_EQ(d.prefill_worker.pass.fixed, 5e-3);
  EXPECT_EQ(d.decode_worker.step_overhead, 0);
  // Another pair is another probe.
  co.idle_passes = false;
  EXPECT_EQ(SpecsFromProfile(p, {"w4a16", "fp16", "fp16", ""}, co, &d).code(),
            absl::StatusCode::kNotFound);

  const Profile q = *ProfileFromJson(ProfileToJson(p));
  ASSERT_EQ(q.splits.size(), 1u);
  const SplitProfile& r = q.splits[0];
  EXPECT_EQ(r.prefill_precision, "fp16");
  EXPECT_EQ(r.decode_precision, "w4a16");
  EXPECT_EQ(r.prefill_factor, 1.2);
  EXPECT_EQ(r.decode_pair_factor, 1.5);
  EXPECT_EQ(r.decode_step_overhead_per_row, 2e-5);
  ASSERT_EQ(r.prefill_levels.size(), 1u);
  EXPECT_EQ(r.prefill_levels[0].passes, 20);
  EXPECT_EQ(r.prefill_levels[0].pass_seconds, 0.13);
  ASSERT_EQ(r.decode_levels.size(), 1u);
  EXPECT_EQ(r.decode_levels[0].steps, 900);
  EXPECT_EQ(r.decode_levels[0].overhead_seconds, 4e-4);
  EXPECT_TRUE(ProfileFromJson(ProfileToJson(DecodeBoundProfile()))->splits.empty());
  const nlohmann::json good = nlohmann::json::parse(ProfileToJson(p));
  for (const auto& [field, value, says] :
       std::vector<std::tuple<std::string, nlohmann::json, std::string>>{
           {"prefill_factor", 0, "splits[0].prefill_factor, .decode_factor"},
           {"decode_step_overhead", -1, "splits[0].decode_step_overhead and"},
           {"threads", 0, "splits[0].threads must be >= 1"},
           {"prefill_levels", "x", "splits[0].prefill_levels must be an array"},
           {"decode_precision", 3, "splits[0].decode_precision must be a string"}}) {
    nlohmann::json bad = good;
    bad["splits"][0][field] = value;
    EXPECT_NE(ProfileFromJson(bad.dump()).status().message().find(says), std::string::npos)
        << field << ": " << ProfileFromJson(bad.dump()).status();
  }
  nlohmann::json bad = good;
  bad["splits"] = 1;
  EXPECT_NE(ProfileFromJson(bad.dump()).status().message().find("splits must be an array"),
            std::string::npos);
}

TEST(SimPlanTest, AProfileRoundTripsAndBadOnesAreRefusedByField) {
  const Profile p = DecodeBoundProfile();
  const Profile q = *ProfileFromJson(ProfileToJson(p));
  EXPECT_EQ(q.passes.size(), 1u);
  EXPECT_EQ(q.passes[0].time.per_row, p.passes[0].time.per_row);
  EXPECT_EQ(q.links[0].link.bytes_per_second, 1e10);
  EXPECT_EQ(q.kv_bytes_per_token, 10000);
  EXPECT_EQ(q.kv_dtype, "fp16");
  EXPECT_FALSE(q.Pass("w8a8").ok());
  // The cache's element type: kept, checked, and fp16 where a profile from
  // before it was recorded says nothing.
  Profile b = p;
  b.kv_dtype = "bf16";
  EXPECT_EQ(ProfileFromJson(ProfileToJson(b))->kv_dtype, "bf16");
  std::string dtype = ProfileToJson(b);
  dtype.replace(dtype.find("\"bf16\""), 6, "\"int8\"");
  EXPECT_NE(ProfileFromJson(dtype).status().message().find("model.kv_dtype is 'int8'"),
            std::string::npos);
  std::string old = ProfileToJson(b);
  old.erase(old.find(",\n    \"kv_dtype\": \"bf16\""),
            std::string(",\n    \"kv_dtype\": \"bf16\"").size());
  ASSERT_EQ(old.find("kv_dtype"), std::string::npos) << old;
  EXPECT_EQ(ProfileFromJson(old)->kv_dtype, "fp16");
  EXPECT_NE(ProfileFromJson("[1]").status().message().find("not a JSON object"), std::string::npos);
  std::string text = ProfileToJson(p);
  text.replace(text.find("\"per_row\""), 9, "\"per_rows\"");
  EXPECT_NE(ProfileFromJson(text).status().message().find("passes[0].per_row is missing"),
            std::string::npos);
  text = ProfileToJson(p);
  text.replace(text.find("\"pdq_profile\": 1"), 16, "\"pdq_profile\": 9");
  EXPECT_NE(ProfileFromJson(text).status().message().find("version 9"), std::string::npos);
  Deployment d;
  EXPECT_TRUE(ParseDeployment("2P+3D+1M", &d).ok());
  EXPECT_EQ(d.prefill + 10 * d.decode + 100 * d.monolithic, 2 + 30 + 100);
  EXPECT_FALSE(ParseDeployment("2Q", &d).ok());
  EXPECT_FALSE(ParseDeployment("P+D", &d).ok());
}

}  // namespace
}  // namespace pdq::sim
