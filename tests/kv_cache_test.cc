// Paged KV cache: block accounting, all-or-nothing reservations, reuse.
#include "engine/kv_cache.h"

#include "gtest/gtest.h"

namespace pdq {
namespace {

KvCacheConfig SmallConfig(int64_t blocks) {
  KvCacheConfig c;
  c.num_layers = 2;
  c.kv_heads = 2;
  c.head_dim = 8;
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
  EXPECT_EQ((*kv)->BlockTable(s).size(), 2u);
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
  EXPECT_EQ((*kv)->BlockTable(s).size(), 2u);
}

TEST(KvCacheTest, RemoveSequenceReturnsBlocksToPool) {
  auto kv = KvCache::Create(SmallConfig(4));
  ASSERT_TRUE(kv.ok());
  const SeqId a = (*kv)->AddSequence(), b = (*kv)->AddSequence();
  ASSERT_TRUE((*kv)->Reserve(a, 32).ok());
  ASSERT_TRUE((*kv)->Reserve(b, 32).ok());
  EXPECT_EQ((*kv)->num_free_blocks(), 0);
  (*kv)->RemoveSequence(a);
  EXPECT_EQ((*kv)->num_free_blocks(), 2);
  EXPECT_FALSE((*kv)->HasSequence(a));
  const SeqId c = (*kv)->AddSequence();
  EXPECT_TRUE((*kv)->Reserve(c, 30).ok());
  EXPECT_EQ((*kv)->num_free_blocks(), 0);
  (*kv)->RemoveSequence(12345);  // unknown ids are ignored
}

TEST(KvCacheTest, UnknownSequenceAndBadConfigAreErrors) {
  auto kv = KvCache::Create(SmallConfig(2));
  ASSERT_TRUE(kv.ok());
  EXPECT_EQ((*kv)->Reserve(99, 1).code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(KvCache::Create(SmallConfig(0)).ok());
  KvCacheConfig bad = SmallConfig(2);
  bad.head_dim = 0;
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

}  // namespace
}  // namespace pdq
