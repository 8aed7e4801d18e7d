// The human half of the accuracy evaluation (`pdq eval blind-ab` and `pdq
// eval tally`): two deployments answer the same prompts; a self-contained
// page (harness/review_page.html, compiled in) shows each prompt's two
// answers in random order, reviewers pick the better one or a tie and export
// their votes, and the votes are joined with the key (which side was which)
// and counted with a confidence interval.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/security.h"

namespace pdq {

// The greedy chat answers of one deployment to `prompts`, `concurrency` at a
// time: "router=HOST:PORT" (reached as `remote` says), or the path of a
// `pdq up` config, started for the purpose on loopback (its files in `dir`)
// and stopped after. An error names the prompt that failed; Cancelled on
// SIGINT or SIGTERM (harness/local_run.h).
absl::StatusOr<std::vector<std::string>> CollectAnswers(const std::string& deployment,
                                                        const std::vector<std::string>& prompts,
                                                        int max_tokens, int concurrency,
                                                        const std::string& dir,
                                                        const server::Dialing& remote);

// What a review writes: the page for reviewers (nothing in it says which
// deployment wrote which answer), the key kept apart, and both sides'
// answers by prompt.
struct BlindReview {
  std::string page;
  nlohmann::json key, answers;
};
// The same `seed` gives the same order of every pair and the same review id.
BlindReview MakeBlindReview(const std::vector<std::string>& prompts,
                            const std::vector<std::string>& answers_a,
                            const std::vector<std::string>& answers_b, const std::string& a,
                            const std::string& b, uint64_t seed);

struct VoteCount {
  int a_better = 0, b_better = 0, ties = 0;
  // B's share of the decisive votes and its 95% Wilson interval (0 without
  // decisive votes).
  double b_share = 0, b_share_low = 0, b_share_high = 0;
};
// Joins each votes file (as exported by the page) with the key; an error
// names the file and the vote that does not belong (another review, an
// unknown item, a choice other than left, right or tie).
absl::StatusOr<VoteCount> CountVotes(
    const nlohmann::json& key, const std::vector<std::pair<std::string, nlohmann::json>>& votes);

}  // namespace pdq
