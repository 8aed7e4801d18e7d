// The simulator batches as the worker does: a real scheduler (in-process,
// on a synthetic model) records every step it forms, what it holds before
// it and how long each pass took; a simulated worker (sim/worker_sim.h) is
// given the same arrivals at the same step boundaries and the same pass
// times, and must hold the same streams and form the same step, every step:
// the same decode rows in the same order and the same prompt chunks. Timing
// fidelity (the profile against real runs) is the validation's business;
// this checks that the control loop the simulator runs is the scheduler's.
#include <map>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "sim/worker_sim.h"
#include "test_models.h"
#include "worker/scheduler.h"

namespace pdq {
namespace {

using worker::StepTrace;

class Collect : public worker::TokenStream {
 public:
  void Send(const std::vector<int32_t>&, const std::string&) override {}
  void Finish(const absl::Status& st, const worker::Summary&) override {
    status = st;
    done.Notify();
  }
  int64_t Unsent() const override { return 0; }
  bool Cancelled() const override { return false; }
  absl::Status status;
  absl::Notification done;
};

struct Request {
  int prompt_tokens, max_tokens;
  bool batch = false;
};

struct Recorded {
  std::vector<StepTrace> steps;
  std::map<std::string, Request> requests;
};

// Serves `waves` of requests on a real scheduler, each wave sent once the
// one before has decoded a few steps, and records its steps.
Recorded ServeReal(const worker::SchedulerOptions& base, bool two_models,
                   const std::vector<std::vector<Request>>& waves) {
  testing::TestModel decode = testing::LoadOrDie("synthetic:tiny", 1);
  testing::TestModel prefill = testing::LoadOrDie("synthetic:tiny@w8a8", 1);
  Recorded rec;
  std::mutex mu;
  worker::SchedulerOptions o = base;
  o.prefix_cache = false;
  o.step_observer = [&](const StepTrace& t) {
    std::lock_guard lock(mu);
    rec.steps.push_back(t);
  };
  auto kv = decode.ctx->NewKvCache(1 << 14);
  EXPECT_TRUE(kv.ok());
  {
    worker::Scheduler sched(o, two_models ? prefill.ctx.get() : decode.ctx.get(), decode.ctx.get(),
                            std::move(*kv), nullptr);
    const int vocab = decode->config().vocab_size;
    std::vector<std::shared_ptr<Collect>> streams;
    int n = 0;
    for (const std::vector<Request>& wave : waves) {
      const int64_t at = sched.step_stats().decode_steps.load();
      while (n > 0 && sched.step_stats().decode_steps.load() < at + 3) {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
      for (const Request& r : wave) {
        worker::GenerationParams p;
        p.request_id = absl::StrCat("r", n);
        p.max_tokens = r.max_tokens;
        p.ignore_eos = true;
        p.batch = r.batch;
        {
          std::lock_guard lock(mu);
          rec.requests[p.request_id] = r;
        }
        auto s = std::make_shared<Collect>();
        streams.push_back(s);
        sched.Generate(testing::Tokens(r.prompt_tokens, vocab, 1000 + n), p, s);
        ++n;
      }
    }
    for (auto& s : streams) {
      s->done.WaitForNotification();
      EXPECT_TRUE(s->status.ok()) << s->status;
    }
  }
  return rec;
}

// Replays the recorded arrivals and pass times on a simulated worker;
// fails at the first step where it holds or forms something else.
void ExpectSameSteps(const Recorded& rec, const worker::SchedulerOptions& o, bool two_models) {
  sim::WorkerSpec spec;
  spec.fused = !two_models;
  spec.batch.max_decode_batch = o.max_decode_batch;
  spec.batch.token_budget = o.prefill_token_budget;
  spec.batch.tpot_target = absl::ToDoubleSeconds(o.tpot_target);
  spec.batch.block_tokens = 16;
  sim::WorkerSim w(sim::Role::kBoth, spec);
  std::map<std::string, int64_t> ids;
  std::vector<std::string> names;
  int64_t prompt_tokens = 0, rows = 0, full_with_others_left = 0, cut_short = 0;
  for (size_t k = 0; k < rec.steps.size(); ++k) {
    const StepTrace& t = rec.steps[k];
    SCOPED_TRACE(absl::StrCat("step ", k));
    for (const StepTrace::Stream& s : t.streams) {
      if (ids.contains(s.request_id)) continue;
      const Request& r = rec.requests.at(s.request_id);
      sim::SimStream n;
      n.id = (int64_t)names.size();
      n.prompt_tokens = r.prompt_tokens;
      n.output_tokens = r.max_tokens;
      n.batch_priority = r.batch;
      ids[s.request_id] = n.id;
      names.push_back(s.request_id);
      w.Add(n);
    }
    const std::vector<sim::SimStream>& held = w.stream_list();
    ASSERT_EQ(held.size(), t.streams.size());
    for (size_t i = 0; i < held.size(); ++i) {
      const policy::StreamView& v = t.streams[i].view;
      ASSERT_EQ(names[held[i].id], t.streams[i].request_id) << "stream " << i;
      ASSERT_EQ(held[i].stage, v.stage) << t.streams[i].request_id;
      ASSERT_EQ(held[i].prefilled, v.prefilled) << t.streams[i].request_id;
      ASSERT_EQ(held[i].prompt_tokens, v.prompt_tokens) << t.streams[i].request_id;
      if (v.stage == policy::StreamView::Stage::kDecoding) {
        ASSERT_EQ(held[i].kv_tokens, v.kv_tokens) << t.streams[i].request_id;
      }
    }
    const sim::SimStep step = w.Form();
    std::vector<std::string> step_rows;
    for (int64_t id : step.rows) step_rows.push_back(names[id]);
    ASSERT_EQ(step_rows, t.rows);
    std::vector<std::pair<std::string, int64_t>> chunks;
    for (const auto& [id, n] : step.chunks) chunks.emplace_back(names[id], n);
    ASSERT_EQ(chunks, t.chunks);
    for (const auto& c : t.chunks) {
      prompt_tokens += c.second;
      for (const StepTrace::Stream& s : t.streams) {
        cut_short += s.request_id == c.first && s.view.prompt_tokens - s.view.prefilled > c.second;
      }
    }
    rows += (int64_t)t.rows.size();
    int64_t decoding = 0;
    for (const StepTrace::Stream& s : t.streams) {
      decoding += s.view.stage == policy::StreamView::Stage::kDecoding;
    }
    full_with_others_left +=
        (int)t.rows.size() == o.max_decode_batch && decoding > (int64_t)t.rows.size();
    w.Finish(step, {t.pass_seconds, t.prompt_seconds});
  }
  EXPECT_EQ(w.streams(), 0);
  // The steps exercised the rules: full batches that left streams out (so
  // the rotation decided who ran) and prompts computed in parts.
  EXPECT_GT(full_with_others_left, 0);
  EXPECT_GT(cut_short, 0);
  // What the steps held, so a run that formed trivial steps is seen.
  std::printf("%zu steps: %lld decode rows, %lld prompt tokens\n", rec.steps.size(),
              (long long)rows, (long long)prompt_tokens);
}

// Prompts of several lengths (some longer than the budget, so they run in
// chunks), answers of several lengths, a batch-class request among them,
// more streams than the batch holds (so rows rotate), in three waves.
const std::vector<std::vector<Request>> kWaves = {
    {{40, 30}, {200, 12}, {16, 50}, {90, 20, true}},
    {{300, 8}, {24, 40}, {64, 25}},
    {{128, 10, true}, {500, 6}, {33, 35}},
};

class SimParityTest : public ::testing::TestWithParam<std::tuple<bool, absl::Duration>> {};

TEST_P(SimParityTest, TheSimulatedWorkerFormsTheSchedulersSteps) {
  const auto [two_models, target] = GetParam();
  worker::SchedulerOptions o;
  o.max_decode_batch = 3;
  o.prefill_token_budget = 96;
  o.tpot_target = target;
  const Recorded rec = ServeReal(o, two_models, kWaves);
  ASSERT_GT(rec.steps.size(), 20u);
  ExpectSameSteps(rec, o, two_models);
}

// One model and two (a W8A8 prompt model beside the decode model); no
// target, one no prompt fits (every decode step takes the least chunk) and
// one in between.
INSTANTIATE_TEST_SUITE_P(Policies, SimParityTest,
                         ::testing::Combine(::testing::Bool(),
                                            ::testing::Values(absl::ZeroDuration(),
                                                              absl::Microseconds(1),
                                                              absl::Microseconds(800))),
                         [](const auto& info) {
                           return absl::StrCat(
                               std::get<0>(info.param) ? "TwoModels" : "OneModel", "Target",
                               absl::ToInt64Microseconds(std::get<1>(info.param)), "us");
                         });

}  // namespace
}  // namespace pdq
