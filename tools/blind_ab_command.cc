// `pdq eval blind-ab` and `pdq eval tally`: the human half of the accuracy
// evaluation (harness/blind_review.h). blind-ab asks two deployments the
// same prompts and writes a self-contained review page showing each
// prompt's two answers in random order (which side is which is kept apart,
// in key.json); reviewers pick the better answer or a tie and export their
// votes. tally joins votes with the key and counts them with a confidence
// interval.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "harness/blind_review.h"
#include "harness/local_run.h"
#include "tools/commands.h"

namespace pdq {

namespace fs = std::filesystem;
using json = nlohmann::json;

int BlindAbCommand(int argc, char** argv) {
  std::string prompts_path, a, b, out;
  int64_t count = 100, max_tokens = 256, concurrency = 4, seed = 1;
  FlagParser flags(
      "eval blind-ab",
      "Asks two deployments the same prompts (chat, greedy) and writes OUT/review.html: "
      "a self-contained page showing each prompt's two answers in random order, where "
      "a reviewer picks the better one or a tie and exports the votes. Which side is "
      "which stays in OUT/key.json, for pdq eval tally.");
  flags.String("prompts", &prompts_path, "one prompt per line (eval/prompts/review-100.txt)");
  flags.String("a", &a, "deployment A: a pdq up config (deploy/local/*.json) or router=HOST:PORT");
  flags.String("b", &b, "deployment B: the same forms");
  flags.String("out", &out, "where review.html, key.json and answers.json go");
  flags.Int("count", &count, 1, 10000, "the first this many prompts");
  flags.Int("max-tokens", &max_tokens, 1, 4096, "answer length at most");
  flags.Int("concurrency", &concurrency, 1, 256, "requests in flight per deployment");
  flags.Int("seed", &seed, 0, INT64_MAX, "seeds the order of each pair");
  ConnectionFlags connection;  // for the router= forms
  connection.Register(flags);
  if (int rc = ParseOrExit(flags, argc, argv, 3, "pdq eval blind-ab"); rc >= 0) return rc;
  absl::StatusOr<server::Dialing> remote = connection.Dialing();
  if (!remote.ok()) return Fail("eval blind-ab", remote.status());
  if (prompts_path.empty() || a.empty() || b.empty() || out.empty()) {
    return Fail("eval blind-ab",
                absl::InvalidArgumentError("--prompts, --a, --b and --out are all required"));
  }
  absl::StatusOr<std::string> text = ReadTextFile(prompts_path, "--prompts");
  if (!text.ok()) return Fail("eval blind-ab", text.status());
  std::vector<std::string> prompts;
  for (absl::string_view line : absl::StrSplit(*text, '\n', absl::SkipWhitespace())) {
    if ((int64_t)prompts.size() < count) prompts.emplace_back(line);
  }
  if (prompts.empty()) {
    return Fail("eval blind-ab",
                absl::InvalidArgumentError(absl::StrCat(prompts_path, " has no prompts")));
  }
  std::error_code ec;
  fs::create_directories(out, ec);
  if (ec) return Fail("eval blind-ab", absl::UnavailableError(absl::StrCat("cannot create ", out)));
  CatchInterrupts();
  absl::StatusOr<std::vector<std::string>> answers_a =
      CollectAnswers(a, prompts, (int)max_tokens, (int)concurrency, out + "/deployment-a", *remote);
  if (!answers_a.ok()) return Fail("eval blind-ab", answers_a.status());
  absl::StatusOr<std::vector<std::string>> answers_b =
      CollectAnswers(b, prompts, (int)max_tokens, (int)concurrency, out + "/deployment-b", *remote);
  if (!answers_b.ok()) return Fail("eval blind-ab", answers_b.status());

  const BlindReview review = MakeBlindReview(prompts, *answers_a, *answers_b, a, b, (uint64_t)seed);
  std::ofstream(out + "/review.html") << review.page;
  std::ofstream(out + "/key.json") << review.key.dump(1) << "\n";
  std::ofstream(out + "/answers.json") << review.answers.dump(1) << "\n";
  std::printf(
      "pdq eval blind-ab: %zu prompts; review page %s/review.html (send it to reviewers; "
      "keep key.json), then: pdq eval tally --key %s/key.json --votes VOTES.json[,...]\n",
      prompts.size(), out.c_str(), out.c_str());
  return 0;
}

int TallyCommand(int argc, char** argv) {
  std::string key_path, votes_flag, json_path;
  FlagParser flags("eval tally",
                   "Counts the votes of pdq eval blind-ab reviews: A wins, B wins and ties, with "
                   "B's share of the decisive votes and its 95% Wilson interval.");
  flags.String("key", &key_path, "the review's key.json");
  flags.String("votes", &votes_flag, "the exported votes, comma-separated files");
  flags.String("json", &json_path, "also write the counts here");
  if (int rc = ParseOrExit(flags, argc, argv, 3, "pdq eval tally"); rc >= 0) return rc;
  if (key_path.empty() || votes_flag.empty()) {
    return Fail("eval tally", absl::InvalidArgumentError("--key and --votes are required"));
  }
  absl::StatusOr<std::string> key_text = ReadTextFile(key_path, "--key");
  if (!key_text.ok()) return Fail("eval tally", key_text.status());
  const json key = json::parse(*key_text, nullptr, false);
  if (!key.is_object() || !key.contains("key") || !key.contains("review_id")) {
    return Fail("eval tally",
                absl::InvalidArgumentError(absl::StrCat(key_path, " is not a blind-ab key.json")));
  }
  std::vector<std::pair<std::string, json>> votes;
  for (absl::string_view file : absl::StrSplit(votes_flag, ',', absl::SkipEmpty())) {
    absl::StatusOr<std::string> text = ReadTextFile(std::string(file), "--votes");
    if (!text.ok()) return Fail("eval tally", text.status());
    votes.emplace_back(std::string(file), json::parse(*text, nullptr, false));
  }
  absl::StatusOr<VoteCount> c = CountVotes(key, votes);
  if (!c.ok()) return Fail("eval tally", c.status());
  std::printf("A (%s) better: %d\nB (%s) better: %d\nties: %d\n", key.value("a", "").c_str(),
              c->a_better, key.value("b", "").c_str(), c->b_better, c->ties);
  if (c->a_better + c->b_better > 0) {
    std::printf(
        "B preferred in %.1f%% of decisive votes (95%% interval %.1f%% to %.1f%%, Wilson)%s\n",
        100 * c->b_share, 100 * c->b_share_low, 100 * c->b_share_high,
        c->b_share_low > 0.5    ? ": B is better"
        : c->b_share_high < 0.5 ? ": A is better"
                                : ": no difference shown");
  } else {
    std::printf("no decisive votes\n");
  }
  if (!json_path.empty()) {
    std::ofstream(json_path) << json({{"a_better", c->a_better},
                                      {"b_better", c->b_better},
                                      {"ties", c->ties},
                                      {"b_share", c->b_share},
                                      {"b_share_low", c->b_share_low},
                                      {"b_share_high", c->b_share_high}})
                                    .dump(1)
                             << "\n";
  }
  return 0;
}

}  // namespace pdq
