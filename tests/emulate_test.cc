// The emulation tier (emulate/emulate.h): a timed pass takes the profile's
// time for its work, layer by layer, on an injected clock; its logits pick
// the script's token for each position; a weightless model refuses the CPU;
// and emulated prefill and decode workers serve through the router, moving
// real KV bytes, with the answer the script predicts.
#include "emulate/emulate.h"

#include <filesystem>
#include <fstream>

#include "gtest/gtest.h"
#include "kernels/cpu/thread_pool.h"
#include "serving_cluster.h"

namespace pdq::emulate {
namespace {

// A clock that moves only when slept on, recording each wake-up.
struct FakeClock {
  absl::Time now = absl::FromUnixSeconds(1000);
  std::vector<absl::Time> wakes;
  void Install(TimedPassOptions& o) {
    o.now = [this] { return now; };
    o.sleep_until = [this](absl::Time t) {
      now = std::max(now, t);
      wakes.push_back(t);
    };
  }
};

int Argmax(const float* row, int n) { return int(std::max_element(row, row + n) - row); }

TEST(EmulateTest, PassWorkCountsDecodeRowsAndPromptChunks) {
  const std::vector<int32_t> one = {7}, three = {1, 2, 3};
  BatchEntry batch[] = {{1, one, 1}, {2, three, 1}, {3, one, 1}, {4, one, 1}};
  batch[2].prompt = batch[3].prompt = true;
  ForwardPlan plan;
  plan.run = {0, 1, 2, 3};
  // A row over 40 tokens, a chunk after 16, a 1-token prompt, and a
  // prompt's last token after 24 cached (a prefix-cache hit).
  plan.start = {40, 16, 0, 24};
  const policy::StepWork w = PassWork(batch, plan);
  EXPECT_EQ(w.decode_rows, 1);
  EXPECT_EQ(w.prefill_tokens, 5);
  EXPECT_DOUBLE_EQ(w.attention, 3 * (16 + 1.5) + 0.5 + 24.5);
  EXPECT_DOUBLE_EQ(w.decode_attention, 40.5);
}

TEST(EmulateTest, APassTakesTheProfileTimeLayerByLayerAndPredictsTheScript) {
  ThreadPool pool(1);
  absl::StatusOr<std::unique_ptr<Model>> model =
      Model::LoadShape("synthetic:tiny", Precision::kW4A16);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_FALSE((*model)->has_weights());
  const ModelConfig& c = (*model)->config();
  FakeClock clock;
  TimedPassOptions o;
  o.time = {0.010, 0.002, 0.001, 1e-6, 6e-6, {}};
  o.time_scale = 2;
  o.num_layers = c.num_layers;
  o.vocab_size = c.vocab_size;
  o.script = {65, 66, 67};
  clock.Install(o);
  Context ctx(**model, CpuContext{&pool}, std::make_unique<TimedBackend>(o));
  absl::StatusOr<std::unique_ptr<KvCache>> kv = ctx.NewKvCache(256);
  ASSERT_TRUE(kv.ok());
  const SeqId seq = (*kv)->AddSequence();
  std::vector<int> layers;
  ctx.SetLayerObserver([&](int l) { layers.push_back(l); });

  // A 5-token prompt with every position's logits.
  const std::vector<int32_t> prompt = {10, 11, 12, 13, 14};
  BatchEntry e{seq, prompt, 5};
  Logits logits;
  ASSERT_TRUE(ctx.ForwardAll(**kv, {&e, 1}, &logits).ok());
  policy::StepWork work;
  work.AddChunk(0, 5);
  const absl::Time start = absl::FromUnixSeconds(1000);
  EXPECT_EQ(clock.now, start + absl::Seconds(2 * o.time.Seconds(work)));
  ASSERT_EQ((int)clock.wakes.size(), c.num_layers);
  EXPECT_EQ(clock.wakes[0], start + absl::Seconds(o.time.Seconds(work)));  // half of 2x, 2 layers
  EXPECT_EQ(layers, (std::vector<int>{0, 1}));
  // Row i predicts position i + 1.
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(Argmax(logits.Row(0, i), c.vocab_size), o.script[(i + 1) % 3]) << "row " << i;
  }
  EXPECT_EQ(*(*kv)->Length(seq), 5);

