// The bench result's schema (harness/bench_result.h): what the load
// generator writes reads back the same; older files read with what they
// have; a wrong type is an error that names the field.
#include "harness/bench_result.h"

#include <cmath>
#include <fstream>

#include "gtest/gtest.h"

namespace pdq {
namespace {

BenchResult Sample() {
  BenchResult b;
  b.router = "localhost:50051";
  b.target = "pdq";
  b.workload = "chat";
  b.input_tokens = 128;
  b.output_tokens = 64;
  b.ttft_target_ms = 1500;
  b.temperature = 0.7;
  b.started_at = "2026-12-07T22:22:05Z";
  b.finished_at = "2026-12-07T22:24:41Z";
  LevelResult l;
  l.concurrency = 4;
  l.requests_ok = 7;
  l.requests_failed = 1;
  l.ttft_s = DistributionOf({0.1, 0.2, 0.3, 0.4});
  l.goodput_requests_per_s = 1.5;
  WorkerUsage w;
  w.worker_id = "decode-1";
  w.role = "decode";
  w.cpu_cores_busy = 0.9;
  w.decode_bandwidth_utilization = 0.7;
  l.workers.push_back(w);
  LevelFigures pool;
  pool.requests_ok = 3;
  l.pools["a"] = pool;
  b.levels.push_back(l);
  RequestResult r;
  r.concurrency = 4;
  r.ok = true;
  r.ttft_s = 0.25;
  r.gaps_s = {0.01, 0.02};
  b.requests.push_back(r);
  b.router_pools["a"]["requests_ok"] = 3;
  return b;
}

TEST(BenchResultTest, WhatIsWrittenReadsBackTheSame) {
  const std::string path = ::testing::TempDir() + "/bench_result_test.json";
  ASSERT_TRUE(WriteBenchResult(path, Sample()).ok());
  absl::StatusOr<BenchResult> back = ReadBenchResult(path);
  ASSERT_TRUE(back.ok()) << back.status();
  // (As text: unmeasured figures are NaN, written as null, and NaN != NaN.)
  EXPECT_EQ(nlohmann::json(*back).dump(), nlohmann::json(Sample()).dump());
  ASSERT_EQ(back->levels.size(), 1u);
  const LevelResult& l = back->levels[0];
  EXPECT_EQ(l.concurrency, 4);
  EXPECT_EQ(l.requests_failed, 1);
  EXPECT_DOUBLE_EQ(l.ttft_s.p50, 0.25);  // between the 2nd and 3rd of four
  EXPECT_DOUBLE_EQ(l.ttft_s.mean, 0.25);
  ASSERT_EQ(l.workers.size(), 1u);
  EXPECT_DOUBLE_EQ(l.workers[0].decode_bandwidth_utilization, 0.7);
  // A utilization the worker did not report stays absent, not 0.
  EXPECT_TRUE(std::isnan(l.workers[0].prefill_compute_utilization));
  EXPECT_EQ(l.pools.at("a").requests_ok, 3);
  EXPECT_EQ(back->requests[0].gaps_s, (std::vector<double>{0.01, 0.02}));
  EXPECT_DOUBLE_EQ(back->router_pools.at("a").at("requests_ok"), 3);
  EXPECT_DOUBLE_EQ(back->temperature, 0.7);
  EXPECT_EQ(back->started_at, "2026-12-07T22:22:05Z");
  EXPECT_EQ(back->finished_at, "2026-12-07T22:24:41Z");
  EXPECT_EQ(BestLevel(*back), &back->levels[0]);
  EXPECT_EQ(LevelAt(*back, 8), nullptr);
}

TEST(BenchResultTest, AnOlderFileReadsWithWhatItHas) {
  const std::string path = ::testing::TempDir() + "/bench_result_old.json";
  std::ofstream(path) << R"({"levels": [{"concurrency": 2, "ttft_s": {"p50": 0.5}}]})";
  absl::StatusOr<BenchResult> r = ReadBenchResult(path);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->levels.size(), 1u);
  EXPECT_DOUBLE_EQ(r->levels[0].ttft_s.p50, 0.5);
  EXPECT_TRUE(std::isnan(r->levels[0].ttft_s.p90));
  EXPECT_TRUE(std::isnan(r->levels[0].goodput_requests_per_s));
  EXPECT_TRUE(r->levels[0].workers.empty());
  EXPECT_FALSE(r->conversation.has_value());
  EXPECT_TRUE(r->started_at.empty());
}

// A sweep of one figure (output tokens/s unless named) by concurrency, in
// the order given.
BenchResult Sweep(std::initializer_list<std::pair<int, double>> levels,
                  double LevelResult::*figure = &LevelResult::output_tokens_per_s) {
  BenchResult b;
  for (const auto& [c, value] : levels) {
    LevelResult l;
    l.concurrency = c;
    l.*figure = value;
    b.levels.push_back(l);
  }
  return b;
}

TEST(BenchResultTest, SaturationIsTheLowestLevelNearTheMostAndAFallShows) {
  // Rises to 8, gains under 5% at 16: saturated at 8.
  std::optional<Saturation> s = FindSaturation(Sweep({{1, 50}, {4, 150}, {8, 200}, {16, 205}}));
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->at->concurrency, 8);
  EXPECT_EQ(s->top->concurrency, 16);
  EXPECT_EQ(s->below_top->concurrency, 8);
  EXPECT_DOUBLE_EQ(s->most, 205);
  // Peaks at 4 and falls past it: the top level is well under the most.
  s = FindSaturation(Sweep({{16, 120}, {1, 50}, {8, 160}, {4, 170}}));  // any order
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->at->concurrency, 4);
  EXPECT_EQ(s->top->concurrency, 16);
  EXPECT_LT(s->top->output_tokens_per_s, 0.95 * s->most);
  // Still rising at the top: the sweep has not shown the point.
  s = FindSaturation(Sweep({{1, 50}, {4, 150}, {8, 220}}));
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->at, s->top);
  EXPECT_EQ(s->refused, nullptr);
  // Still rising, but admission control refused requests from 8 on: that
  // is the deployment's bound.
  BenchResult shed = Sweep({{1, 50}, {4, 150}, {8, 220}, {16, 240}});
  shed.levels[2].requests_refused = 3;
  shed.levels[3].requests_refused = 20;
  s = FindSaturation(shed);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->at, s->top);
  ASSERT_NE(s->refused, nullptr);
  EXPECT_EQ(s->refused->concurrency, 8);
  // One level, or no tokens: nothing to say.
  EXPECT_FALSE(FindSaturation(Sweep({{4, 150}})).has_value());
  EXPECT_FALSE(FindSaturation(Sweep({{1, 0}, {4, 0}})).has_value());
}

