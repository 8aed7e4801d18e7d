// Blind review of two deployments' answers (harness/blind_review.h).
#include "harness/blind_review.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "harness/local_run.h"
#include "pdq/v1/pdq.grpc.pb.h"
#include "server/server.h"

namespace pdq {

// The review page (harness/review_page.html, compiled in by
// cmake/embed_text.cmake): the items are data, put in place of __DATA__;
// the page draws them, records votes in the browser's storage (a reviewer
// can stop and come back) and exports them as JSON.
std::string_view ReviewPage();

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// JSON inside <script>: "</" would end the element.
std::string ScriptSafe(std::string s) {
  for (size_t at = 0; (at = s.find("</", at)) != std::string::npos; at += 3)
    s.replace(at, 2, "<\\/");
  return s;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> CollectAnswers(const std::string& deployment,
                                                        const std::vector<std::string>& prompts,
                                                        int max_tokens, int concurrency,
                                                        const std::string& dir,
                                                        const server::Dialing& remote) {
  LocalDeployment local;
  std::string address;
  server::Dialing dialing;
  if (absl::StartsWith(deployment, "router=")) {
    address = deployment.substr(7);
    dialing = remote;
  } else {
    std::ifstream in(deployment);
    if (!in) {
      return absl::NotFoundError(
          absl::StrCat("cannot read the deployment config '", deployment, "'"));
    }
    json config = json::parse(in, nullptr, false);
    if (!config.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(deployment, " is neither router=HOST:PORT nor a pdq up config (JSON)"));
    }
    config["listen"] = "127.0.0.1:0";  // whatever the file says: this run's own ports
    fs::create_directories(dir);
    std::fprintf(stderr, "pdq eval blind-ab: starting %s\n", deployment.c_str());
    if (absl::Status s = local.Start(config, dir); !s.ok()) return s;
    address = local.address();
  }
  auto stub = v1::Pdq::NewStub(server::Dial(address, dialing));
  std::vector<std::string> answers(prompts.size());
  std::vector<grpc::Status> errors(prompts.size());
  std::atomic<size_t> next{0}, done{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < concurrency; ++t) {
    threads.emplace_back([&] {
      for (size_t i; (i = next++) < prompts.size() && !interrupted();) {
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(10));
        v1::GenerateRequest req;
        req.set_request_id(absl::StrCat("blind-ab-", i));
        v1::ChatMessage* m = req.mutable_chat()->add_messages();
        m->set_role("user");
        m->set_content(prompts[i]);
        req.set_max_tokens(max_tokens);  // greedy: sampling left at its zero default
        auto reader = stub->Generate(&ctx, req);
        v1::GenerateResponse r;
        while (reader->Read(&r)) answers[i] += r.delta().text();
        errors[i] = reader->Finish();
        std::fprintf(stderr, "\rpdq eval blind-ab: %s: %zu/%zu answers", deployment.c_str(), ++done,
                     prompts.size());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  std::fprintf(stderr, "\n");
  if (interrupted()) return absl::CancelledError("interrupted");
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (!errors[i].ok()) {
      return absl::UnavailableError(
          absl::StrCat(deployment, ": prompt ", i + 1, " failed: ", errors[i].error_message()));
    }
  }
  return answers;
}

BlindReview MakeBlindReview(const std::vector<std::string>& prompts,
                            const std::vector<std::string>& answers_a,
                            const std::vector<std::string>& answers_b, const std::string& a,
                            const std::string& b, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const std::string review_id = absl::StrFormat("%016x", rng());
  json items = json::array(), key = json::array(), answers = json::array();
  for (size_t i = 0; i < prompts.size(); ++i) {
    const bool a_left = (rng() & 1) == 0;
    const std::string& left = a_left ? answers_a[i] : answers_b[i];
    const std::string& right = a_left ? answers_b[i] : answers_a[i];
    items.push_back({{"id", (int)i + 1}, {"prompt", prompts[i]}, {"left", left}, {"right", right}});
    key.push_back({{"id", (int)i + 1}, {"left", a_left ? "a" : "b"}});
    answers.push_back(
        {{"id", (int)i + 1}, {"prompt", prompts[i]}, {"a", answers_a[i]}, {"b", answers_b[i]}});
  }
  BlindReview r;
  r.page = std::string(ReviewPage());
  const json data = {{"review_id", review_id}, {"items", items}};
  r.page.replace(r.page.find("__DATA__"), 8, ScriptSafe(data.dump()));
  r.key = {{"review_id", review_id}, {"a", a}, {"b", b}, {"key", key}};
  r.answers = {{"a", a}, {"b", b}, {"answers", answers}};
  return r;
}

absl::StatusOr<VoteCount> CountVotes(const json& key,
                                     const std::vector<std::pair<std::string, json>>& votes) {
  if (!key.is_object() || !key.contains("key") || !key.contains("review_id")) {
    return absl::InvalidArgumentError("the key is not a blind-ab key.json");
  }
  std::map<int, std::string> left_is;
  for (const json& k : key["key"]) left_is[k.value("id", 0)] = k.value("left", "");
  VoteCount c;
  for (const auto& [file, v] : votes) {
    if (!v.is_object() || !v.contains("votes") || !v["votes"].is_array()) {
      return absl::InvalidArgumentError(absl::StrCat(file, " is not an exported votes file"));
    }
    if (v.value("review_id", "") != key["review_id"]) {
      return absl::InvalidArgumentError(absl::StrCat(file, " belongs to review ",
                                                     v.value("review_id", "?"), ", the key to ",
                                                     key["review_id"].get<std::string>()));
    }
    for (const json& vote : v["votes"]) {
      const int id = vote.value("id", 0);
      const std::string choice = vote.value("choice", "");
      if (!left_is.count(id) || (choice != "left" && choice != "right" && choice != "tie")) {
        return absl::InvalidArgumentError(
            absl::StrCat(file, ": vote ", vote.dump(), " is not valid"));
      }
      if (choice == "tie") {
        ++c.ties;
      } else if ((choice == "left") == (left_is[id] == "a")) {
        ++c.a_better;
      } else {
        ++c.b_better;
      }
    }
  }
  // Wilson score interval for B's share of the decisive votes.
  const int n = c.a_better + c.b_better;
  const double z = 1.959964, p = n ? (double)c.b_better / n : 0;
  const double centre = n ? (p + z * z / (2 * n)) / (1 + z * z / n) : 0;
  const double half =
      n ? z * std::sqrt(p * (1 - p) / n + z * z / (4.0 * n * n)) / (1 + z * z / n) : 0;
  c.b_share = p;
  c.b_share_low = centre - half;
  c.b_share_high = centre + half;
  return c;
}

}  // namespace pdq