  // A decode row after them: position 6, script[0].
  const std::vector<int32_t> next = {15};
  e = {seq, next, 1};
  ASSERT_TRUE(ctx.ForwardAll(**kv, {&e, 1}, &logits).ok());
  policy::StepWork row;
  row.AddDecodeRow(5);
  EXPECT_EQ(clock.now, start + absl::Seconds(2 * (o.time.Seconds(work) + o.time.Seconds(row))));
  EXPECT_EQ(Argmax(logits.Row(0, 0), c.vocab_size), o.script[0]);
}

TEST(EmulateTest, AModelWithoutWeightsRefusesTheCpu) {
  ThreadPool pool(1);
  absl::StatusOr<std::unique_ptr<Model>> model =
      Model::LoadShape("synthetic:tiny", Precision::kFp16);
  ASSERT_TRUE(model.ok());
  Context ctx(**model, CpuContext{&pool});
  absl::StatusOr<std::unique_ptr<KvCache>> kv = ctx.NewKvCache(64);
  ASSERT_TRUE(kv.ok());
  const std::vector<int32_t> t = {1, 2};
  const BatchEntry e{(*kv)->AddSequence(), t, 1};
  Logits logits;
  const absl::Status s = ctx.Forward(**kv, {&e, 1}, &logits);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ((*model)->SaveQuantized("/tmp/never").code(), absl::StatusCode::kFailedPrecondition);
}

sim::Profile TinyProfile(const std::string& spec) {
  absl::StatusOr<std::unique_ptr<Model>> m = Model::LoadShape(spec, Precision::kFp16);
  EXPECT_TRUE(m.ok()) << m.status();
  sim::Profile p;
  p.model_path = spec;
  p.num_layers = (*m)->config().num_layers;
  const KvLayout layout = (*m)->kv_layout(16);
  p.kv_bytes_per_token = layout.bytes_per_token();
  for (const char* precision : {"w8a8", "w4a16"}) {
    for (int threads : {1, 2}) {
      sim::PassProfile pass;
      pass.precision = precision;
      pass.threads = threads;
      pass.time = {0.004 / threads, 0.001, 0.0005, 1e-7, 6e-7, {}};
      pass.load_seconds = 3;
      p.passes.push_back(pass);
    }
  }
  return p;
}

TEST(EmulateTest, LoadEmulatedFollowsTheProfileOfItsPrecisionAndShape) {
  ThreadPool pool(1);
  const sim::Profile p = TinyProfile("synthetic:tiny");
  absl::StatusOr<EmulatedModel> m =
      LoadEmulated(p, "synthetic:tiny", "w4a16", 1, 1, CpuContext{&pool}, KvDtype::kFp16);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->pass.precision, "w4a16");
  EXPECT_EQ(m->pass.threads, 1);
  EXPECT_EQ(m->ctx->device(), "emulated");
  EXPECT_EQ(LoadEmulated(p, "synthetic:tiny", "w4a16", 0, 1, CpuContext{&pool}, KvDtype::kFp16)
                ->pass.threads,
            2);
  EXPECT_EQ(LoadEmulated(p, "synthetic:tiny", "fp16", 1, 1, CpuContext{&pool}, KvDtype::kFp16)
                .status()
                .code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(LoadEmulated(p, "synthetic:tiny", "w4a16", 1, 0, CpuContext{&pool}, KvDtype::kFp16)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  const absl::Status other =
      LoadEmulated(p, "synthetic:smollm2-135m", "w4a16", 1, 1, CpuContext{&pool}, KvDtype::kFp16)
          .status();
  EXPECT_EQ(other.code(), absl::StatusCode::kInvalidArgument) << other;
  EXPECT_NE(other.message().find("30"), std::string::npos) << other;
}

// An emulated worker's KV cache is of the element type the profile's passes
// ran on, and a worker asking for another is told which to pass.
TEST(EmulateTest, LoadEmulatedKeepsTheProfilesKvDtype) {
  ThreadPool pool(1);
  sim::Profile p = TinyProfile("synthetic:tiny");
  absl::StatusOr<EmulatedModel> m =
      LoadEmulated(p, "synthetic:tiny", "w4a16", 1, 1, CpuContext{&pool}, KvDtype::kFp16);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->model->kv_layout().dtype, KvDtype::kFp16);
  const absl::Status mismatch =
      LoadEmulated(p, "synthetic:tiny", "w4a16", 1, 1, CpuContext{&pool}, KvDtype::kBf16).status();
  EXPECT_EQ(mismatch.code(), absl::StatusCode::kInvalidArgument) << mismatch;
  EXPECT_NE(mismatch.message().find("--kv-dtype fp16"), std::string::npos) << mismatch;
  p.kv_dtype = "bf16";  // bf16 and fp16 caches are the same bytes a token
  m = LoadEmulated(p, "synthetic:tiny", "w4a16", 1, 1, CpuContext{&pool}, KvDtype::kBf16);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->model->kv_layout().dtype, KvDtype::kBf16);
  EXPECT_EQ(LoadEmulated(p, "synthetic:tiny", "w4a16", 1, 1, CpuContext{&pool}, KvDtype::kFp16)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// Emulated prefill and decode workers of the shipped model behind a real
// router: the answer is the script from the prompt's end on, and the KV
// went over the transport.
TEST(EmulateServingTest, EmulatedWorkersServeThroughTheRouter) {
  using namespace pdq::testing;
  if (!std::filesystem::exists(kModel)) GTEST_SKIP() << kModel << " not found (make model)";
  Cluster c;
  const std::string path =
      std::filesystem::temp_directory_path() / ("pdq-emulate-" + std::to_string(getpid()));
  ASSERT_TRUE((std::ofstream(path) << sim::ProfileToJson(TinyProfile(kModel))).good());
  const std::vector<std::string> args = {"--emulate", path, "--emulate-load-seconds", "0"};
  Split s = StartSplit(c, "w8a8", "w4a16", args, args);
  std::filesystem::remove(path);
  ASSERT_TRUE(s.ok());
  const Answer a = Generate(*s.stub, Chat("Tell me a story about a lighthouse.", 40));
  ASSERT_TRUE(a.status.ok()) << a.status.error_message();
  EXPECT_EQ(a.tokens.size(), 40u);
  const std::string script =
      "Emulated worker: this text stands in for a model's answer, one token a step at the "
      "profile's pace. ";
  EXPECT_NE((script + script + script).find(a.text), std::string::npos) << a.text;
  EXPECT_GT(Metric(s.prefill.metrics, "pdq_kv_bytes_sent_total"), 0);
  EXPECT_GT(Metric(s.decode.metrics, "pdq_kv_bytes_received_total"), 0);
  EXPECT_GT(Metric(s.decode.metrics, "pdq_decode_steps_total"), 30);
}

}  // namespace
}  // namespace pdq::emulate
