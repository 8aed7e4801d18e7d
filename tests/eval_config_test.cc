// A `pdq eval` config read into types (harness/eval_config.h): defaults for
// what is left out, the committed configs read whole, and every mistake an
// error that names where it is.
#include "harness/eval_config.h"

#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>

#include "gtest/gtest.h"

namespace pdq {
namespace {

using json = nlohmann::json;

json Minimal() {
  return json::parse(R"({"deployments": [{"name": "mono", "prefill_precision": "fp16",
    "decode_precision": "fp16", "workers": [{"role": "both"}]}]})");
}

TEST(EvalConfigTest, WhatIsLeftOutTakesItsDefault) {
  absl::StatusOr<EvalConfig> c = ParseEvalConfig(Minimal());
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->deployments.size(), 1u);
  EXPECT_EQ(c->deployments[0].name, "mono");
  EXPECT_FALSE(c->deployments[0].baseline);
  EXPECT_TRUE(c->model.empty());
  EXPECT_EQ(c->kv_transport, "tcp");
  EXPECT_GT(c->cores, 0);
  EXPECT_TRUE(c->workloads.empty());
  EXPECT_FALSE(c->stability.has_value());
  EXPECT_FALSE(c->lowbit.has_value());
  // The accuracy texts default to the prompts' text.
  EXPECT_EQ(c->accuracy.texts, std::vector<std::string>{c->text});
  EXPECT_EQ(c->accuracy.ctx, 512);
  EXPECT_EQ(c->Deployment("mono"), &c->deployments[0]);
  EXPECT_EQ(c->Deployment("other"), nullptr);
}

