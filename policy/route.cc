#include "policy/route.h"

#include <tuple>

#include "common/hash.h"

namespace pdq::policy {

int BestCandidate(std::span<const RouteCandidate> candidates, int64_t prompt_tokens,
                  double load_tokens) {
  int best = -1;
  auto key = [&](const RouteCandidate& c) {
    const double cost =
        double(prompt_tokens - c.cached_tokens) + double(c.queued_tokens) + load_tokens * c.load;
    // Lower is better in every field.
    return std::make_tuple(c.unwanted, cost, ~c.affinity, -c.kv_blocks_free);
  };
  for (int i = 0; i < (int)candidates.size(); ++i) {
    if (best < 0 || key(candidates[i]) < key(candidates[best])) best = i;
  }
  return best;
}

int64_t CachedPrefixTokens(std::span<const uint64_t> request_hashes,
                           const absl::flat_hash_set<uint64_t>& held, int64_t block_tokens) {
  int64_t blocks = 0;
  while (blocks < (int64_t)request_hashes.size() && held.contains(request_hashes[blocks])) {
    ++blocks;
  }
  return blocks * block_tokens;
}

uint64_t Affinity(std::string_view client_id, std::string_view worker_id) {
  if (client_id.empty()) return 0;
  const uint64_t h = Hash64(worker_id, Hash64(client_id, 0x61666669ull));
  return h == 0 ? 1 : h;
}

}  // namespace pdq::policy
