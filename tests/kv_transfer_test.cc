// KV caches that travel: a layout compares equal exactly when one side can
// read the other's bytes; a sequence exported from one cache and imported
// into another (owned by a model at another precision) decodes exactly as it
// would have in place; mismatches are refused naming the field.
#include <cstring>

#include "common/check.h"
#include "engine/context.h"
#include "engine/kv_layout.h"
#include "engine/sampler.h"
#include "gtest/gtest.h"
#include "tests/test_models.h"

namespace pdq {
namespace {

using testing::LoadOrDie;
using testing::Tokens;

TEST(KvLayoutTest, SerializationRoundTripsAtItsStatedSize) {
  auto t = LoadOrDie("synthetic:tiny-qwen2");
  ASSERT_TRUE(t);
  const KvLayout l = t->kv_layout(32);
  const std::string bytes = l.Serialize();
  EXPECT_EQ(bytes.size(), KvLayout::kSerializedBytes);
  auto back = KvLayout::Deserialize(bytes);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, l);
  EXPECT_EQ(back->ToString(), l.ToString());
  EXPECT_EQ(back->rope_style, RopeStyle::kHalfSplit);
  EXPECT_NE(l.ToString().find("block_tokens=32"), std::string::npos) << l.ToString();
  KvLayout bf16 = l;
  bf16.dtype = KvDtype::kBf16;
  auto bf16_back = KvLayout::Deserialize(bf16.Serialize());
  ASSERT_TRUE(bf16_back.ok()) << bf16_back.status();
  EXPECT_EQ(*bf16_back, bf16);
  EXPECT_NE(bf16.ToString().find("dtype=bf16"), std::string::npos) << bf16.ToString();
  EXPECT_EQ(bf16.block_bytes(), l.block_bytes());
  EXPECT_EQ(ParseKvDtype("bf16").value(), KvDtype::kBf16);
  EXPECT_NE(ParseKvDtype("int8").status().message().find("fp16 or bf16"), std::string::npos);

