// Context's side of a forward backend (engine/context.h), on the CPU: what
// it hands a backend, what it does with the backend's failures, and caches
// whose memory the context cannot read. The CUDA backend itself is checked
// in engine_cuda_test, on a GPU.
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "engine/context.h"
#include "engine/device.h"
#include "eval/perplexity.h"
#include "gtest/gtest.h"
#include "tests/test_models.h"

namespace pdq {
namespace {

using testing::LoadOrDie;
using testing::Tokens;

// Host memory under a name of our choosing; `host_accessible` as told.
class NamedAllocator final : public KvAllocator {
 public:
  NamedAllocator(std::string name, bool host_accessible)
      : name_(std::move(name)), host_(host_accessible) {}
  void* Allocate(size_t bytes) override {
    ++allocations;
    return std::aligned_alloc(64, bytes);
  }
  void Free(void* p) override {
    ++frees;
    std::free(p);
  }
  std::string name() const override { return name_; }
  bool host_accessible() const override { return host_; }
  int allocations = 0, frees = 0;

 private:
  std::string name_;
  bool host_;
};

// Runs the plan through a CPU context of its own over the same cache, and
// records what it was given.
class DelegatingBackend final : public ForwardBackend {
 public:
  DelegatingBackend(const Model& model, ThreadPool& pool) : inner_(model, CpuContext{&pool}) {}
  std::string name() const override { return "delegate"; }
  std::shared_ptr<KvAllocator> kv_allocator() const override { return allocator_; }
  absl::Status Run(std::span<const BatchEntry> batch, const ForwardPlan& plan, KvCache& kv,
                   const std::function<void(int)>& layer_done, Logits* logits) override {
    // What the backend is given, before the inner context plans again.
    plans.push_back(plan);
    first_rows = logits->first_row;
    num_rows = logits->num_rows;
    data_size = logits->data.size();
    for (size_t i = 0; i < plan.run.size(); ++i) {
      const SeqId seq = batch[plan.run[i]].seq;
      lengths_before.push_back(*kv.Length(seq));
      const std::span<const int32_t> table = *kv.BlockTable(seq);
      tables_match = tables_match && plan.tables[i].data() == table.data() &&
                     plan.tables[i].size() == table.size();
      capacities.push_back(*kv.Capacity(seq));
    }
    if (fail) return absl::InternalError("device lost");
    inner_.SetLayerObserver(layer_done);
    return inner_.Forward(kv, batch, logits);
  }
  std::vector<ForwardPlan> plans;
  std::vector<int64_t> lengths_before, capacities, first_rows, num_rows;
  size_t data_size = 0;
  bool tables_match = true;
  bool fail = false;

