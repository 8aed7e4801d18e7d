// The router's cache-aware choice of worker as a pure function: the cached
// prefix against the load, client affinity only between equals, and a
// worker to avoid never preferred for its cache.
#include "policy/route.h"

#include <vector>

#include "common/prefix_hash.h"
#include "gtest/gtest.h"

namespace pdq::policy {
namespace {

TEST(CacheRoutingTest, TheWorkerHoldingThePrefixWinsAtEqualLoad) {
  std::vector<RouteCandidate> c(3);
  c[1].cached_tokens = 1024;
  EXPECT_EQ(BestCandidate(c, 1100), 1);
}

TEST(CacheRoutingTest, LoadOutweighsACacheOnlyWhenItCostsMoreThanRecomputing) {
  std::vector<RouteCandidate> c(2);
  c[0].cached_tokens = 1024;
  c[0].load = 1;  // 512 tokens' worth of load against 1024 saved
  EXPECT_EQ(BestCandidate(c, 1100), 0);
  c[0].load = 3;  // 1536 against 1024
  EXPECT_EQ(BestCandidate(c, 1100), 1);
  // The weight of load is a parameter.
  EXPECT_EQ(BestCandidate(c, 1100, /*load_tokens=*/100), 0);
}

TEST(CacheRoutingTest, QueuedPromptTokensCountAsWork) {
  std::vector<RouteCandidate> c(2);
  c[0].cached_tokens = 512;
  c[0].queued_tokens = 1000;  // more to compute first than the cache saves
  EXPECT_EQ(BestCandidate(c, 600), 1);
  c[0].queued_tokens = 100;
  EXPECT_EQ(BestCandidate(c, 600), 0);
  // A load weight of 0 leaves the cache and the queues to decide.
  c[0].load = 5;
  EXPECT_EQ(BestCandidate(c, 600, /*load_tokens=*/0), 0);
}

TEST(CacheRoutingTest, WithoutACacheTheLeastLoadedWins) {
  std::vector<RouteCandidate> c(3);
  c[0].load = 2;
  c[1].load = 1;
  c[2].load = 3;
  EXPECT_EQ(BestCandidate(c, 300), 1);
}

TEST(CacheRoutingTest, AnUnwantedWorkerLosesWhateverItHolds) {
  std::vector<RouteCandidate> c(2);
  c[0].cached_tokens = 4096;
  c[0].unwanted = true;
  c[1].load = 10;
  EXPECT_EQ(BestCandidate(c, 4100), 1);
  c[1].unwanted = true;  // all unwanted: the best of them
  EXPECT_EQ(BestCandidate(c, 4100), 0);
  EXPECT_EQ(BestCandidate({}, 10), -1);
}

TEST(CacheRoutingTest, ClientAffinityBreaksTiesAndIsStable) {
  const std::vector<std::string> workers = {"decode-a", "decode-b", "decode-c", "decode-d"};
  int moved = 0;
  for (int client = 0; client < 200; ++client) {
    const std::string id = "user-" + std::to_string(client);
    std::vector<RouteCandidate> c(workers.size());
    for (size_t i = 0; i < workers.size(); ++i) c[i].affinity = Affinity(id, workers[i]);
    const int first = BestCandidate(c, 100);
    EXPECT_EQ(BestCandidate(c, 100), first);
    // Removing another worker keeps the client where it was (rendezvous).
    const int other = (first + 1) % (int)workers.size();
    std::vector<RouteCandidate> fewer;
    std::vector<int> index;
    for (int i = 0; i < (int)c.size(); ++i) {
      if (i != other) fewer.push_back(c[i]), index.push_back(i);
    }
    EXPECT_EQ(index[BestCandidate(fewer, 100)], first);
    moved += first != 0;
  }
  EXPECT_GT(moved, 100);  // clients spread over the workers
  // Affinity never outweighs a cost difference.
  std::vector<RouteCandidate> c(2);
  c[0].affinity = ~0ull;
  c[1].cached_tokens = 16;
  EXPECT_EQ(BestCandidate(c, 100), 1);
  EXPECT_EQ(Affinity("", "decode-a"), 0u);
}

TEST(CacheRoutingTest, CachedPrefixCountsTheLeadingRunOfHeldBlocks) {
  std::vector<int32_t> prompt(70);
  for (int i = 0; i < 70; ++i) prompt[i] = i;
  const std::vector<uint64_t> h = PrefixBlockHashes(PrefixSeed("layout", ""), prompt, 16);
  ASSERT_EQ(h.size(), 4u);
  absl::flat_hash_set<uint64_t> held = {h[0], h[1], h[3]};
  EXPECT_EQ(CachedPrefixTokens(h, held, 16), 32);  // h[3] is behind a gap
  held.insert(h[2]);
  EXPECT_EQ(CachedPrefixTokens(h, held, 16), 64);
  EXPECT_EQ(CachedPrefixTokens(h, {}, 16), 0);
  // Another salt is another chain.
  const std::vector<uint64_t> salted = PrefixBlockHashes(PrefixSeed("layout", "t"), prompt, 16);
  EXPECT_EQ(CachedPrefixTokens(salted, held, 16), 0);
}

}  // namespace
}  // namespace pdq::policy
