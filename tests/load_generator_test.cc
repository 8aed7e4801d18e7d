// The load generator's request counts: pdq bench gives every request of a
// sweep a text of its own from them (a repeated text would be answered from
// the server's prefix cache), so they must match what RunSweep sends. Its
// prompts: each its own, or sharing a system prompt's tokens.
#include "harness/load_generator.h"

#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "harness/bench_target.h"
#include "nlohmann/json.hpp"

namespace pdq {
namespace {

TEST(LoadGeneratorTest, SweepRequestsCountsEveryLevelAndItsWarmup) {
  SweepOptions o;
  o.levels = {1, 2, 4, 8, 16};
  o.per_client = 4;
  o.warmup = 1;
  // bench/load_bench.sh's sweep: 4 per client at each level, one warm-up each.
  EXPECT_EQ(SweepRequests(o), 4 * (1 + 2 + 4 + 8 + 16) + 5);
  o.per_client = 0;  // the default: 4 x the level, at least 8
  EXPECT_EQ(SweepRequests(o), 8 + 8 + 16 + 32 + 64 + 5);
  o.requests = 10;
  EXPECT_EQ(SweepRequests(o), 5 * 11);
  SweepOptions open;
  open.rate = 2;  // one open-loop level: 32 unless told
  open.warmup = 2;
  EXPECT_EQ(SweepRequests(open), 34);
  open.requests = 20;
  EXPECT_EQ(SweepRequests(open), 22);
}

// A sweep told --until-flat doubles its top level while output tokens/s is
// still rising by the report's rule (the lowest level within 5% of the most
// is the top), so it ends one level past where it saturates; never past
// until_flat. The request count covers the most it may run.
TEST(LoadGeneratorTest, UntilFlatDoublesTheTopLevelUntilOnePastSaturation) {
  auto sweep = [](std::vector<std::pair<int, double>> levels) {
    BenchResult b;
    for (const auto& [c, tps] : levels) {
      LevelResult l;
      l.concurrency = c;
      l.output_tokens_per_s = tps;
      b.levels.push_back(l);
    }
    return b;
  };
  EXPECT_EQ(FlatLevelAfter(sweep({{1, 100}, {4, 200}, {16, 300}}), 64), 32);  // still rising
  EXPECT_EQ(FlatLevelAfter(sweep({{1, 100}, {4, 200}, {16, 300}, {32, 330}}), 64), 64);
  // 320 is within 5% of 330: 32 was the point, 64 is past it.
  EXPECT_EQ(FlatLevelAfter(sweep({{16, 300}, {32, 330}, {64, 320}}), 256), 0);
  EXPECT_EQ(FlatLevelAfter(sweep({{16, 300}, {32, 330}, {64, 250}}), 256), 0);  // a fall
  EXPECT_EQ(FlatLevelAfter(sweep({{16, 300}, {32, 330}}), 63), 0);  // 64 is past the cap
  EXPECT_EQ(FlatLevelAfter(sweep({{8, 100}}), 64), 16);             // one level judges nothing
  // Still rising, but the top level had requests refused: the admission
  // bound, so no more clients.
  BenchResult refused = sweep({{1, 100}, {4, 200}, {16, 300}});
  refused.levels.back().requests_refused = 5;
  EXPECT_EQ(FlatLevelAfter(refused, 64), 0);
  refused = sweep({{8, 100}});
  refused.levels.back().requests_refused = 1;
  EXPECT_EQ(FlatLevelAfter(refused, 64), 0);
  EXPECT_EQ(FlatLevelAfter(sweep({{8, 0}}), 64), 0);                // nothing came back
  EXPECT_EQ(FlatLevelAfter(sweep({}), 64), 0);
  SweepOptions o;
  o.levels = {1, 4};
  o.per_client = 2;
  o.warmup = 1;
  o.until_flat = 20;  // 8 and 16 may follow
  EXPECT_EQ(SweepRequests(o), 2 * (1 + 4 + 8 + 16) + 4);
}

// A tokenizer of one token per word: word "wN" is token N (a piece cut
// from a word's end, without its "w", is no token).
std::vector<int32_t> Words(const std::string& t) {
  std::vector<int32_t> ids;
  for (absl::string_view w : absl::StrSplit(t, ' ', absl::SkipEmpty())) {
    int32_t id = 0;
    if (w[0] == 'w' && absl::SimpleAtoi(w.substr(1), &id)) ids.push_back(id);
  }
  return ids;
}

TEST(LoadGeneratorTest, PromptsAreTheirOwnOrShareAPrefixOfExactlyTheTokensAsked) {
  std::vector<std::string> words;
  for (int i = 0; i < 2000; ++i) words.push_back(absl::StrCat("w", i));
  const std::string text = absl::StrJoin(words, " ");
  const Tokenize tokenize = [](const std::string& t) -> absl::StatusOr<std::vector<int32_t>> {
    return Words(t);
  };
  const Detokenize detokenize = [](const std::vector<int32_t>& ids) -> absl::StatusOr<std::string> {
    std::vector<std::string> w;
    for (int32_t id : ids) w.push_back(absl::StrCat("w", id));
    return absl::StrJoin(w, " ");
  };
  absl::StatusOr<std::vector<BenchPrompt>> own = MakePrompts(tokenize, detokenize, text, 40, 8);
  ASSERT_TRUE(own.ok()) << own.status();
  ASSERT_EQ(own->size(), 8u);
  std::set<int32_t> firsts;
  for (const BenchPrompt& p : *own) {
    EXPECT_EQ(p.ids.size(), 40u);
    EXPECT_EQ(Words(p.text), p.ids);  // the text is those tokens
    firsts.insert(p.ids[0]);
  }
  EXPECT_EQ(firsts.size(), 8u);  // no two start alike
  absl::StatusOr<std::vector<BenchPrompt>> shared =
      MakePrompts(tokenize, detokenize, text, 40, 8, /*shared_prefix=*/24);
  ASSERT_TRUE(shared.ok()) << shared.status();
  ASSERT_EQ(shared->size(), 8u);
  std::set<std::vector<int32_t>> rests;
  for (const BenchPrompt& p : *shared) {
    ASSERT_EQ(p.ids.size(), 40u);
    EXPECT_EQ(Words(p.text), p.ids);
    EXPECT_TRUE(std::equal(p.ids.begin(), p.ids.begin() + 24, (*shared)[0].ids.begin()));
    rests.insert(std::vector<int32_t>(p.ids.begin() + 24, p.ids.end()));
  }
  EXPECT_EQ(rests.size(), 8u);  // each its own after the prefix
  // A tokenizer that starts every text with a BOS (-1), as the router's may:
  // one BOS, at the start, however the prompt was put together.
  const Tokenize with_bos = [](const std::string& t) -> absl::StatusOr<std::vector<int32_t>> {
    std::vector<int32_t> ids = Words(t);
    ids.insert(ids.begin(), -1);
    return ids;
  };
  for (int64_t prefix : {0, 24}) {
    absl::StatusOr<std::vector<BenchPrompt>> bos =
        MakePrompts(with_bos, detokenize, text, 40, 4, prefix);
    ASSERT_TRUE(bos.ok()) << bos.status();
    for (const BenchPrompt& p : *bos) {
      ASSERT_EQ(p.ids.size(), 40u);
      EXPECT_EQ(p.ids[0], -1);
      EXPECT_EQ(std::count(p.ids.begin(), p.ids.end(), -1), 1) << "shared prefix " << prefix;
    }
  }
  // Seeds: prompts of another seed, 0 included, start apart from every one of
  // this one's (a word apart, so none is answered from another run's cached
  // blocks), of the same lengths and still in the text; seed 0 is where they
  // always were. Seeds 1-3 alone once passed while seed 3 started a prompt in
  // seed 0's word.
  std::set<int32_t> starts;
  for (int64_t seed : {0, 1, 2, 3, 4, 5, 6, 7}) {
    absl::StatusOr<std::vector<BenchPrompt>> p =
        MakePrompts(tokenize, detokenize, text, 40, 8, 0, seed);
    ASSERT_TRUE(p.ok()) << p.status();
    ASSERT_EQ(p->size(), 8u);
    for (const BenchPrompt& q : *p) {
      EXPECT_EQ(q.ids.size(), 40u);
      EXPECT_TRUE(starts.insert(q.ids[0]).second) << "seed " << seed << ": w" << q.ids[0];
    }
    if (seed == 0) {
      for (size_t i = 0; i < p->size(); ++i) EXPECT_EQ((*p)[i].ids, (*own)[i].ids);
    }
  }
  // A prefix that leaves a prompt nothing of its own, or a text too short.
  EXPECT_EQ(MakePrompts(tokenize, detokenize, text, 40, 8, 40).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakePrompts(tokenize, detokenize, "w1 w2 w3", 40, 2).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// pdq bench --client-ids: closed-loop client c sends BenchClientId(c) with
// each of its requests, one at a time (the next when its last has ended);
// open-loop arrivals send none.
TEST(LoadGeneratorTest, ClosedLoopClientsSendTheirOwnIds) {
  struct Fake : BenchTarget {
    std::mutex mu;
    std::map<std::string, int> in_flight;
    std::vector<std::string> ids;
    bool overlap = false;
    BenchRecord Run(const BenchPrompt&, int64_t, int64_t, const std::string&,
                    const std::string& client_id) override {
      {
        std::lock_guard<std::mutex> lock(mu);
        ids.push_back(client_id);
        if (!client_id.empty() && in_flight[client_id]++ > 0) overlap = true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      {
        std::lock_guard<std::mutex> lock(mu);
        if (!client_id.empty()) --in_flight[client_id];
      }
      BenchRecord r;
      r.ok = true;
      r.output_tokens = 1;
      return r;
    }
  } fake;
  Driver driver(fake, {BenchPrompt{{1}, "a"}}, 1, 10);
  driver.set_client_ids(true);
  double seconds = 0;
  const std::vector<BenchRecord> records = driver.Run(3, 0, 12, 0, "ids", &seconds);
  EXPECT_FALSE(fake.overlap) << "a client had two requests in flight";
  EXPECT_EQ(std::set<std::string>(fake.ids.begin(), fake.ids.end()),
            (std::set<std::string>{"bench-client-0", "bench-client-1", "bench-client-2"}));
  ASSERT_EQ(records.size(), 12u);
  for (const BenchRecord& r : records) EXPECT_TRUE(r.client_id.starts_with("bench-client-"));
  fake.ids.clear();
  for (const BenchRecord& r : driver.Run(0, 200.0, 4, 0, "open", &seconds)) {
    EXPECT_EQ(r.client_id, "");
  }
  EXPECT_EQ(std::set<std::string>(fake.ids.begin(), fake.ids.end()), std::set<std::string>{""});
}

// pdq bench --temperature (and --client-ids) reach an OpenAI-compatible server: the
// target's request carries it (0, greedy, unless asked), and the streamed
// answer is timed and counted.
TEST(OpenAiBenchTargetTest, SendsTheTemperatureAskedFor) {
  httplib::Server server;
  std::mutex mu;
  std::vector<nlohmann::json> bodies;
  server.Get("/v1/models", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(R"({"object": "list", "data": [{"id": "m"}]})", "application/json");
  });
  server.Post("/v1/completions", [&](const httplib::Request& req, httplib::Response& res) {
    {
      std::lock_guard<std::mutex> lock(mu);
      bodies.push_back(nlohmann::json::parse(req.body, nullptr, false));
    }
    res.set_content(
        "data: {\"choices\": [{\"text\": \"a\"}]}\n\n"
        "data: {\"choices\": [{\"text\": \"b\"}]}\n\ndata: [DONE]\n\n",
        "text/event-stream");
  });
  const int port = server.bind_to_any_port("127.0.0.1");
  ASSERT_GT(port, 0);
  std::thread serving([&] { server.listen_after_bind(); });
  for (double temperature : {0.0, 0.7}) {
    std::string used;
    absl::StatusOr<std::unique_ptr<BenchTarget>> target = OpenAiBenchTarget(
        absl::StrCat("http://127.0.0.1:", port, "/v1"), "", "", "", &used, temperature);
    ASSERT_TRUE(target.ok()) << target.status();
    EXPECT_EQ(used, "m");
    const BenchRecord r = (*target)->Run(BenchPrompt{{1, 2}, "hello"}, 2, 10, "req-1",
                                         temperature > 0 ? "bench-client-3" : "");
    EXPECT_TRUE(r.ok) << r.error;
    EXPECT_EQ(r.output_tokens, 2);
    EXPECT_EQ(r.output_text, "ab");
    std::lock_guard<std::mutex> lock(mu);
    ASSERT_FALSE(bodies.empty());
    ASSERT_TRUE(bodies.back().contains("temperature")) << bodies.back().dump();
    EXPECT_DOUBLE_EQ(bodies.back()["temperature"].get<double>(), temperature);
    // A client id goes as OpenAI's "user"; none, no field.
    if (temperature > 0) {
      EXPECT_EQ(bodies.back().value("user", ""), "bench-client-3") << bodies.back().dump();
    } else {
      EXPECT_FALSE(bodies.back().contains("user")) << bodies.back().dump();
    }
  }
  server.stop();
  serving.join();
}

}  // namespace
}  // namespace pdq
