// The identity of a cached KV block, as workers and the router compute it:
// a chain of hashes over whole blocks of token ids, seeded with the KV
// layout (a different model or layout never matches) and the request's
// cache salt (tenants never share blocks). Block i's hash covers every token
// before it, so equal hashes mean equal prefixes up to a collision, which
// the KV cache rules out by comparing the stored tokens.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "common/hash.h"

namespace pdq {

// `layout_bytes`: the serialized KvLayout (engine/kv_layout.h).
inline uint64_t PrefixSeed(std::string_view layout_bytes, std::string_view salt) {
  return Hash64(salt, Hash64(layout_bytes, 0x70726566697863ull) ^ salt.size());
}

// Hash of one block given its parent's (the seed for the first block).
inline uint64_t ChainBlockHash(uint64_t parent, std::span<const int32_t> block) {
  return Hash64(block.data(), block.size_bytes(), parent);
}

// The hashes of the whole blocks of `tokens`, in order.
inline std::vector<uint64_t> PrefixBlockHashes(uint64_t seed, std::span<const int32_t> tokens,
                                               int64_t block_tokens) {
  std::vector<uint64_t> out;
  if (block_tokens <= 0) return out;
  uint64_t h = seed;
  for (int64_t b = 0; (b + 1) * block_tokens <= (int64_t)tokens.size(); ++b) {
    h = ChainBlockHash(h, tokens.subspan(b * block_tokens, block_tokens));
    out.push_back(h);
  }
  return out;
}

}  // namespace pdq
