// The forward pass: batching, chunking and incremental decode agree with one
// another; a bad batch entry fails alone; contexts on one model run at once;
// generation is deterministic.
#include <cstring>
#include <thread>

#include "engine/context.h"
#include "engine/generate.h"
#include "gtest/gtest.h"
#include "tests/test_models.h"

namespace pdq {
namespace {

using testing::ExpectRowsNear;
using testing::LastLogits;
using testing::LoadOrDie;
using testing::Tokens;

class SyntheticModelTest : public ::testing::TestWithParam<std::string> {};

TEST_P(SyntheticModelTest, BatchedSequencesMatchSeparateRuns) {
  auto t = LoadOrDie(GetParam());
  ASSERT_TRUE(t);
  const int vocab = t->config().vocab_size;
  auto a = Tokens(23, vocab, 1), b = Tokens(9, vocab, 2);
  auto kv = t->NewKvCache(256);
  ASSERT_TRUE(kv.ok());
  const SeqId sa = (*kv)->AddSequence(), sb = (*kv)->AddSequence();
  BatchEntry batch[] = {{sa, a, 1}, {sb, b, 1}};
  Logits together;
  ASSERT_TRUE(t.ctx->ForwardAll(**kv, batch, &together).ok());

  for (int e = 0; e < 2; ++e) {
    auto kv2 = t->NewKvCache(256);
    ASSERT_TRUE(kv2.ok());
    const SeqId s = (*kv2)->AddSequence();
    BatchEntry one{s, e == 0 ? std::span<const int32_t>(a) : std::span<const int32_t>(b), 1};
    Logits alone;
    ASSERT_TRUE(t.ctx->ForwardAll(**kv2, {&one, 1}, &alone).ok());
    ExpectRowsNear(together.Row(e, 0), alone.Row(0, 0), vocab, 1e-3f, "entry " + std::to_string(e));
  }
}

// Continuous batching changes who shares a decode step with a sequence; for
// the decode precision (W4A16, up to kW4IntMaxRows rows) and W8A8 on the
// int16 kernels its logits do not change with that, bit for bit, so a served
// answer does not depend on the other requests (the workers' --batch-invariant;
// by default steps of 16 rows or more take the bf16 tiles where the CPU has
// AMX-BF16; LoadOptions here keeps them off). FP16 is not batch-invariant: above 4 rows its GEMM
// blocks k differently (kernels/cpu/avx2.cc), so greedy FP16 answers can
// differ in the last bits between batch sizes.
class BatchInvariantTest : public ::testing::TestWithParam<std::string> {};

TEST_P(BatchInvariantTest, DecodeStepLogitsDoNotDependOnTheBatch) {
  auto t = LoadOrDie(GetParam());
  ASSERT_TRUE(t);
  const int vocab = t->config().vocab_size;
  auto kv = t->NewKvCache(512);
  ASSERT_TRUE(kv.ok());
  std::vector<SeqId> seqs;
  Logits logits;
  for (int i = 0; i < 5; ++i) {
    seqs.push_back((*kv)->AddSequence());
    auto prompt = Tokens(7 + 5 * i, vocab, 30 + i);
    BatchEntry e{seqs.back(), prompt, 1};
    ASSERT_TRUE(t.ctx->ForwardAll(**kv, {&e, 1}, &logits).ok());
  }
  const std::vector<int32_t> next = {3, 4, 5, 6, 7};
  // Sequence 0 alone, then (after removing that token again) with the rest.
  BatchEntry alone{seqs[0], {&next[0], 1}, 1};
  Logits one;
  ASSERT_TRUE(t.ctx->ForwardAll(**kv, {&alone, 1}, &one).ok());
  ASSERT_TRUE((*kv)->SetLength(seqs[0], *(*kv)->Length(seqs[0]) - 1).ok());
  std::vector<BatchEntry> batch;
  for (int i = 4; i >= 0; --i) batch.push_back({seqs[i], {&next[i], 1}, 1});
  Logits many;
  ASSERT_TRUE(t.ctx->ForwardAll(**kv, batch, &many).ok());
  EXPECT_EQ(0, std::memcmp(one.Row(0, 0), many.Row(4, 0), vocab * sizeof(float)))
      << "sequence 0's logits changed when it shared the step with four others";
}

TEST_P(SyntheticModelTest, ChunkedPrefillAndDecodeMatchOneShotLogits) {
  auto t = LoadOrDie(GetParam());
  ASSERT_TRUE(t);
  const int vocab = t->config().vocab_size;
  auto tokens = Tokens(40, vocab, 3);
  auto kv = t->NewKvCache(128);
  ASSERT_TRUE(kv.ok());
  const SeqId whole = (*kv)->AddSequence();
  BatchEntry all{whole, tokens, (int64_t)tokens.size()};
  Logits ref;
  ASSERT_TRUE(t.ctx->ForwardAll(**kv, {&all, 1}, &ref).ok());
  EXPECT_EQ(*(*kv)->Length(whole), 40);

  // A 17-token chunk, then a 13-token chunk, then 10 single-token steps.
  const SeqId inc = (*kv)->AddSequence();
  int64_t pos = 0;
  for (int64_t n : {17, 13, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}) {
    BatchEntry step{inc, std::span<const int32_t>(tokens).subspan(pos, n), n};
    Logits got;
    ASSERT_TRUE(t.ctx->ForwardAll(**kv, {&step, 1}, &got).ok());
    for (int64_t i = 0; i < n; ++i) {
      ExpectRowsNear(got.Row(0, i), ref.Row(0, pos + i), vocab, 1e-3f,
                     "position " + std::to_string(pos + i));
    }
    pos += n;
  }
  EXPECT_EQ(*(*kv)->Length(inc), 40);
}

TEST_P(SyntheticModelTest, ThreadCountDoesNotChangeLogits) {
  auto one = LoadOrDie(GetParam(), 1), two = LoadOrDie(GetParam(), 2);
  ASSERT_TRUE(one);
  ASSERT_TRUE(two);
  auto tokens = Tokens(30, one->config().vocab_size, 4);
  const Logits a = LastLogits(*one.ctx, tokens), b = LastLogits(*two.ctx, tokens);
  ASSERT_FALSE(a.data.empty());
  EXPECT_EQ(a.data, b.data);
}

TEST_P(SyntheticModelTest, EachBadEntryFailsAloneAndLeavesItsSequenceUnchanged) {
  auto t = LoadOrDie(GetParam());
  ASSERT_TRUE(t);
  const ModelConfig& c = t->config();
  auto kv = t->NewKvCache(64);  // 4 blocks
  ASSERT_TRUE(kv.ok());
  const SeqId s = (*kv)->AddSequence();
  std::vector<int32_t> ok_tokens = Tokens(5, c.vocab_size, 5);
  BatchEntry first{s, ok_tokens, 1};
  Logits logits;
  ASSERT_TRUE(t.ctx->ForwardAll(**kv, {&first, 1}, &logits).ok());
  const int64_t free_before = (*kv)->num_free_blocks();

  struct Case {
    std::vector<int32_t> tokens;
    absl::StatusCode code;
    const char* message;
  };
  const std::vector<Case> cases = {
      {{1, c.vocab_size}, absl::StatusCode::kInvalidArgument, "outside vocabulary"},
      {{-1}, absl::StatusCode::kInvalidArgument, "outside vocabulary"},
      {{}, absl::StatusCode::kInvalidArgument, "no new tokens"},
      {Tokens(100, c.vocab_size, 6), absl::StatusCode::kResourceExhausted, "KV cache full"},
      {Tokens(c.max_context, c.vocab_size, 7), absl::StatusCode::kOutOfRange, "context"},
  };
  for (const Case& bad : cases) {
    BatchEntry e{s, bad.tokens, bad.tokens.empty() ? 0 : 1};
    ASSERT_TRUE(t.ctx->Forward(**kv, {&e, 1}, &logits).ok());
    ASSERT_EQ(logits.status.size(), 1u);
    EXPECT_EQ(logits.status[0].code(), bad.code) << logits.status[0];
    EXPECT_NE(logits.status[0].message().find(bad.message), std::string::npos) << logits.status[0];
    EXPECT_EQ(logits.num_rows[0], 0);
  }
  BatchEntry twice[] = {{s, ok_tokens, 1}, {s, ok_tokens, 1}};
  ASSERT_TRUE(t.ctx->Forward(**kv, twice, &logits).ok());
  EXPECT_TRUE(logits.status[0].ok());
  EXPECT_EQ(logits.status[1].code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(logits.status[1].message().find("appears twice"), std::string::npos);
  EXPECT_EQ(*(*kv)->Length(s), 10);  // the first of the pair ran

  BatchEntry unknown{12345, ok_tokens, 1};
  ASSERT_TRUE(t.ctx->Forward(**kv, {&unknown, 1}, &logits).ok());
  EXPECT_EQ(logits.status[0].code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(*(*kv)->Length(s), 10);
  EXPECT_EQ((*kv)->num_free_blocks(), free_before);  // 10 tokens still fit one block

  EXPECT_EQ(t.ctx->Forward(**kv, {}, &logits).code(), absl::StatusCode::kInvalidArgument);
}

// A scheduler batches requests from many clients; one bad request must not
// cost the others their step.
TEST_P(SyntheticModelTest, ABatchWithOneBadEntryGivesTheOthersTheirLogits) {
  auto t = LoadOrDie(GetParam());
  ASSERT_TRUE(t);
  const int vocab = t->config().vocab_size;
  auto a = Tokens(12, vocab, 11), b = Tokens(7, vocab, 12);
  std::vector<int32_t> bad = {3, vocab + 5, 4};
  auto kv = t->NewKvCache(256);
  ASSERT_TRUE(kv.ok());
  const SeqId sa = (*kv)->AddSequence(), sbad = (*kv)->AddSequence(), sb = (*kv)->AddSequence();
  BatchEntry batch[] = {{sa, a, 1}, {sbad, bad, 1}, {sb, b, 2}};
  Logits got;
  ASSERT_TRUE(t.ctx->Forward(**kv, batch, &got).ok());
  EXPECT_TRUE(got.status[0].ok()) << got.status[0];
  EXPECT_EQ(got.status[1].code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(got.status[1].message().find("token id " + std::to_string(vocab + 5)),
            std::string::npos)
      << got.status[1];
  EXPECT_TRUE(got.status[2].ok()) << got.status[2];
  EXPECT_EQ(got.FirstError().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(got.num_rows, (std::vector<int64_t>{1, 0, 2}));
  EXPECT_EQ(*(*kv)->Length(sbad), 0);
  EXPECT_EQ(*(*kv)->Length(sa), 12);

  // The good entries' logits are what they get alone.
  const Logits alone_a = LastLogits(*t.ctx, a), alone_b = LastLogits(*t.ctx, b);
  ExpectRowsNear(got.Row(0, 0), alone_a.Row(0, 0), vocab, 1e-3f, "entry a");
  ExpectRowsNear(got.Row(2, 1), alone_b.Row(0, 0), vocab, 1e-3f, "entry b");
}

TEST_P(SyntheticModelTest, GreedyGenerationIsDeterministic) {
  auto t = LoadOrDie(GetParam());
  ASSERT_TRUE(t);
  GenerateOptions o;
  o.max_tokens = 24;
  o.ignore_eos = true;
  auto prompt = Tokens(11, t->config().vocab_size, 8);
  auto a = Generate(*t.ctx, prompt, o), b = Generate(*t.ctx, prompt, o);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(a->tokens, b->tokens);
  EXPECT_EQ(a->tokens.size(), 24u);
  EXPECT_EQ(a->stop_reason, "max_tokens");
  EXPECT_GT(a->ttft_ms, 0.0);
}

INSTANTIATE_TEST_SUITE_P(Shapes, SyntheticModelTest,
                         ::testing::Values("synthetic:tiny", "synthetic:tiny-qwen2",
                                           "synthetic:tiny@w4a16", "synthetic:tiny@w8a8"),
                         [](const auto& info) {
                           std::string name = info.param.substr(10);
                           for (char& ch : name) {
                             if (!isalnum((unsigned char)ch)) ch = '_';
                           }
                           return name;
                         });

INSTANTIATE_TEST_SUITE_P(Precisions, BatchInvariantTest,
                         ::testing::Values("synthetic:tiny@w4a16", "synthetic:tiny@w8a8"),
                         [](const auto& info) { return info.param.substr(info.param.find('@') + 1); });

// Prompt rows take the same kernels however many share a pass
// (CpuContext::prompt_rows), so a prompt's logits do not depend on how it
// was cut into passes (a prefix cache hit leaves a short suffix; chunked
// prefill) or on decode rows beside it, bit for bit; and a decode row's
// logits do not change when a prompt shares its step. With the serving
// settings of --batch-invariant: bf16 tiles from 65 rows (on CPUs with
// AMX-BF16; fp32 on the others), W8A16 output (and W8A8's down
// projections), and on SmolLM2's shape the bf16 prompt attention too.
struct PromptRowsCase {
  std::string spec;
  bool bf16_attention = false;
};
class PromptRowsTest : public ::testing::TestWithParam<PromptRowsCase> {};

TEST_P(PromptRowsTest, APromptsLogitsDoNotDependOnHowItWasCut) {
  const std::string& spec = GetParam().spec;
  LoadOptions o;
  o.bf16_min_rows = kW4IntMaxRows + 1;  // as --batch-invariant sets it
  if (spec.ends_with("w8a8")) o.w8_layers = {"output", "blk.*.down"};
  if (spec.ends_with("w4a16")) o.w8_layers = {"output"};
  auto t = LoadOrDie(spec, 2, o);
  ASSERT_TRUE(t);
  Context ctx(*t.model, CpuContext{t.pool.get(), GetParam().bf16_attention});
  const int vocab = t->config().vocab_size;
  const auto tokens = Tokens(90, vocab, 5);
  auto kv = t->NewKvCache(1024);
  ASSERT_TRUE(kv.ok());
  // Every position's logits, in one pass of 90 rows.
  const SeqId whole = (*kv)->AddSequence();
  BatchEntry all{whole, tokens, 90};
  Logits ref;
  ASSERT_TRUE(ctx.ForwardAll(**kv, {&all, 1}, &ref).ok());

  // Another sequence decodes beside some of the chunks; its rows alone are
  // the reference for its rows in company.
  const SeqId other = (*kv)->AddSequence(), other_alone = (*kv)->AddSequence();
  const auto other_prompt = Tokens(20, vocab, 6);
  for (SeqId s : {other, other_alone}) {
    BatchEntry e{s, other_prompt, 1};
    Logits l;
    ASSERT_TRUE(ctx.ForwardAll(**kv, {&e, 1}, &l).ok());
  }
  const SeqId cut = (*kv)->AddSequence();
  int64_t pos = 0;
  int step = 0;
  for (int64_t n : {1, 16, 5, 40, 1, 27}) {
    SCOPED_TRACE("chunk of " + std::to_string(n) + " at " + std::to_string(pos));
    const int32_t next = 7 + step;
    const bool with_decode = step % 2 == 1;
    // Batch order puts the decode row last; the engine runs it first.
    std::vector<BatchEntry> batch = {
        {cut, std::span<const int32_t>(tokens).subspan(pos, n), n, /*prompt=*/true}};
    if (with_decode) batch.push_back({other, {&next, 1}, 1});
    Logits got;
    ASSERT_TRUE(ctx.ForwardAll(**kv, batch, &got).ok());
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(0, std::memcmp(got.Row(0, i), ref.Row(0, pos + i), vocab * sizeof(float)))
          << "position " << pos + i;
    }
    if (with_decode) {
      BatchEntry alone{other_alone, {&next, 1}, 1};
      Logits one;
      ASSERT_TRUE(ctx.ForwardAll(**kv, {&alone, 1}, &one).ok());
      if (spec.find('@') != std::string::npos) {  // FP16 decode is not batch-invariant
        EXPECT_EQ(0, std::memcmp(got.Row(1, 0), one.Row(0, 0), vocab * sizeof(float)))
            << "the decode row changed with a prompt chunk beside it";
      }
    }
    pos += n;
    ++step;
  }
}

INSTANTIATE_TEST_SUITE_P(Precisions, PromptRowsTest,
                         ::testing::Values(PromptRowsCase{"synthetic:tiny"},
                                           PromptRowsCase{"synthetic:tiny@w4a16"},
                                           PromptRowsCase{"synthetic:tiny@w8a8"},
                                           PromptRowsCase{"synthetic:smollm2-135m@w4a16", true}),
                         [](const auto& info) {
                           std::string name = info.param.spec.substr(10) +
                                              (info.param.bf16_attention ? "_bf16" : "");
                           for (char& ch : name) {
                             if (!isalnum((unsigned char)ch)) ch = '_';
                           }
                           return name;
                         });

// Prompt attention on bf16 tiles (CpuContext::bf16_prompt_attention, on
// CPUs with AMX-BF16), on SmolLM2-135M's shape (head_dim 64, GQA group 3):
// a prompt computed in chunks, or beside many others in one batch, gives
// the logits it gives in one piece, up to bf16 rounding; a batch of the
// same prompt gives every copy the same bits. On an fp16 cache and on a
// bf16 one (--kv-dtype bf16), each against the fp32 kernels on the same
// cache.
class Bf16PromptAttentionTest : public ::testing::TestWithParam<KvDtype> {};

TEST_P(Bf16PromptAttentionTest, ChunksAndBatchesMatchOnePiece) {
  if (!Bf16AttentionSupported()) GTEST_SKIP() << "no AMX-BF16 on this CPU";
  LoadOptions o;
  o.kv_dtype = GetParam();
  auto t = LoadOrDie("synthetic:smollm2-135m@w4a16", 2, o);
  ASSERT_TRUE(t);
  ASSERT_EQ(t->kv_layout().dtype, GetParam());
  Context bf16(*t.model, CpuContext{t.pool.get(), true});
  const int vocab = t->config().vocab_size;
  const auto tokens = Tokens(30, vocab, 4);
  // The last position's logits of `copies` sequences of `tokens`, computed
  // in `chunks`, all copies in each pass.
  auto run = [&](Context& ctx, const std::vector<int64_t>& chunks, int copies) {
    auto kv = t->NewKvCache(64 * 64);
    EXPECT_TRUE(kv.ok());
    std::vector<SeqId> seqs;
    for (int c = 0; c < copies; ++c) seqs.push_back((*kv)->AddSequence());
    int64_t pos = 0;
    Logits last;
    for (int64_t n : chunks) {
      std::vector<BatchEntry> batch;
      for (SeqId s : seqs)
        batch.push_back({s, std::span<const int32_t>(tokens).subspan(pos, n), 1});
      EXPECT_TRUE(ctx.ForwardAll(**kv, batch, &last).ok());
      pos += n;
    }
    std::vector<std::vector<float>> rows;
    for (int c = 0; c < copies; ++c) rows.emplace_back(last.Row(c, 0), last.Row(c, 0) + vocab);
    return rows;
  };
  const auto fp32 = run(*t.ctx, {30}, 1);
  const auto whole = run(bf16, {30}, 1);
  ExpectRowsNear(whole[0].data(), fp32[0].data(), vocab, 5e-2f, "bf16 against fp32 attention");
  const auto chunked = run(bf16, {16, 14}, 1);
  ExpectRowsNear(chunked[0].data(), whole[0].data(), vocab, 1e-3f, "16 + 14 tokens");
  // 64 copies: the W4A16 GEMMs take bf16 tiles from 65 rows, so the copies
  // may differ from the one sequence above, but not from each other.
  const auto batched = run(bf16, {16, 14}, 64);
  ExpectRowsNear(batched[0].data(), chunked[0].data(), vocab, 5e-2f, "in a batch of 64");
  for (int c = 1; c < 64; ++c) ASSERT_EQ(batched[c], batched[0]) << "copy " << c << " of 64";
}

INSTANTIATE_TEST_SUITE_P(KvDtypes, Bf16PromptAttentionTest,
                         ::testing::Values(KvDtype::kFp16, KvDtype::kBf16),
                         [](const auto& info) { return KvDtypeName(info.param); });

// A bf16 KV cache (--kv-dtype bf16): the layout says so (two workers never
// mix the dtypes), a token's KV costs what fp16's does, and a prompt in
// chunks then single-token decode steps gives logits near the fp16 cache's
// but not equal to them (the cache really rounds to bf16). tiny-gemma's
// decode rows (group 4, head_dim 32) take AVX512_BF16's dot products where
// the CPU has them; tiny's (group 2) the fp32 kernels on bf16 loads.
class Bf16KvCacheTest : public ::testing::TestWithParam<std::string> {};

TEST_P(Bf16KvCacheTest, LogitsFollowAnFp16CacheClosely) {
  LoadOptions o;
  o.kv_dtype = KvDtype::kBf16;
  auto fp16 = LoadOrDie(GetParam()), bf16 = LoadOrDie(GetParam(), 2, o);
  ASSERT_TRUE(fp16);
  ASSERT_TRUE(bf16);
  EXPECT_EQ(bf16->kv_layout().dtype, KvDtype::kBf16);
  EXPECT_FALSE(CheckKvCompatible(fp16->kv_layout(), bf16->kv_layout()).ok());
  EXPECT_EQ(bf16->kv_layout().bytes_per_token(), fp16->kv_layout().bytes_per_token());
  const int vocab = fp16->config().vocab_size;
  const auto tokens = Tokens(40, vocab, 5);
  auto run = [&](testing::TestModel& t) {
    auto kv = t.ctx->NewKvCache(64);
    EXPECT_TRUE(kv.ok());
    const SeqId seq = (*kv)->AddSequence();
    std::vector<float> rows;
    int64_t pos = 0;
    for (int64_t n : {17, 13, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}) {
      BatchEntry step{seq, std::span<const int32_t>(tokens).subspan(pos, n), 1};
      Logits got;
      EXPECT_TRUE(t.ctx->ForwardAll(**kv, {&step, 1}, &got).ok());
      rows.insert(rows.end(), got.Row(0, 0), got.Row(0, 0) + vocab);
      pos += n;
    }
    return rows;
  };
  const std::vector<float> want = run(fp16), got = run(bf16);
  ASSERT_EQ(got.size(), want.size());
  float scale = 0, worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    scale = std::max(scale, std::abs(want[i]));
    worst = std::max(worst, std::abs(got[i] - want[i]));
  }
  EXPECT_GT(worst, 0.0f) << "the bf16 cache gave the fp16 cache's logits bit for bit";
  EXPECT_LT(worst, 0.005f * scale) << "largest |logit| " << scale;
}

INSTANTIATE_TEST_SUITE_P(Shapes, Bf16KvCacheTest,
                         ::testing::Values("synthetic:tiny", "synthetic:tiny-gemma"),
                         [](const auto& info) {
                           std::string name = info.param.substr(10);
                           for (char& c : name)
                             if (c == '-') c = '_';
                           return name;
                         });

// Two threads, each with its own context and pool, generate on one shared
// model at the same time; each gets exactly what it gets alone.
class ConcurrentContextsTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ConcurrentContextsTest, TwoThreadsOnOneModelMatchSequentialRuns) {
  auto t = LoadOrDie(GetParam(), 1);
  ASSERT_TRUE(t);
  const int vocab = t->config().vocab_size;
  const std::vector<int32_t> prompts[2] = {Tokens(37, vocab, 21), Tokens(19, vocab, 22)};
  GenerateOptions o;
  o.max_tokens = 32;
  o.ignore_eos = true;
  std::vector<int32_t> sequential[2];
  for (int i = 0; i < 2; ++i) {
    auto r = Generate(*t.ctx, prompts[i], o);
    ASSERT_TRUE(r.ok()) << r.status();
    sequential[i] = r->tokens;
  }
  ThreadPool pools[2] = {ThreadPool(1), ThreadPool(2)};
  std::vector<int32_t> concurrent[2];
  absl::Status status[2];
  for (int round = 0; round < 3; ++round) {
    std::thread threads[2];
    for (int i = 0; i < 2; ++i) {
      threads[i] = std::thread([&, i] {
        Context ctx(*t.model, CpuContext{&pools[i]});
        auto r = Generate(ctx, prompts[i], o);
        status[i] = r.status();
        if (r.ok()) concurrent[i] = r->tokens;
      });
    }
    for (std::thread& th : threads) th.join();
    for (int i = 0; i < 2; ++i) {
      ASSERT_TRUE(status[i].ok()) << status[i];
      EXPECT_EQ(concurrent[i], sequential[i]) << "thread " << i << ", round " << round;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Precisions, ConcurrentContextsTest,
                         ::testing::Values("synthetic:tiny", "synthetic:tiny@w4a16",
                                           "synthetic:tiny@w8a8"),
                         [](const auto& info) {
                           return info.index == 0 ? std::string("fp16")
                                                  : info.param.substr(info.param.find('@') + 1);
                         });

}  // namespace
}  // namespace pdq
