// The simulator batches as the worker does: a real scheduler (in-process,
// on a synthetic model) records every step it forms, what it holds before
// it and how long each pass took; a simulated worker (sim/worker_sim.h) is
// given the same arrivals at the same step boundaries and the same pass
// times, and must hold the same streams and form the same step, every step:
// the same decode rows in the same order and the same prompt chunks. Timing
// fidelity (the profile against real runs) is the validation's business;
// this checks that the control loop the simulator runs is the scheduler's.
// For every role: a monolithic worker (one model, or a W8A8 prompt model
// beside the decode model), and a prefill worker and a decode worker
// serving together in-process over the TCP KV transport, each replayed on
// its own simulated worker; over the three workloads of pdq sim and pdq
// eval (chat, summarize, analysis), scaled to the synthetic model.
#include <algorithm>
#include <future>
#include <map>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "kvtransfer/transport.h"
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

// Waits until `sched` decoded `steps` more steps than `at` or every stream
// sent so far has finished (short answers end before that many steps).
template <typename Streams>
void AwaitSteps(const worker::Scheduler& sched, int64_t at, int64_t steps, const Streams& streams) {
  auto all_done = [&] {
    for (const auto& s : streams) {
      if (!s->done.HasBeenNotified()) return false;
    }
    return true;
  };
  while (sched.step_stats().decode_steps.load() < at + steps && !all_done()) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

class Prefilled : public worker::PrefillCall {
 public:
  void Finish(const absl::StatusOr<worker::PrefillResult>& r) override {
    status = r.status();
    done.Notify();
  }
  bool Cancelled() const override { return false; }
  absl::Status status;
  absl::Notification done;
};

// What a prefill worker and a decode worker serving together recorded.
struct RecordedSplit {
  Recorded prefill, decode;
};

// Serves `waves` on a prefill worker and a decode worker in this process,
// the KV over the TCP transport as between processes: each request is
// reserved on the decode worker, prefilled on the prefill worker into that
// reservation, and decoded; both schedulers' steps are recorded.
RecordedSplit ServeSplit(const worker::SchedulerOptions& base,
                         const std::vector<std::vector<Request>>& waves) {
  testing::TestModel pm = testing::LoadOrDie("synthetic:tiny", 1);
  testing::TestModel dm = testing::LoadOrDie("synthetic:tiny", 1);
  RecordedSplit rec;
  std::mutex mu;
  worker::SchedulerOptions po = base, dopt = base;
  po.role = worker::Role::kPrefill;
  dopt.role = worker::Role::kDecode;
  po.prefix_cache = dopt.prefix_cache = false;
  po.step_observer = [&](const StepTrace& t) {
    std::lock_guard lock(mu);
    rec.prefill.steps.push_back(t);
  };
  // Held while a wave's decode calls are made: the decode worker's step
  // waits for the whole wave (a loaded machine may pause this thread
  // between the calls, and the first streams would decode alone).
  std::mutex issuing;
  dopt.step_observer = [&](const StepTrace& t) {
    { std::lock_guard wait(issuing); }
    std::lock_guard lock(mu);
    rec.decode.steps.push_back(t);
  };
  auto make = [](testing::TestModel& m) {
    auto kv = m.ctx->NewKvCache(1 << 14);
    EXPECT_TRUE(kv.ok());
    kvtransfer::TransportOptions to;
    to.layout = (*kv)->layout();
    to.regions = (*kv)->MemoryRegions();
    auto t = kvtransfer::CreateTransport("tcp", to);
    EXPECT_TRUE(t.ok()) << t.status();
    return std::make_pair(std::move(*kv), std::move(*t));
  };
  auto [pkv, ptransport] = make(pm);
  auto [dkv, dtransport] = make(dm);
  const KvLayout sender = pkv->layout();
  {
    worker::Scheduler prefill(po, pm.ctx.get(), nullptr, std::move(pkv), ptransport.get());
    worker::Scheduler decode(dopt, nullptr, dm.ctx.get(), std::move(dkv), dtransport.get());
    const int vocab = dm->config().vocab_size;
    std::vector<std::shared_ptr<Collect>> streams;
    std::vector<std::shared_ptr<Prefilled>> calls;
    struct DecodeCall {
      std::string reservation;
      worker::GenerationParams params;
      std::shared_ptr<Collect> stream;
    };
    std::vector<DecodeCall> decodes;
    int n = 0;
    for (const std::vector<Request>& wave : waves) {
      AwaitSteps(decode, decode.step_stats().decode_steps.load(), n > 0 ? 3 : 0, streams);
      for (const Request& r : wave) {
        const std::string id = absl::StrCat("r", n);
        const std::vector<int32_t> prompt = testing::Tokens(r.prompt_tokens, vocab, 1000 + n);
        {
          std::lock_guard lock(mu);
          rec.prefill.requests[id] = rec.decode.requests[id] = r;
        }
        worker::ReserveArgs ra;
        ra.request_id = id;
        ra.prompt_tokens = r.prompt_tokens;
        ra.max_tokens = r.max_tokens;
        ra.sender = sender;
        std::promise<absl::StatusOr<worker::Reservation>> reserved;
        decode.Reserve(ra, [&](absl::StatusOr<worker::Reservation> res) {
          reserved.set_value(std::move(res));
        });
        const absl::StatusOr<worker::Reservation> res = reserved.get_future().get();
        EXPECT_TRUE(res.ok()) << res.status();
        if (!res.ok()) break;
        worker::GenerationParams p;
        p.request_id = id;
        p.max_tokens = r.max_tokens;
        p.ignore_eos = true;
        p.batch = r.batch;
        auto s = std::make_shared<Collect>();
        streams.push_back(s);
        decodes.push_back({res->id, p, s});
        worker::PrefillArgs pa;
        pa.request_id = id;
        pa.prompt = prompt;
        pa.kv_address = dtransport->address();
        pa.transfer_token = res->transfer_token;
        pa.batch = r.batch;
        auto call = std::make_shared<Prefilled>();
        calls.push_back(call);
        prefill.Prefill(pa, call);
        ++n;
      }
      // The wave's decode calls once its prompts are prefilled, so its
      // streams decode together and the batch bound rotates them (each
      // decode of the synthetic model takes far less than a prefill).
      for (auto& c : calls) c->done.WaitForNotification();
      {
        std::lock_guard hold(issuing);
        for (auto& [id, p, s] : decodes) decode.Decode(id, p, s);
      }
      decodes.clear();
    }
    for (auto& c : calls) {
      c->done.WaitForNotification();
      EXPECT_TRUE(c->status.ok()) << c->status;
    }
    for (auto& s : streams) {
      s->done.WaitForNotification();
      EXPECT_TRUE(s->status.ok()) << s->status;
    }
  }
  return rec;
}

// Serves `waves` of requests on a real scheduler, each wave sent once the
// one before has decoded 3 steps, and records its steps. The waves after
// the first are sent from the step observer, on the scheduler's thread, so
// they arrive exactly 3 decode steps in however the machine schedules this
// test's threads (a test thread polling for the count woke, on a loaded
// machine, after the earlier waves had finished, and the batch was then
// never full). If a wave ends within 3 steps the next is sent once the
// scheduler is idle.
Recorded ServeReal(const worker::SchedulerOptions& base, bool two_models,
                   const std::vector<std::vector<Request>>& waves) {
  testing::TestModel decode = testing::LoadOrDie("synthetic:tiny", 1);
  testing::TestModel prefill = testing::LoadOrDie("synthetic:tiny@w8a8", 1);
  Recorded rec;
  std::mutex mu;
  worker::Scheduler* sched = nullptr;
  std::vector<std::shared_ptr<Collect>> streams;  // guarded by mu
  size_t sent = 0;                                // waves sent, guarded by mu
  int64_t decode_steps = 0, wave_step = 0;        // guarded by mu
  int n = 0;                                      // guarded by mu
  const int vocab = decode->config().vocab_size;
  // Sends the next wave; mu held.
  auto send_wave = [&] {
    for (const Request& r : waves[sent]) {
      worker::GenerationParams p;
      p.request_id = absl::StrCat("r", n);
      p.max_tokens = r.max_tokens;
      p.ignore_eos = true;
      p.batch = r.batch;
      rec.requests[p.request_id] = r;
      auto s = std::make_shared<Collect>();
      streams.push_back(s);
      sched->Generate(testing::Tokens(r.prompt_tokens, vocab, 1000 + n), p, s);
      ++n;
    }
    ++sent;
    wave_step = decode_steps;
  };
  worker::SchedulerOptions o = base;
  o.prefix_cache = false;
  o.step_observer = [&](const StepTrace& t) {
    std::lock_guard lock(mu);
    rec.steps.push_back(t);
    decode_steps += !t.rows.empty();
    if (sent < waves.size() && decode_steps >= wave_step + 3) send_wave();
  };
  auto kv = decode.ctx->NewKvCache(1 << 14);
  EXPECT_TRUE(kv.ok());
  {
    worker::Scheduler s(o, two_models ? prefill.ctx.get() : decode.ctx.get(), decode.ctx.get(),
                        std::move(*kv), nullptr);
    sched = &s;
    {
      std::lock_guard lock(mu);
      send_wave();
    }
    for (;;) {
      std::vector<std::shared_ptr<Collect>> all;
      {
        std::lock_guard lock(mu);
        all = streams;
      }
      for (auto& c : all) c->done.WaitForNotification();
      std::lock_guard lock(mu);
      if (streams.size() != all.size()) continue;  // the observer sent a wave meanwhile
      if (sent == waves.size()) break;
      send_wave();
    }
    for (auto& c : streams) EXPECT_TRUE(c->status.ok()) << c->status;
  }
  return rec;
}

enum class Mode { kOneModel, kTwoModels, kPrefill, kDecode };

// What the replayed steps held, so a run that formed trivial steps is seen.
struct Exercised {
  int64_t steps = 0, rows = 0, prompt_tokens = 0;
  int64_t full_with_others_left = 0;  // full batches that left decoding streams out
  int64_t cut_short = 0;              // prompt chunks that were not the whole rest
};

// Replays the recorded arrivals and pass times on a simulated worker of the
// role `mode` names (the spec pdq sim gives that role); fails at the first
// step where it holds or forms something else.
//  - A stream is added when the worker first holds it: a prompt (prefill
//    only, on a prefill worker), or on a decode worker a reservation
//    awaiting its KV, which is marked landed at the step where the worker
//    first decodes it.
//  - A prefill worker keeps a computed prompt (stage other) until the
//    decode worker acknowledges its KV; the simulator puts that time on the
//    link, not the worker. Neither enters a step, so the prefill worker's
//    streams in that stage are left out of the comparison.
void ExpectSameSteps(const Recorded& rec, const worker::SchedulerOptions& o, Mode mode,
                     Exercised* out) {
  using Stage = policy::StreamView::Stage;
  sim::WorkerSpec spec;
  spec.fused = mode != Mode::kTwoModels;
  spec.batch.max_decode_batch = o.max_decode_batch;
  spec.batch.token_budget = o.prefill_token_budget;
  spec.batch.tpot_target = absl::ToDoubleSeconds(o.tpot_target);
  spec.batch.block_tokens = 16;
  const sim::Role role = mode == Mode::kPrefill  ? sim::Role::kPrefill
                         : mode == Mode::kDecode ? sim::Role::kDecode
                                                 : sim::Role::kBoth;
  sim::WorkerSim w(role, spec);
  std::map<std::string, int64_t> ids;
  std::vector<std::string> names;
  Exercised& x = *out;
  // On a decode worker a one-token answer ends when its KV lands, with no
  // step (the first token came from the prefill worker), as the simulator
  // ends it: those held that the worker no longer holds (`real`) go.
  auto EndOneTokenAnswers = [&](const std::vector<StepTrace::Stream>& real) {
    std::vector<int64_t> gone;
    for (const sim::SimStream& h : w.stream_list()) {
      if (std::none_of(real.begin(), real.end(),
                       [&](const StepTrace::Stream& r) { return r.request_id == names[h.id]; })) {
        ASSERT_EQ(h.stage, Stage::kOther) << names[h.id] << " ended without its last step";
        ASSERT_LE(h.output_tokens, 1) << names[h.id] << " ended early";
        gone.push_back(h.id);
      }
    }
    for (int64_t id : gone) w.Remove(id);
  };
  for (size_t k = 0; k < rec.steps.size(); ++k) {
    const StepTrace& t = rec.steps[k];
    SCOPED_TRACE(absl::StrCat("step ", k));
    std::vector<StepTrace::Stream> real;
    for (const StepTrace::Stream& s : t.streams) {
      if (mode == Mode::kPrefill && s.view.stage == Stage::kOther) continue;
      real.push_back(s);
    }
    for (const StepTrace::Stream& s : real) {
      if (ids.contains(s.request_id)) {
        // A reservation whose KV landed (and whose decode call came) decodes now.
        if (mode == Mode::kDecode && s.view.stage == Stage::kDecoding) {
          const int64_t id = ids[s.request_id];
          for (const sim::SimStream& h : w.stream_list()) {
            if (h.id == id && h.stage == Stage::kOther) w.KvLanded(id);
          }
        }
        continue;
      }
      const Request& r = rec.requests.at(s.request_id);
      sim::SimStream n;
      n.id = (int64_t)names.size();
      n.prompt_tokens = r.prompt_tokens;
      n.output_tokens = r.max_tokens;
      n.batch_priority = r.batch;
      if (mode == Mode::kPrefill) {
        n.prefill_only = true;
        n.output_tokens = 1;
      }
      // (A decode worker steps only while something decodes: a reservation
      // may first be seen with its KV landed.)
      if (mode == Mode::kDecode) n.stage = Stage::kOther;
      ids[s.request_id] = n.id;
      names.push_back(s.request_id);
      w.Add(n);
      if (mode == Mode::kDecode && s.view.stage == Stage::kDecoding) w.KvLanded(n.id);
    }
    if (mode == Mode::kDecode) {
      EndOneTokenAnswers(real);
      if (::testing::Test::HasFatalFailure()) return;
    }
    const std::vector<sim::SimStream>& held = w.stream_list();
    ASSERT_EQ(held.size(), real.size());
    for (size_t i = 0; i < held.size(); ++i) {
      const policy::StreamView& v = real[i].view;
      ASSERT_EQ(names[held[i].id], real[i].request_id) << "stream " << i;
      ASSERT_EQ(held[i].stage, v.stage) << real[i].request_id;
      ASSERT_EQ(held[i].prompt_tokens, v.prompt_tokens) << real[i].request_id;
      if (mode != Mode::kDecode) {
        ASSERT_EQ(held[i].prefilled, v.prefilled) << real[i].request_id;
      }
      if (v.stage == Stage::kDecoding) {
        ASSERT_EQ(held[i].kv_tokens, v.kv_tokens) << real[i].request_id;
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
      x.prompt_tokens += c.second;
      for (const StepTrace::Stream& s : real) {
        x.cut_short +=
            s.request_id == c.first && s.view.prompt_tokens - s.view.prefilled > c.second;
      }
    }
    x.rows += (int64_t)t.rows.size();
    int64_t decoding = 0;
    for (const StepTrace::Stream& s : real) decoding += s.view.stage == Stage::kDecoding;
    x.full_with_others_left +=
        (int)t.rows.size() == o.max_decode_batch && decoding > (int64_t)t.rows.size();
    // A prefill worker's one model is the simulated worker's pass (the
    // scheduler times it as its prompt pass: it has no decode model).
    const sim::StepTimes times = mode == Mode::kPrefill
                                     ? sim::StepTimes{t.pass_seconds + t.prompt_seconds, 0}
                                     : sim::StepTimes{t.pass_seconds, t.prompt_seconds};
    w.Finish(step, times);
    ++x.steps;
  }
  // Answers of one token that landed after the last step.
  if (mode == Mode::kDecode) EndOneTokenAnswers({});
  EXPECT_EQ(w.streams(), 0);
  std::printf("%lld steps: %lld decode rows, %lld prompt tokens\n", (long long)x.steps,
              (long long)x.rows, (long long)x.prompt_tokens);
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
  Exercised x;
  ExpectSameSteps(rec, o, two_models ? Mode::kTwoModels : Mode::kOneModel, &x);
  if (HasFatalFailure()) return;
  // The steps exercised the rules: full batches that left streams out (so
  // the rotation decided who ran) and prompts computed in parts.
  EXPECT_GT(x.full_with_others_left, 0);
  EXPECT_GT(x.cut_short, 0);
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

// The workloads of pdq sim and pdq eval, scaled by 1/16 to the synthetic
// model: chat (128 prompt tokens, 512 out), summarize (2048, 32), analysis
// (2048, 512). Each wave spreads lengths around the means (a half to twice),
// with one batch-class request in the first and last wave; ten requests in
// three waves.
struct Workload {
  const char* name;
  int prompt_tokens, output_tokens;
};
constexpr Workload kWorkloads[] = {{"Chat", 8, 32}, {"Summarize", 128, 2}, {"Analysis", 128, 32}};

std::vector<std::vector<Request>> WavesOf(const Workload& w) {
  constexpr double kSpread[] = {1.0, 0.5, 2.0, 0.75, 1.5, 1.25, 0.6, 1.75, 0.9, 1.1};
  std::vector<std::vector<Request>> waves(3);
  for (int i = 0; i < 10; ++i) {
    Request r;
    r.prompt_tokens = std::max(1, (int)(w.prompt_tokens * kSpread[i]));
    r.max_tokens = std::max(1, (int)(w.output_tokens * kSpread[(i + 3) % 10]));
    r.batch = i == 2 || i == 8;
    waves[i < 4 ? 0 : i < 7 ? 1 : 2].push_back(r);
  }
  return waves;
}

const char* ModeName(Mode m) {
  switch (m) {
    case Mode::kOneModel:
      return "Monolithic";
    case Mode::kTwoModels:
      return "MonolithicTwoModels";
    case Mode::kPrefill:
      return "Prefill";
    case Mode::kDecode:
      return "Decode";
  }
  return "";
}

class SimRoleParityTest : public ::testing::TestWithParam<std::tuple<Mode, Workload>> {};

TEST_P(SimRoleParityTest, TheSimulatedWorkerFormsTheSchedulersSteps) {
  const auto [mode, workload] = GetParam();
  worker::SchedulerOptions o;
  // A decode worker's streams start as their KV lands, a little apart; a
  // batch of 2 is full often enough that the rotation always runs.
  o.max_decode_batch = mode == Mode::kDecode ? 2 : 3;
  o.prefill_token_budget = 96;
  o.tpot_target = mode == Mode::kOneModel || mode == Mode::kTwoModels ? absl::Microseconds(800)
                                                                      : absl::ZeroDuration();
  const std::vector<std::vector<Request>> waves = WavesOf(workload);
  Exercised x;
  if (mode == Mode::kPrefill || mode == Mode::kDecode) {
    const RecordedSplit rec = ServeSplit(o, waves);
    const Recorded& mine = mode == Mode::kPrefill ? rec.prefill : rec.decode;
    ExpectSameSteps(mine, o, mode, &x);
  } else {
    const Recorded rec = ServeReal(o, mode == Mode::kTwoModels, waves);
    ExpectSameSteps(rec, o, mode, &x);
  }
  if (HasFatalFailure()) return;
  // What the role's steps must have exercised: prompts in parts where they
  // exceed the budget, and (where answers run long enough) full batches
  // that rotated streams.
  if (mode != Mode::kDecode) {
    EXPECT_GT(x.prompt_tokens, 0);
    if (workload.prompt_tokens * 2 > o.prefill_token_budget) {
      EXPECT_GT(x.cut_short, 0);
    }
  }
  if (mode != Mode::kPrefill) {
    EXPECT_GT(x.rows, 0);
    if (workload.output_tokens >= 8) {
      EXPECT_GT(x.full_with_others_left, 0);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(RolesAndWorkloads, SimRoleParityTest,
                         ::testing::Combine(::testing::Values(Mode::kOneModel, Mode::kTwoModels,
                                                              Mode::kPrefill, Mode::kDecode),
                                            ::testing::ValuesIn(kWorkloads)),
                         [](const auto& info) {
                           return absl::StrCat(ModeName(std::get<0>(info.param)),
                                               std::get<1>(info.param).name);
                         });

}  // namespace
}  // namespace pdq