  EXPECT_EQ(KvLayout::Deserialize(bytes.substr(1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::string bad_magic = bytes;
  bad_magic[0] = 'X';
  EXPECT_EQ(KvLayout::Deserialize(bad_magic).status().code(), absl::StatusCode::kInvalidArgument);
  std::string bad_version = bytes;
  bad_version[4] = 9;
  EXPECT_NE(KvLayout::Deserialize(bad_version).status().message().find("version 9"),
            std::string::npos);
  std::string bad_dtype = bytes;
  bad_dtype[5] = 7;
  EXPECT_NE(KvLayout::Deserialize(bad_dtype).status().message().find("dtype"), std::string::npos);
}

TEST(KvLayoutTest, WeightPrecisionIsNotPartOfTheLayout) {
  auto fp16 = LoadOrDie("synthetic:tiny"), w8 = LoadOrDie("synthetic:tiny@w8a8"),
       w4 = LoadOrDie("synthetic:tiny@w4a16");
  ASSERT_TRUE(fp16 && w8 && w4);
  EXPECT_EQ(fp16->kv_layout(), w8->kv_layout());
  EXPECT_EQ(w8->kv_layout(), w4->kv_layout());
  EXPECT_TRUE(CheckKvCompatible(w8->kv_layout(), w4->kv_layout()).ok());
}

// Each kind of mismatch is refused, and the message names the field.
TEST(KvLayoutTest, MismatchesNameTheField) {
  auto tiny = LoadOrDie("synthetic:tiny"), qwen = LoadOrDie("synthetic:tiny-qwen2");
  ASSERT_TRUE(tiny && qwen);
  const KvLayout mine = tiny->kv_layout();
  struct Case {
    const char* field;
    KvLayout theirs;
  };
  std::vector<Case> cases;
  cases.push_back({"rope_style", qwen->kv_layout()});  // other model: same shape, other RoPE
  KvLayout l = mine;
  l.block_tokens = 32;
  cases.push_back({"block_tokens", l});
  l = mine;
  l.dtype = static_cast<KvDtype>(3);  // a dtype this build does not have
  cases.push_back({"dtype", l});
  l = mine;
  l.dtype = KvDtype::kBf16;  // --kv-dtype bf16 on one side only
  cases.push_back({"dtype", l});
  l = mine;
  l.kv_heads += 1;
  cases.push_back({"kv_heads", l});
  l = mine;
  l.head_dim *= 2;
  cases.push_back({"head_dim", l});
  l = mine;
  l.num_layers -= 1;
  cases.push_back({"num_layers", l});
  l = mine;
  l.rope_base *= 2;
  cases.push_back({"rope_base", l});
  l = mine;
  l.model_fingerprint ^= 1;  // e.g. another tokenizer
  cases.push_back({"model_fingerprint", l});
  for (const Case& c : cases) {
    const absl::Status s = CheckKvCompatible(mine, c.theirs);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << c.field;
    EXPECT_NE(s.message().find(c.field), std::string::npos) << s;
    EXPECT_NE(mine, c.theirs) << c.field;
  }
}

// Copies every layer of `seq` from one cache into a sequence imported into
// the other, span by span, as a transport would.
absl::StatusOr<SeqId> Transfer(const KvCache& from, SeqId seq, KvCache& to) {
  PDQ_ASSIGN_OR_RETURN(const int64_t tokens, from.Length(seq));
  PDQ_ASSIGN_OR_RETURN(const SeqId dst, to.ImportSequence(from.layout(), tokens));
  for (int layer = 0; layer < from.layout().num_layers; ++layer) {
    PDQ_ASSIGN_OR_RETURN(const std::vector<KvSpan> out, from.ExportLayer(seq, layer));
    PDQ_ASSIGN_OR_RETURN(const std::vector<KvSpan> in, to.LayerSpans(dst, layer, tokens));
    if (out.size() != in.size()) return absl::InternalError("span lists differ");
    for (size_t i = 0; i < out.size(); ++i) {
      if (out[i].bytes != in[i].bytes) return absl::InternalError("span sizes differ");
      std::memcpy(to.SpanData(in[i]), from.SpanData(out[i]), out[i].bytes);
    }
  }
  PDQ_RETURN_IF_ERROR(to.SetLength(dst, tokens));
  return dst;
}

// Greedy decode of `steps` tokens from a sequence whose prompt is in `kv`,
// starting from `first`.
std::vector<int32_t> Decode(Context& ctx, KvCache& kv, SeqId seq, int32_t first, int steps) {
  std::vector<int32_t> out;
  int32_t next = first;
  Logits logits;
  for (int i = 0; i < steps; ++i) {
    BatchEntry e{seq, {&next, 1}, 1};
    const absl::Status s = ctx.ForwardAll(kv, {&e, 1}, &logits);
    if (!s.ok()) {
      ADD_FAILURE() << s;
      break;
    }
    next = Argmax(logits.Row(0, 0), logits.vocab_size);
    out.push_back(next);
  }
  return out;
}

class KvTransferTest : public ::testing::TestWithParam<std::pair<const char*, const char*>> {};

std::string PairName(const ::testing::TestParamInfo<std::pair<const char*, const char*>>& info) {
  const char* names[] = {"fp16_to_fp16", "w8a8_to_w4a16", "qwen2_w8a8_to_w4a16"};
  return names[info.index];
}

TEST_P(KvTransferTest, ImportedSequenceDecodesLikeTheSequenceInPlace) {
  const auto [prefill_spec, decode_spec] = GetParam();
  auto prefill = LoadOrDie(prefill_spec), decode = LoadOrDie(decode_spec);
  ASSERT_TRUE(prefill && decode);
  const std::vector<int32_t> prompt = Tokens(37, prefill->config().vocab_size, 41);
  auto sender = prefill->NewKvCache(256);
  auto receiver = decode->NewKvCache(512);
  ASSERT_TRUE(sender.ok() && receiver.ok());
  // Some traffic first, so the two caches' block ids differ.
  const SeqId filler = (*receiver)->AddSequence();
  ASSERT_TRUE((*receiver)->Reserve(filler, 70).ok());

  const SeqId seq = (*sender)->AddSequence();
  BatchEntry e{seq, prompt, 1};
  Logits logits;
  ASSERT_TRUE(prefill.ctx->ForwardAll(**sender, {&e, 1}, &logits).ok());
  const int32_t first = Argmax(logits.Row(0, 0), logits.vocab_size);

  auto imported = Transfer(**sender, seq, **receiver);
  ASSERT_TRUE(imported.ok()) << imported.status();
  EXPECT_EQ(*(*receiver)->Length(*imported), 37);
  EXPECT_NE(*(*receiver)->BlockTable(*imported)->data(), *(*sender)->BlockTable(seq)->data());

  // The reference: the decode model continuing the prefill model's cache in
  // place (as disaggregated perplexity does in one process).
  const std::vector<int32_t> in_place = Decode(*decode.ctx, **sender, seq, first, 24);
  const std::vector<int32_t> moved = Decode(*decode.ctx, **receiver, *imported, first, 24);
  ASSERT_EQ(in_place.size(), 24u);
  EXPECT_EQ(moved, in_place);

  // Freeing the imported sequence gives every block back.
  const int64_t free_before = (*receiver)->num_free_blocks();
  ASSERT_TRUE((*receiver)->RemoveSequence(*imported).ok());
  EXPECT_EQ((*receiver)->num_free_blocks(), free_before + (37 + 24 + 15) / 16);
}

INSTANTIATE_TEST_SUITE_P(
    Pairs, KvTransferTest,
    ::testing::Values(std::make_pair("synthetic:tiny", "synthetic:tiny"),
                      std::make_pair("synthetic:tiny@w8a8", "synthetic:tiny@w4a16"),
                      std::make_pair("synthetic:tiny-qwen2@w8a8", "synthetic:tiny-qwen2@w4a16")),
    PairName);

TEST(KvImportTest, RefusesAnotherLayoutAndChangesNothing) {
  auto tiny = LoadOrDie("synthetic:tiny"), qwen = LoadOrDie("synthetic:tiny-qwen2");
  ASSERT_TRUE(tiny && qwen);
  auto receiver = tiny->NewKvCache(128);
  ASSERT_TRUE(receiver.ok());
  const int64_t free_before = (*receiver)->num_free_blocks();

  auto other_model = (*receiver)->ImportSequence(qwen->kv_layout(), 20);
  EXPECT_EQ(other_model.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(other_model.status().message().find("rope_style"), std::string::npos)
      << other_model.status();
  auto other_blocks = (*receiver)->ImportSequence(tiny->kv_layout(32), 20);
  EXPECT_NE(other_blocks.status().message().find("block_tokens is 16 here, 32 in the peer"),
            std::string::npos)
      << other_blocks.status();
  KvLayout other_dtype = tiny->kv_layout();
  other_dtype.dtype = static_cast<KvDtype>(3);
  EXPECT_NE((*receiver)->ImportSequence(other_dtype, 20).status().message().find("dtype"),
            std::string::npos);
  auto too_big = (*receiver)->ImportSequence(tiny->kv_layout(), 10000);
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ((*receiver)->num_free_blocks(), free_before);

  // A model cannot run on a cache laid out for another.
  auto foreign = qwen->NewKvCache(64);
  ASSERT_TRUE(foreign.ok());
  const SeqId s = (*foreign)->AddSequence();
  const std::vector<int32_t> prompt = Tokens(5, 384, 1);
  BatchEntry e{s, prompt, 1};
  Logits logits;
  const absl::Status st = tiny.ctx->Forward(**foreign, {&e, 1}, &logits);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("laid out for another model"), std::string::npos) << st;
}

}  // namespace
}  // namespace pdq