 private:
  Context inner_;
  std::shared_ptr<KvAllocator> allocator_ = std::make_shared<NamedAllocator>("host", true);
};

TEST(BackendTest, ABackendGetsThePlanAndItsLogitsAreTheCpus) {
  auto t = LoadOrDie("synthetic:tiny");
  ASSERT_TRUE(t);
  auto backend = std::make_unique<DelegatingBackend>(*t.model, *t.pool);
  DelegatingBackend* seen = backend.get();
  Context ctx(*t.model, CpuContext{t.pool.get()}, std::move(backend));
  EXPECT_EQ(ctx.device(), "delegate");
  std::vector<int> layers;
  ctx.SetLayerObserver([&](int layer) { layers.push_back(layer); });

  const int vocab = t->config().vocab_size;
  const std::vector<int32_t> a = Tokens(7, vocab, 1), b = Tokens(5, vocab, 2);
  auto kv = ctx.NewKvCache(64);
  ASSERT_TRUE(kv.ok()) << kv.status();
  auto cpu_kv = t.ctx->NewKvCache(64);
  ASSERT_TRUE(cpu_kv.ok());
  const SeqId s1 = (*kv)->AddSequence(), s2 = (*kv)->AddSequence();
  const SeqId c1 = (*cpu_kv)->AddSequence(), c2 = (*cpu_kv)->AddSequence();
  const BatchEntry batch[] = {{s1, a, 2}, {999, b, 1}, {s2, b, 1}};
  const BatchEntry cpu_batch[] = {{c1, a, 2}, {999, b, 1}, {c2, b, 1}};
  Logits got, want;
  ASSERT_TRUE(ctx.Forward(**kv, batch, &got).ok());
  ASSERT_TRUE(t.ctx->Forward(**cpu_kv, cpu_batch, &want).ok());

  ASSERT_EQ(seen->plans.size(), 1u);
  const ForwardPlan& plan = seen->plans[0];
  EXPECT_EQ(plan.run, (std::vector<size_t>{0, 2}));  // the unknown sequence does not run
  EXPECT_EQ(plan.offset, (std::vector<int64_t>{0, 7}));
  EXPECT_EQ(plan.start[0], 0);
  EXPECT_EQ(plan.start[2], 0);
  EXPECT_EQ(plan.total, 12);
  EXPECT_EQ(plan.logit_rows, 3);
  EXPECT_EQ(plan.max_pos, 7);
  ASSERT_EQ(plan.tables.size(), 2u);
  EXPECT_TRUE(seen->tables_match) << "the plan's block tables are the cache's";
  // Blocks reserved before Run (16 tokens a block), lengths moved after it.
  EXPECT_EQ(seen->capacities, (std::vector<int64_t>{16, 16}));
  EXPECT_EQ(seen->lengths_before, (std::vector<int64_t>{0, 0}));
  // The logit rows the backend fills: entry 0's two, then entry 2's one.
  EXPECT_EQ(seen->first_rows, (std::vector<int64_t>{0, 0, 2}));
  EXPECT_EQ(seen->num_rows, (std::vector<int64_t>{2, 0, 1}));
  EXPECT_EQ(seen->data_size, 3u * t->config().vocab_size);

  EXPECT_FALSE(got.status[1].ok());
  EXPECT_EQ(got.first_row, want.first_row);
  EXPECT_EQ(got.num_rows, want.num_rows);
  EXPECT_EQ(got.data, want.data);

  // A second call continues where the first left off.
  const std::vector<int32_t> c = Tokens(3, vocab, 3);
  const BatchEntry more[] = {{s1, c, 1}};
  Logits again;
  ASSERT_TRUE(ctx.Forward(**kv, more, &again).ok());
  EXPECT_EQ(seen->plans.back().start[0], 7);
  EXPECT_EQ(seen->plans.back().max_pos, 10);
  EXPECT_EQ(*(*kv)->Length(s1), 10);
  EXPECT_EQ(*(*kv)->Length(s2), 5);
  std::vector<int> every_layer;
  for (int call = 0; call < 2; ++call) {
    for (int i = 0; i < t->config().num_layers; ++i) every_layer.push_back(i);
  }
  EXPECT_EQ(layers, every_layer);
}

TEST(BackendTest, ABackendFailureFailsTheCallAndMovesNoLength) {
  auto t = LoadOrDie("synthetic:tiny");
  ASSERT_TRUE(t);
  auto backend = std::make_unique<DelegatingBackend>(*t.model, *t.pool);
  backend->fail = true;
  Context ctx(*t.model, CpuContext{t.pool.get()}, std::move(backend));
  auto kv = ctx.NewKvCache(64);
  ASSERT_TRUE(kv.ok());
  const SeqId s = (*kv)->AddSequence();
  const std::vector<int32_t> tokens = Tokens(6, t->config().vocab_size, 3);
  const BatchEntry e{s, tokens, 1};
  Logits logits;
  const absl::Status st = ctx.Forward(**kv, {&e, 1}, &logits);
  EXPECT_EQ(st.code(), absl::StatusCode::kInternal);
  EXPECT_NE(st.message().find("device lost"), std::string::npos);
  EXPECT_EQ(*(*kv)->Length(s), 0);
  EXPECT_TRUE(logits.data.empty());
  EXPECT_EQ(logits.num_rows, (std::vector<int64_t>{0}));
  EXPECT_EQ(*(*kv)->Capacity(s), 16) << "the reserved block stays, for a retry";
}

TEST(BackendTest, CalibrationObserversStayOnTheCpu) {
  auto t = LoadOrDie("synthetic:tiny");
  ASSERT_TRUE(t);
  Context ctx(*t.model, CpuContext{t.pool.get()},
              std::make_unique<DelegatingBackend>(*t.model, *t.pool));
  ctx.SetActivationObserver([](const std::string&, const float*, int64_t, int64_t) {});
  auto kv = ctx.NewKvCache(16);
  ASSERT_TRUE(kv.ok());
  const std::vector<int32_t> tokens = Tokens(3, t->config().vocab_size, 4);
  const BatchEntry e{(*kv)->AddSequence(), tokens, 1};
  Logits logits;
  EXPECT_EQ(ctx.Forward(**kv, {&e, 1}, &logits).code(), absl::StatusCode::kFailedPrecondition);
}

// A cache in memory the CPU cannot read: the CPU context refuses it by
// name, and the host transports' entry points refuse to move it.
TEST(BackendTest, ACacheInDeviceMemoryIsRefusedWhereTheHostWouldTouchIt) {
  auto t = LoadOrDie("synthetic:tiny");
  ASSERT_TRUE(t);
  auto allocator = std::make_shared<NamedAllocator>("fake:0", false);
  {
    auto kv = t->NewKvCache(32, allocator);
    ASSERT_TRUE(kv.ok()) << kv.status();
    EXPECT_EQ(allocator->allocations, 2 * t->config().num_layers);
    EXPECT_EQ((*kv)->memory(), "fake:0");
    const SeqId s = (*kv)->AddSequence();
    const std::vector<int32_t> tokens = Tokens(3, t->config().vocab_size, 5);
    const BatchEntry e{s, tokens, 1};
    Logits logits;
    const absl::Status st = t.ctx->Forward(**kv, {&e, 1}, &logits);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("fake:0 memory"), std::string::npos) << st;
    EXPECT_EQ((*kv)->ExportLayer(s, 0).status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ((*kv)->LayerSpans(s, 0, 1).status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ((*kv)->ImportSequence((*kv)->layout(), 4).status().code(),
              absl::StatusCode::kFailedPrecondition);
  }
  EXPECT_EQ(allocator->frees, allocator->allocations);
}

// Disaggregated perplexity shares one cache between the prefill and the
// decode context, so both must run where that cache lives.
TEST(BackendTest, PerplexityRefusesContextsOnDifferentDevices) {
  auto t = LoadOrDie("synthetic:tiny");
  ASSERT_TRUE(t);
  Context elsewhere(*t.model, CpuContext{t.pool.get()},
                    std::make_unique<DelegatingBackend>(*t.model, *t.pool));
  PerplexityOptions o;
  o.ctx = 16;
  o.decode = &elsewhere;
  auto r = ComputePerplexity(*t.ctx, std::string(400, 'a'), o);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("must run on one device"), std::string::npos) << r.status();
}

TEST(BackendTest, DeviceNamesAreCheckedAndExplained) {
  auto t = LoadOrDie("synthetic:tiny");
  ASSERT_TRUE(t);
  auto cpu = MakeBackend(*t.model, "cpu");
  ASSERT_TRUE(cpu.ok());
  EXPECT_EQ(*cpu, nullptr);
  for (const char* bad : {"gpu", "cuda:", "cuda:-1", "cuda:x", "tpu"}) {
    auto b = MakeBackend(*t.model, bad);
    EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(b.status().message().find("cpu, cuda, cuda:N"), std::string::npos);
  }
  // A GPU that is not there: FailedPrecondition where CUDA is built,
  // Unimplemented where it is not; a clear sentence either way.
  auto absent = MakeBackend(*t.model, "cuda:999");
  EXPECT_TRUE(absent.status().code() == absl::StatusCode::kFailedPrecondition ||
              absent.status().code() == absl::StatusCode::kUnimplemented)
      << absent.status();
}

}  // namespace
}  // namespace pdq