TEST(EvalConfigTest, TheCommittedConfigsReadWhole) {
  for (const char* name : {"deploy/eval/cpu-2core.json", "deploy/eval/smoke.json"}) {
    absl::StatusOr<EvalConfig> c = ReadEvalConfig(name);
    ASSERT_TRUE(c.ok()) << name << ": " << c.status();
    EXPECT_FALSE(c->workloads.empty()) << name;
    ASSERT_TRUE(c->stability.has_value()) << name;
    EXPECT_NE(c->Deployment(c->stability->deployment), nullptr) << name;
    ASSERT_TRUE(c->aim.has_value()) << name;
    EXPECT_EQ(c->aim->goodput_ratio.at("chat"), 2.0) << name;
  }
  absl::StatusOr<EvalConfig> c = ReadEvalConfig("deploy/eval/cpu-2core.json");
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(c->conversations.has_value());
  EXPECT_TRUE(c->conversations->Includes("mono-fp16"));
  EXPECT_FALSE(c->accuracy.code.empty());
  ASSERT_TRUE(c->lowbit.has_value());
  ASSERT_TRUE(c->cluster.has_value());
  EXPECT_EQ(c->cluster->nodes, (std::vector<int>{8, 32, 128}));
  EXPECT_EQ(c->cluster->workloads.size(), c->workloads.size());  // every workload, by default
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// `pdq eval --config OUT/config.json --out OUT` used to rewrite the committed
// file with one-space indents; the copy beside the results is now the text
// that was read.
TEST(EvalConfigTest, TheCopyBesideTheResultsKeepsTheFilesLayout) {
  const std::string dir = ::testing::TempDir() + "/eval_config_copy";
  std::filesystem::create_directories(dir);
  const std::string text =
      "{\n   \"deployments\": [ {\"name\": \"mono\", \"prefill_precision\": \"fp16\",\n"
      "      \"decode_precision\": \"fp16\", \"workers\": [{\"role\": \"both\"}]} ],\n"
      "   \"notes\": [\"kept as written\"]\n}\n";
  const std::string in = dir + "/config.json";
  std::ofstream(in, std::ios::binary) << text;
  absl::StatusOr<EvalConfig> c = ReadEvalConfig(in);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(WriteEvalConfigCopy(*c, in).ok());  // onto itself: unchanged
  EXPECT_EQ(Slurp(in), text);
  const std::string other = dir + "/copy.json";
  std::ofstream(other) << "stale";
  ASSERT_TRUE(WriteEvalConfigCopy(*c, other).ok());
  EXPECT_EQ(Slurp(other), text);
  // Parsed from JSON in memory: no text of its own, so two-space indents.
  absl::StatusOr<EvalConfig> m = ParseEvalConfig(Minimal());
  ASSERT_TRUE(m.ok());
  ASSERT_TRUE(WriteEvalConfigCopy(*m, other).ok());
  EXPECT_EQ(Slurp(other), Minimal().dump(2) + "\n");
  EXPECT_FALSE(WriteEvalConfigCopy(*m, dir + "/no/such/dir/config.json").ok());
}

TEST(EvalConfigTest, EachMistakeIsAnErrorNamingWhereItIs) {
  struct Case {
    std::function<void(json&)> mutate;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](json& c) { c.erase("deployments"); }, "non-empty 'deployments' array"},
      {[](json& c) { c["deployments"].push_back(c["deployments"][0]); }, "must be unique"},
      {[](json& c) { c["deployments"][0].erase("decode_precision"); }, "needs 'decode_precision'"},
      {[](json& c) { c["deployments"][0]["split"] = "a=50,b=50"; }, "pool 'a', which no worker"},
      {[](json& c) {
         c["workloads"] = {{"poetry", {{"concurrency", {1}}}}};
       },
       "workload 'poetry' is not chat"},
      {[](json& c) {
         c["workloads"] = {{"chat", {{"concurrency", {0}}}}};
       },
       "integers >= 1"},
      {[](json& c) {
         c["workloads"] = {{"chat", {{"concurrency", {1}}, {"warmup", "one"}}}};
       },
       "workload chat: warmup has the wrong type"},
      {[](json& c) {
         c["workloads"] = {{"chat", {{"concurrency", {1}}, {"input_tokens", 0}}}};
       },
       "input_tokens must be an integer >= 1"},
      {[](json& c) {
         c["workloads"] = {{"chat", {{"concurrency", {1, 16}}, {"until_flat", 24}}}};
       },
       "until_flat (24) doubles the top concurrency level"},
      {[](json& c) {
         c["workloads"] = {{"chat", {{"concurrency", {16, 1}}, {"until_flat", 64}}}};
       },
       "the levels must end at their highest"},
      {[](json& c) {
         c["lowbit"] = {{"threads", {1.5}}};
       },
       "'lowbit' must be an object"},
      {[](json& c) {
         c["stability"] = {{"deployment", "nowhere"}};
       },
       "'nowhere' is not one"},
      {[](json& c) {
         c["stability"] = {{"deployment", "mono"}, {"cycles", "ten"}};
       },
       "stability.cycles has the wrong type"},
      {[](json& c) {
         c["lowbit"] = {{"threads", {0}}};
       },
       "'lowbit' must be an object"},
      {[](json& c) { c["accuracy"] = json::array(); }, "'accuracy' must be an object"},
      {[](json& c) {
         c["cluster"] = {{"nodes", {1, 8}}};
       },
       "cluster.nodes: 1 is not in 2..4096"},
      {[](json& c) {
         c["cluster"] = {{"pairs", {"w8a8-w4a16"}}};
       },
       "cluster.pairs: 'w8a8-w4a16' is not PREFILL/DECODE"},
      {[](json& c) {
         c["cluster"] = {{"pairs", {"w8a8/w4a61"}}};
       },
       "cluster.pairs: 'w4a61' is not a precision"},
      {[](json& c) { c["deployments"][0]["prefill_precision"] = "int8"; },
       ": 'int8' is not a precision (fp16, w8a8 or w4a16)"},
      {[](json& c) {
         c["cluster"] = {{"workloads", {"poetry"}}};
       },
       "cluster.workloads: 'poetry' is not one of the workloads"},
      {[](json& c) {
         c["cluster"] = {{"seeds", 0}};
       },
       "seeds at least 1"},
      {[](json& c) {
         c["conversation_bench"] = {{"deployments", {"ghost"}}};
       },
       "'ghost'"},
  };
  for (const Case& k : cases) {
    json c = Minimal();
    k.mutate(c);
    absl::StatusOr<EvalConfig> r = ParseEvalConfig(c);
    ASSERT_FALSE(r.ok()) << k.message;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(k.message), std::string::npos) << r.status();
  }
  EXPECT_EQ(ReadEvalConfig("/nonexistent.json").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace pdq
