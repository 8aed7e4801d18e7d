// The KV cache's prefix cache without a model: hits on whole blocks only,
// shared blocks counted once, LRU eviction of unreferenced blocks only,
// forced hash collisions that still serve the right blocks, salts that
// isolate, and block accounting that always adds up.
#include <algorithm>
#include <cstring>
#include <numeric>

#include "common/check.h"
#include "engine/kv_cache.h"
#include "gtest/gtest.h"

namespace pdq {
namespace {

constexpr int kBlock = 16;

std::unique_ptr<KvCache> MakeCache(int64_t blocks, uint64_t mask = ~0ull) {
  KvCacheConfig c;
  c.layout.num_layers = 2;
  c.layout.kv_heads = 2;
  c.layout.head_dim = 8;
  c.layout.block_tokens = kBlock;
  c.layout.model_fingerprint = 42;
  c.num_blocks = blocks;
  c.prefix_hash_mask = mask;
  auto kv = KvCache::Create(c);
  PDQ_CHECK(kv.ok());
  return std::move(*kv);
}

std::vector<int32_t> Tokens(int n, int32_t first) {
  std::vector<int32_t> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

// Stands in for a forward pass: stamps every stored block of layer 0 with
// the tokens it holds, so a reader can check which KV it was given.
void Write(KvCache& kv, SeqId seq, const std::vector<int32_t>& tokens) {
  const int64_t start = *kv.Length(seq);
  ASSERT_TRUE(kv.Reserve(seq, (int64_t)tokens.size()).ok());
  std::vector<KvSpan> spans = *kv.LayerSpans(seq, 0, (int64_t)tokens.size());
  for (int64_t pos = start; pos < (int64_t)tokens.size(); ++pos) {
    std::byte* k = kv.SpanData(spans[2 * (pos / kBlock)]);
    std::memcpy(k + (pos % kBlock) * sizeof(int32_t), &tokens[pos], sizeof(int32_t));
  }
  ASSERT_TRUE(kv.SetLength(seq, (int64_t)tokens.size()).ok());
}

// The tokens a sequence's KV claims to hold, read back from the stamps.
std::vector<int32_t> Read(const KvCache& kv, SeqId seq) {
  const int64_t n = *kv.Length(seq);
  std::vector<KvSpan> spans = *kv.LayerSpans(seq, 0, n);
  std::vector<int32_t> out(n);
  for (int64_t pos = 0; pos < n; ++pos) {
    std::memcpy(&out[pos], kv.SpanData(spans[2 * (pos / kBlock)]) + (pos % kBlock) * sizeof(int32_t),
                sizeof(int32_t));
  }
  return out;
}

// A finished request: computes `tokens` (after whatever prefix it reused),
// caches its blocks and ends. Returns the tokens it reused.
int64_t Serve(KvCache& kv, const std::vector<int32_t>& tokens, const std::string& salt = "") {
  const SeqId s = kv.AddSequence();
  const uint64_t seed = kv.PrefixSeed(salt);
  const int64_t hit = *kv.AttachPrefix(s, tokens, seed, (int64_t)tokens.size() - 1);
  Write(kv, s, tokens);
  EXPECT_EQ(Read(kv, s), tokens);
  EXPECT_TRUE(kv.CachePrefix(s, tokens, seed, "fp16").ok());
  EXPECT_TRUE(kv.RemoveSequence(s).ok());
  return hit;
}

TEST(PrefixCacheTest, ReusesWholeBlocksOfACommonPrefix) {
  auto kv = MakeCache(16);
  std::vector<int32_t> a = Tokens(50, 100);  // 3 whole blocks and 2 tokens
  EXPECT_EQ(Serve(*kv, a), 0);
  EXPECT_EQ(kv->prefix_stats().cached_blocks, 3);
  EXPECT_EQ(kv->num_free_blocks(), 16);  // cached but unreferenced: available
  // A follow-up sharing the first 40 tokens reuses 2 blocks.
  std::vector<int32_t> b(a.begin(), a.begin() + 40);
  for (int i = 0; i < 30; ++i) b.push_back(7000 + i);
  EXPECT_EQ(Serve(*kv, b), 32);
  // The same prompt again: all but the last token may be reused, in whole
  // blocks (a prompt must compute at least one token for its logits).
  EXPECT_EQ(Serve(*kv, a), 48);
  std::vector<int32_t> exact = Tokens(48, 100);
  EXPECT_EQ(Serve(*kv, exact), 32);
  EXPECT_EQ(kv->num_free_blocks(), 16);
}

TEST(PrefixCacheTest, SharedBlocksAreCountedOnceAndNeverRewritten) {
  auto kv = MakeCache(8);
  std::vector<int32_t> p = Tokens(40, 1);
  Serve(*kv, p);
  const SeqId x = kv->AddSequence(), y = kv->AddSequence();
  const uint64_t seed = kv->PrefixSeed("");
  EXPECT_EQ(*kv->AttachPrefix(x, p, seed, 39), 32);
  EXPECT_EQ(*kv->AttachPrefix(y, p, seed, 39), 32);
  EXPECT_EQ((*kv->BlockTable(x))[0], (*kv->BlockTable(y))[0]);
  // Two sequences of 40 + 40 tokens: 2 shared blocks + 2 * 2 own ones.
  std::vector<int32_t> px = p, py = p;
  for (int i = 0; i < 40; ++i) px.push_back(500 + i), py.push_back(900 + i);
  Write(*kv, x, px);
  Write(*kv, y, py);
  EXPECT_EQ(kv->num_free_blocks(), 8 - 2 - 2 * 3);
  EXPECT_EQ(Read(*kv, x), px);
  EXPECT_EQ(Read(*kv, y), py);
  EXPECT_EQ(kv->AttachPrefix(x, p, seed, 39).status().code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(kv->RemoveSequence(x).ok());
  ASSERT_TRUE(kv->RemoveSequence(y).ok());
  EXPECT_EQ(kv->num_free_blocks(), 8);
}

TEST(PrefixCacheTest, EvictsLeastRecentlyUsedUnreferencedBlocksOnly) {
  auto kv = MakeCache(6);
  std::vector<int32_t> a = Tokens(33, 1), b = Tokens(33, 1000);
  Serve(*kv, a);  // caches 2 blocks
  Serve(*kv, b);  // 2 more; a's are older
  EXPECT_EQ(kv->prefix_stats().cached_blocks, 4);
  // A holder of b's prefix keeps those blocks out of reach of eviction.
  const SeqId hold = kv->AddSequence();
  EXPECT_EQ(*kv->AttachPrefix(hold, b, kv->PrefixSeed(""), 32), 32);
  EXPECT_EQ(kv->num_free_blocks(), 4);
  // A reservation needing all 4 available blocks evicts a's 2, never b's.
  const SeqId big = kv->AddSequence();
  ASSERT_TRUE(kv->Reserve(big, 4 * kBlock).ok());
  EXPECT_EQ(kv->prefix_stats().evictions, 2);
  EXPECT_EQ(kv->num_free_blocks(), 0);
  EXPECT_EQ(kv->Reserve(big, 5 * kBlock).code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(kv->RemoveSequence(big).ok());
  ASSERT_TRUE(kv->RemoveSequence(hold).ok());
  EXPECT_EQ(Serve(*kv, a), 0);   // evicted
  EXPECT_EQ(Serve(*kv, b), 32);  // kept
  EXPECT_EQ(kv->num_free_blocks(), 6);
}

// A freed sequence's cached blocks go back to the LRU last first (so a
// prefix loses its tail before its head); a reservation that evicts them
// still gets its new blocks in ascending order, consecutive where they were
// (decode attention streams consecutive blocks: KvCache::Reserve).
TEST(PrefixCacheTest, BlocksTakenFromTheLruComeInAscendingOrder) {
  auto kv = MakeCache(8);
  Serve(*kv, Tokens(8 * kBlock, 1));  // the whole pool, cached, in the LRU
  EXPECT_EQ(kv->prefix_stats().cached_blocks, 8);
  ASSERT_EQ(kv->num_free_blocks(), 8);
  const SeqId s = kv->AddSequence();
  ASSERT_TRUE(kv->Reserve(s, 5 * kBlock).ok());
  EXPECT_EQ(kv->prefix_stats().evictions, 5);
  const std::span<const int32_t> t5 = *kv->BlockTable(s);
  const std::vector<int32_t> table(t5.begin(), t5.end());
  ASSERT_EQ(table.size(), 5u);
  for (size_t i = 1; i < table.size(); ++i) EXPECT_EQ(table[i], table[i - 1] + 1) << i;
  // Growing it takes the next ones after those it holds.
  ASSERT_TRUE(kv->Reserve(s, 8 * kBlock).ok());
  const std::span<const int32_t> grown = *kv->BlockTable(s);
  EXPECT_TRUE(std::is_sorted(grown.begin() + 5, grown.end()));
  ASSERT_TRUE(kv->RemoveSequence(s).ok());
  EXPECT_EQ(kv->num_free_blocks(), 8);
}

TEST(PrefixCacheTest, ForcedHashCollisionsStillServeTheRightBlocks) {
  // Every block hashes to the same index slot: only the stored tokens and
  // the parent tell them apart.
  auto kv = MakeCache(32, /*mask=*/0);
  std::vector<int32_t> a = Tokens(40, 1), b = Tokens(40, 1);
  b[20] = 999;  // same first block, different second block
  std::vector<int32_t> c = Tokens(40, 500);
  Serve(*kv, a);
  EXPECT_EQ(Serve(*kv, b), 16);
  EXPECT_EQ(Serve(*kv, c), 0);
  EXPECT_EQ(Serve(*kv, a), 32);  // Serve checks the KV read back is a's
  EXPECT_EQ(Serve(*kv, b), 32);
  EXPECT_EQ(Serve(*kv, c), 32);
  // Same second-block tokens behind a different first block: no match
  // past the first block.
  std::vector<int32_t> d = c;
  std::copy(a.begin() + 16, a.begin() + 32, d.begin() + 16);
  EXPECT_EQ(Serve(*kv, d), 16);
}

TEST(PrefixCacheTest, SaltsIsolate) {
  auto kv = MakeCache(16);
  std::vector<int32_t> p = Tokens(40, 1);
  EXPECT_EQ(Serve(*kv, p, "tenant-a"), 0);
  EXPECT_EQ(Serve(*kv, p, "tenant-b"), 0);
  EXPECT_EQ(Serve(*kv, p, ""), 0);
  EXPECT_EQ(Serve(*kv, p, "tenant-a"), 32);
  EXPECT_EQ(Serve(*kv, p, "tenant-b"), 32);
  EXPECT_NE(kv->PrefixSeed("a"), kv->PrefixSeed("b"));
}

TEST(PrefixCacheTest, ReCachingAfterTheParentLeftRefilesTheBlock) {
  auto kv = MakeCache(8);
  std::vector<int32_t> p = Tokens(48, 1);
  const uint64_t seed = kv->PrefixSeed("");
  // x caches its first block; y computes the same tokens privately, so its
  // later blocks are filed behind x's first block.
  const SeqId x = kv->AddSequence();
  Write(*kv, x, std::vector<int32_t>(p.begin(), p.begin() + 16));
  EXPECT_EQ(*kv->CachePrefix(x, p, seed, "w8a8"), 1);
  const SeqId y = kv->AddSequence();
  Write(*kv, y, p);
  EXPECT_EQ(*kv->CachePrefix(y, p, seed, "w8a8"), 2);
  ASSERT_TRUE(kv->RemoveSequence(x).ok());
  // x's block is evicted; y caches again (its answer grew): its first block
  // now heads the chain and the rest follow it.
  const SeqId filler = kv->AddSequence();
  ASSERT_TRUE(kv->Reserve(filler, 5 * kBlock).ok());
  EXPECT_EQ(kv->prefix_stats().evictions, 1);
  ASSERT_TRUE(kv->RemoveSequence(filler).ok());
  EXPECT_EQ(*kv->CachePrefix(y, p, seed, "w8a8"), 3);
  ASSERT_TRUE(kv->RemoveSequence(y).ok());
  const SeqId z = kv->AddSequence();
  EXPECT_EQ(*kv->AttachPrefix(z, p, seed, 48), 48);
  EXPECT_EQ(Read(*kv, z), p);
  EXPECT_EQ(kv->BlockWriter((*kv->BlockTable(z))[0]), "w8a8");
  ASSERT_TRUE(kv->RemoveSequence(z).ok());
  EXPECT_EQ(kv->num_free_blocks(), 8);
}

TEST(PrefixCacheTest, EachPrecisionsCopyOfABlockIsCachedAndFoundByWriter) {
  auto kv = MakeCache(16);
  const std::vector<int32_t> p = Tokens(40, 1);
  const uint64_t seed = kv->PrefixSeed("");
  auto serve = [&](const std::string& writer) {
    const SeqId s = kv->AddSequence();
    const int64_t hit = *kv->AttachPrefix(s, p, seed, 39, writer);
    Write(*kv, s, p);
    EXPECT_TRUE(kv->CachePrefix(s, p, seed, writer).ok());
    EXPECT_TRUE(kv->RemoveSequence(s).ok());
    return hit;
  };
  EXPECT_TRUE(kv->TakePrefixEvents().stored.empty());
  EXPECT_EQ(serve("w4a16"), 0);
  EXPECT_EQ(serve("w8a8"), 0);  // the W4A16 copy is not W8A8's
  EXPECT_EQ(kv->prefix_stats().cached_blocks, 4);
  EXPECT_EQ(serve("w8a8"), 32);
  EXPECT_EQ(serve("w4a16"), 32);
  const SeqId any = kv->AddSequence();
  EXPECT_EQ(*kv->AttachPrefix(any, p, seed, 39), 32);
  ASSERT_TRUE(kv->RemoveSequence(any).ok());
  // The router hears of each hash once.
  EXPECT_EQ(kv->TakePrefixEvents().stored.size(), 2u);
  EXPECT_EQ(kv->CachedHashes().size(), 2u);
}

TEST(PrefixCacheTest, EventsListStoredAndEvictedHashes) {
  auto kv = MakeCache(4);
  EXPECT_TRUE(kv->TakePrefixEvents().stored.empty());  // turns the log on
  Serve(*kv, Tokens(33, 1));
  PrefixEvents e = kv->TakePrefixEvents();
  ASSERT_EQ(e.stored.size(), 2u);
  std::sort(e.stored.begin(), e.stored.end());
  EXPECT_EQ(e.stored, kv->CachedHashes());
  const SeqId big = kv->AddSequence();
  ASSERT_TRUE(kv->Reserve(big, 4 * kBlock).ok());
  e = kv->TakePrefixEvents();
  EXPECT_EQ(e.removed.size(), 2u);
  EXPECT_FALSE(e.overflowed);
  EXPECT_TRUE(kv->CachedHashes().empty());
  ASSERT_TRUE(kv->RemoveSequence(big).ok());
  // Cached and evicted again between two reports: no change to report.
  Serve(*kv, Tokens(33, 500));
  const SeqId again = kv->AddSequence();
  ASSERT_TRUE(kv->Reserve(again, 4 * kBlock).ok());
  e = kv->TakePrefixEvents();
  EXPECT_TRUE(e.stored.empty());
  EXPECT_TRUE(e.removed.empty());
}

}  // namespace
}  // namespace pdq