TEST(BenchResultTest, MostGoodputIsTheLowestLevelOfTheMostAndNoneWithoutAny) {
  // Goodput by concurrency, in the order given (NaN: not measured).
  auto sweep = [](std::initializer_list<std::pair<int, double>> levels) {
    return Sweep(levels, &LevelResult::goodput_requests_per_s);
  };
  // Peaks at 8, collapses at 16 and 32 while tokens/s may still rise.
  BenchResult b = sweep({{32, 0.01}, {1, 0.2}, {8, 0.36}, {16, 0.01}, {4, 0.33}});
  ASSERT_NE(MostGoodput(b), nullptr);
  EXPECT_EQ(MostGoodput(b)->concurrency, 8);
  // Equal at 4 and 16: the lower level.
  b = sweep({{16, 0.5}, {4, 0.5}, {1, 0.2}});
  ASSERT_NE(MostGoodput(b), nullptr);
  EXPECT_EQ(MostGoodput(b)->concurrency, 4);
  // None met the targets, or none measured.
  EXPECT_EQ(MostGoodput(sweep({{1, 0}, {4, 0}})), nullptr);
  EXPECT_EQ(MostGoodput(sweep({{1, NAN}})), nullptr);
}

TEST(BenchResultTest, AWrongTypeOrAMissingFileIsAnErrorNamingIt) {
  const std::string path = ::testing::TempDir() + "/bench_result_bad.json";
  std::ofstream(path) << R"({"levels": [{"concurrency": 2, "ttft_s": {"p50": "fast"}}]})";
  absl::StatusOr<BenchResult> r = ReadBenchResult(path);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("levels.ttft_s.p50"), std::string::npos) << r.status();
  std::ofstream(path) << "[1, 2]";
  EXPECT_EQ(ReadBenchResult(path).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadBenchResult(path + ".missing").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace pdq
