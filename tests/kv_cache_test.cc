// Paged KV cache: block accounting, all-or-nothing reservations, reuse, and
// NotFound (never an abort) for ids it does not know.
#include "engine/kv_cache.h"

#include "gtest/gtest.h"

namespace pdq {
namespace {

KvCacheConfig SmallConfig(int64_t blocks) {
  KvCacheConfig c;
  c.layout.num_layers = 2;
  c.layout.kv_heads = 2;
  c.layout.head_dim = 8;
  c.num_blocks = blocks;
  return c;
}

TEST(KvCacheTest, ReserveTakesWholeBlocks) {
  auto kv = KvCache::Create(SmallConfig(4));
  ASSERT_TRUE(kv.ok());
  const SeqId s = (*kv)->AddSequence();
  EXPECT_EQ((*kv)->num_free_blocks(), 4);
  ASSERT_TRUE((*kv)->Reserve(s, 1).ok());
  EXPECT_EQ((*kv)->num_free_blocks(), 3);
  ASSERT_TRUE((*kv)->Reserve(s, 16).ok());
  EXPECT_EQ((*kv)->num_free_blocks(), 3);
  ASSERT_TRUE((*kv)->Reserve(s, 17).ok());
  EXPECT_EQ((*kv)->num_free_blocks(), 2);
  EXPECT_EQ((*kv)->BlockTable(s)->size(), 2u);
  EXPECT_EQ(*(*kv)->Capacity(s), 32);
}

TEST(KvCacheTest, FailedReserveChangesNothing) {
  auto kv = KvCache::Create(SmallConfig(3));
  ASSERT_TRUE(kv.ok());
  const SeqId s = (*kv)->AddSequence();
  ASSERT_TRUE((*kv)->Reserve(s, 20).ok());
  auto status = (*kv)->Reserve(s, 16 * 4);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(status.message().find("KV cache full"), std::string::npos);
  EXPECT_EQ((*kv)->num_free_blocks(), 1);
  EXPECT_EQ((*kv)->BlockTable(s)->size(), 2u);
}

TEST(KvCacheTest, RemoveSequenceReturnsBlocksToPool) {
  auto kv = KvCache::Create(SmallConfig(4));
  ASSERT_TRUE(kv.ok());
  const SeqId a = (*kv)->AddSequence(), b = (*kv)->AddSequence();
  ASSERT_TRUE((*kv)->Reserve(a, 32).ok());
  ASSERT_TRUE((*kv)->Reserve(b, 32).ok());
  EXPECT_EQ((*kv)->num_free_blocks(), 0);
  ASSERT_TRUE((*kv)->RemoveSequence(a).ok());
  EXPECT_EQ((*kv)->num_free_blocks(), 2);
  EXPECT_FALSE((*kv)->HasSequence(a));
  const SeqId c = (*kv)->AddSequence();
  EXPECT_TRUE((*kv)->Reserve(c, 30).ok());
  EXPECT_EQ((*kv)->num_free_blocks(), 0);
}

// Peers send ids; an id the cache does not know is an error for that
// request, never a crash, and changes nothing.
TEST(KvCacheTest, UnknownSequenceIdsAreNotFoundAndChangeNothing) {
  auto kv = KvCache::Create(SmallConfig(4));
  ASSERT_TRUE(kv.ok());
  const SeqId s = (*kv)->AddSequence();
  ASSERT_TRUE((*kv)->Reserve(s, 20).ok());
  const SeqId unknown = 12345;
  EXPECT_EQ((*kv)->Reserve(unknown, 1).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ((*kv)->Length(unknown).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ((*kv)->Capacity(unknown).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ((*kv)->SetLength(unknown, 0).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ((*kv)->BlockTable(unknown).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ((*kv)->ExportLayer(unknown, 0).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ((*kv)->LayerSpans(unknown, 0, 1).status().code(), absl::StatusCode::kNotFound);
  const absl::Status removed = (*kv)->RemoveSequence(unknown);
  EXPECT_EQ(removed.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(removed.message().find("12345"), std::string::npos) << removed;
  EXPECT_EQ((*kv)->num_free_blocks(), 2);
  EXPECT_TRUE((*kv)->HasSequence(s));
  // Removing twice: the second is NotFound and frees nothing more.
  ASSERT_TRUE((*kv)->RemoveSequence(s).ok());
  EXPECT_EQ((*kv)->RemoveSequence(s).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ((*kv)->num_free_blocks(), 4);
}

TEST(KvCacheTest, SetLengthStaysWithinTheReservation) {
  auto kv = KvCache::Create(SmallConfig(4));
  ASSERT_TRUE(kv.ok());
  const SeqId s = (*kv)->AddSequence();
  ASSERT_TRUE((*kv)->Reserve(s, 20).ok());
  EXPECT_TRUE((*kv)->SetLength(s, 32).ok());
  EXPECT_EQ((*kv)->SetLength(s, 33).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ((*kv)->SetLength(s, -1).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(*(*kv)->Length(s), 32);
}

TEST(KvCacheTest, BadConfigIsAnError) {
  EXPECT_EQ(KvCache::Create(SmallConfig(0)).status().code(), absl::StatusCode::kInvalidArgument);
  KvCacheConfig bad = SmallConfig(2);
  bad.layout.head_dim = 0;
  EXPECT_EQ(KvCache::Create(bad).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(KvCacheTest, LayersAreDistinctStorage) {
  auto kv = KvCache::Create(SmallConfig(2));
  ASSERT_TRUE(kv.ok());
  const KvLayerView l0 = (*kv)->Layer(0), l1 = (*kv)->Layer(1);
  EXPECT_NE(l0.k, l1.k);
  EXPECT_NE(l0.k, l0.v);
  EXPECT_EQ(l0.block_tokens, 16);
  EXPECT_EQ((*kv)->block_bytes(), 2 * 2 * 16 * 8 * 2);
}

TEST(KvCacheTest, ExportedSpansCoverTheStoredBlocksInRegisteredRegions) {
  auto kv = KvCache::Create(SmallConfig(6));
  ASSERT_TRUE(kv.ok());
  const SeqId other = (*kv)->AddSequence(), s = (*kv)->AddSequence();
  ASSERT_TRUE((*kv)->Reserve(other, 16).ok());  // so s's blocks are not the first ones
  ASSERT_TRUE((*kv)->Reserve(s, 40).ok());      // 3 blocks
  ASSERT_TRUE((*kv)->SetLength(s, 20).ok());    // 2 of them hold tokens
  const std::vector<KvRegion> regions = (*kv)->MemoryRegions();
  ASSERT_EQ(regions.size(), 4u);  // 2 layers x K, V
  auto spans = (*kv)->ExportLayer(s, 1);
  ASSERT_TRUE(spans.ok()) << spans.status();
  ASSERT_EQ(spans->size(), 4u);  // 2 blocks x K, V
  const auto table = *(*kv)->BlockTable(s);
  const int64_t half = (*kv)->block_bytes() / 2;
  for (size_t i = 0; i < spans->size(); ++i) {
    const KvSpan& sp = (*spans)[i];
    EXPECT_EQ(sp.region, 2 + (int)(i % 2)) << i;  // layer 1: K region 2, V region 3
    EXPECT_EQ(sp.offset, table[i / 2] * half) << i;
    EXPECT_EQ(sp.bytes, half);
    EXPECT_LE(sp.offset + sp.bytes, regions[sp.region].bytes);
    EXPECT_EQ((*kv)->SpanData(sp), regions[sp.region].data + sp.offset);
  }
  // The kernels' view of layer 1 is the same memory.
  EXPECT_EQ(reinterpret_cast<std::byte*>((*kv)->Layer(1).k), regions[2].data);
  EXPECT_EQ((*kv)->ExportLayer(s, 2).status().code(), absl::StatusCode::kOutOfRange);
}

}  // namespace
}  // namespace pdq
