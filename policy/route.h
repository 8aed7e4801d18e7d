// Which worker should take a request, given how much of its prompt each
// worker's KV prefix cache holds and how busy each is: a pure function, so
// the policy is tested on its own (tests/cache_routing_test.cc), stated in
// one place (README, "Cache-aware routing") and shared by the router and
// the cluster simulator (sim/).
//
//   cost(w) = (prompt_tokens - cached_tokens(w)) + queued_tokens(w)
//             + load_tokens * load(w)
//
// cached_tokens(w): the leading whole blocks of the prompt whose chained
// hashes (common/prefix_hash.h) w reported holding; queued_tokens(w): the
// prompt tokens waiting for its prefill; load(w): the requests it is
// decoding (a prefill worker: none) plus those the router has sent it and
// not yet seen answered. The lowest cost wins; among equal costs, the worker the client
// id hashes to (rendezvous hashing: a client with no cached prefix anywhere
// keeps landing on one worker), then the one with the most free KV blocks.
// Health, drain and the A/B pool split are decided before: only workers
// that may take the request are candidates, and a worker the last attempt
// failed on ranks after every other whatever its cache holds.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "absl/container/flat_hash_set.h"

namespace pdq::policy {

struct RouteCandidate {
  bool unwanted = false;      // failed the last attempt, or its connection is failing
  int64_t cached_tokens = 0;  // leading prompt tokens its prefix cache holds
  int64_t queued_tokens = 0;  // prompt tokens waiting for its prefill
  double load = 0;            // requests it is busy with (see above)
  int64_t kv_blocks_free = 0;
  uint64_t affinity = 0;  // Affinity(client_id, worker id); 0 without a client id
};

// How many prompt tokens one request of load is worth. 512 was the best of
// 0, 512 and 100000 with two workers under 8 conversations
// (bench/routing_bench.sh): a follow-up goes to the worker holding its
// conversation unless that worker is a request or two busier than another.
inline constexpr double kDefaultLoadTokens = 512;

// The index of the best candidate; -1 for none.
int BestCandidate(std::span<const RouteCandidate> candidates, int64_t prompt_tokens,
                  double load_tokens = kDefaultLoadTokens);

// The prompt tokens covered by the leading run of `request_hashes` (one per
// whole block) that `held` contains.
int64_t CachedPrefixTokens(std::span<const uint64_t> request_hashes,
                           const absl::flat_hash_set<uint64_t>& held, int64_t block_tokens);

// Rendezvous hash of a client id and a worker id (never 0); 0 for an empty
// client id.
uint64_t Affinity(std::string_view client_id, std::string_view worker_id);

}  // namespace pdq::policy
