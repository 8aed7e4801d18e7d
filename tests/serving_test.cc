// The served system, as separate processes on this machine: pdq-router,
// pdq-prefill and pdq-decode started on port 0, talked to over gRPC as a
// client would. Greedy answers through router + prefill + decode match the
// monolithic worker token for token over every KV transport; concurrent
// streams all complete; bad input is refused with a message; cancelled
// requests return every KV block. (Failures of processes and deadlines:
// serving_faults_test.cc.)
#include <atomic>
#include <cmath>
#include <map>
#include <tuple>

#include "common/arrivals.h"
#include "kvtransfer/transport.h"
#include "nlohmann/json.hpp"
#include "policy/traffic_split.h"
#include "serving_cluster.h"

namespace pdq::testing {
namespace {

class ServingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(kModel)) GTEST_SKIP() << kModel << " not found (make model)";
  }
};

// The disaggregated deployment answers exactly as the monolithic one, over
// every KV transport; what the processes count in /metrics agrees. Every
// worker also gets `worker_args`.
void ExpectSameAnswers(const std::string& prefill_precision, const std::string& decode_precision,
                       const std::vector<std::string>& worker_args = {}) {
  Cluster c;
  const Proc mono = c.Router();
  ASSERT_TRUE(mono.ok());
  std::vector<std::string> both = {"--prefill-precision", prefill_precision};
  both.insert(both.end(), worker_args.begin(), worker_args.end());
  ASSERT_TRUE(c.Worker(mono.address, "both", decode_precision, both).ok());
  auto b = Client(mono.address);
  ASSERT_TRUE(WaitForWorkers(*b, 1));
  // The prompts greedy, then one sampled: the prefill worker draws the
  // first token and the decode worker continues the same random stream.
  std::vector<v1::GenerateRequest> requests;
  for (const std::string& p : kPrompts) requests.push_back(Chat(p, 24));
  requests.push_back(Chat(kPrompts[0], 24));
  requests.back().mutable_sampling()->set_temperature(0.9f);
  requests.back().mutable_sampling()->set_top_p(0.95f);
  requests.back().mutable_sampling()->set_seed(42);
  std::vector<Answer> want;
  for (const v1::GenerateRequest& r : requests) {
    want.push_back(Generate(*b, r));
    ASSERT_TRUE(want.back().status.ok()) << want.back().status.error_message();
    EXPECT_FALSE(want.back().tokens.empty());
  }
  EXPECT_NE(want.back().tokens, want[0].tokens) << "the sampled request answered greedily";
  for (const std::string& transport : kvtransfer::TransportNames()) {
    SCOPED_TRACE("KV over " + transport);
    // Every request through a prefill worker, even a repeated prompt the
    // decode worker holds (the short-suffix path has tests of its own).
    const Proc split = c.Router({"--local-prefill-tokens", "0"});
    ASSERT_TRUE(split.ok());
    std::vector<std::string> args = {"--kv-transport", transport};
    args.insert(args.end(), worker_args.begin(), worker_args.end());
    const Proc prefill = c.Worker(split.address, "prefill", prefill_precision, args);
    const Proc decode = c.Worker(split.address, "decode", decode_precision, args);
    ASSERT_TRUE(prefill.ok() && decode.ok());
    auto a = Client(split.address);
    ASSERT_TRUE(WaitForWorkers(*a, 2));
    int64_t output_tokens = 0;
    for (size_t i = 0; i < requests.size(); ++i) {
      const Answer x = Generate(*a, requests[i]);
      const Answer& y = want[i];
      ASSERT_TRUE(x.status.ok()) << x.status.error_message();
      EXPECT_EQ(x.tokens, y.tokens)
          << requests[i].ShortDebugString() << "\nsplit: " << x.text << "\nmonolithic: " << y.text;
      EXPECT_EQ(x.text, y.text);
      EXPECT_EQ(x.summary.finish_reason(), y.summary.finish_reason());
      EXPECT_EQ(x.summary.output_tokens(), (int)x.tokens.size());
      EXPECT_GT(x.summary.ttft_seconds(), 0.0);
      output_tokens += x.summary.output_tokens();
    }
    const int n = (int)requests.size();
    EXPECT_EQ(Metric(split.metrics, "pdq_requests_total{code=\"OK\"}"), n);
    EXPECT_EQ(Metric(split.metrics, "pdq_output_tokens_total"), output_tokens);
    EXPECT_EQ(Metric(split.metrics, "pdq_ttft_seconds_count"), n);
    EXPECT_EQ(Metric(split.metrics, "pdq_workers_live{role=\"decode\"}"), 1);
    // The workers count a request, and free its blocks, once it is done on
    // their side: a little after the client has its answer.
    EXPECT_EQ(MetricSoon(prefill.metrics, "pdq_requests_total{code=\"OK\"}", n), n);
    EXPECT_EQ(MetricSoon(decode.metrics, "pdq_requests_total{code=\"OK\"}", n), n);
    EXPECT_EQ(MetricSoon(prefill.metrics, "pdq_kv_transfer_seconds_count", n), n);
    const double sent = Metric(prefill.metrics, "pdq_kv_bytes_sent_total");
    EXPECT_GT(sent, 0);
    EXPECT_EQ(Metric(decode.metrics, "pdq_kv_bytes_received_total"), sent);
    EXPECT_EQ(MetricSoon(decode.metrics, "pdq_generated_tokens_total", output_tokens),
              output_tokens);
    ExpectAllBlocksFree(decode.address, "the decode worker");
    EXPECT_GT(Metric(decode.metrics, "process_resident_memory_bytes"), 0);
  }
}

TEST_F(ServingTest, Fp16PrefillAndDecodeMatchTheMonolithicWorker) {
  ExpectSameAnswers("fp16", "fp16");
}

TEST_F(ServingTest, W8a8PrefillAndW4a16DecodeMatchOneProcessDoingBoth) {
  ExpectSameAnswers("w8a8", "w4a16");
}

// bf16 caches (--kv-dtype bf16 on every worker): their KV crosses every
// transport as it lies, and the decode worker reads it as the one process
// reads its own.
TEST_F(ServingTest, OnBf16CachesW8a8PrefillAndW4a16DecodeMatchOneProcessDoingBoth) {
  ExpectSameAnswers("w8a8", "w4a16", {"--kv-dtype", "bf16"});
}

// With --batch-invariant, W4A16 decode steps of up to 64 rows give each row
// its logits alone (forward_test, kernels_test), so every one of 64
// concurrent streams gets exactly its answer alone. (By default steps of 16
// rows or more take the bf16 tiles where the CPU has AMX-BF16, and answers
// may then move with the batch.)
TEST_F(ServingTest, SixtyFourConcurrentStreamsAllComplete) {
  Cluster c;
  const Proc router = c.Router();
  ASSERT_TRUE(router.ok());
  ASSERT_TRUE(c.Worker(router.address, "prefill", "w8a8").ok());
  ASSERT_TRUE(c.Worker(router.address, "decode", "w4a16", {"--batch-invariant"}).ok());
  auto stub = Client(router.address);
  ASSERT_TRUE(WaitForWorkers(*stub, 2));
  std::vector<Answer> alone;
  for (const std::string& p : kPrompts) {
    v1::GenerateRequest r = Chat(p, 16);
    r.set_ignore_eos(true);
    alone.push_back(Generate(*stub, r));
    ASSERT_TRUE(alone.back().status.ok()) << alone.back().status.error_message();
  }
  std::vector<Answer> got(64);
  std::vector<std::thread> threads;
  for (int i = 0; i < 64; ++i) {
    threads.emplace_back([&, i] {
      v1::GenerateRequest r = Chat(kPrompts[i % kPrompts.size()], 16);
      r.set_ignore_eos(true);
      r.set_request_id("concurrent-" + std::to_string(i));
      got[i] = Generate(*stub, r, 300);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < 64; ++i) {
    ASSERT_TRUE(got[i].status.ok()) << i << ": " << got[i].status.error_message();
    EXPECT_EQ(got[i].tokens, alone[i % kPrompts.size()].tokens) << "stream " << i;
    EXPECT_EQ(got[i].summary.request_id(), "concurrent-" + std::to_string(i));
  }
}

TEST_F(ServingTest, CancelledRequestsReturnEveryKvBlock) {
  Cluster c;
  const Split split = StartSplit(c, "fp16", "fp16");
  ASSERT_TRUE(split.ok());
  v1::Pdq::Stub* const stub = split.stub.get();
  const std::string long_text = LongText(450);
  // Cancel at many points: during the prefill, around the KV transfer and
  // during the decode.
  for (int i = 0; i < 24; ++i) {
    grpc::ClientContext ctx;
    v1::GenerateRequest r = Chat(i % 2 ? long_text : kPrompts[0], 64);
    r.set_ignore_eos(true);
    auto reader = stub->Generate(&ctx, r);
    v1::GenerateResponse m;
    if (i % 4 == 3) {
      reader->Read(&m);  // wait for the first token: cancel during decode
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(500 * i));
    }
    ctx.TryCancel();
    while (reader->Read(&m)) {
    }
    const grpc::Status s = reader->Finish();
    EXPECT_TRUE(s.error_code() == grpc::StatusCode::CANCELLED || s.ok()) << s.error_message();
  }
  ExpectRecovered(split);
}

// pdq bench against a real deployment: exact prompt and output lengths,
// every request recorded with each worker's resources, an open loop at a
// rate, and the alternating pattern's recovery checks passing; then pdq
// status.
TEST_F(ServingTest, PdqBenchAndPdqStatusAgainstARealDeployment) {
  Cluster c;
  const Split split = StartSplit(c);
  ASSERT_TRUE(split.ok());
  char tmpl[] = "/tmp/pdq-bench-test-XXXXXX";
  const std::string dir = mkdtemp(tmpl), json = dir + "/bench.json", text = dir + "/text.txt";
  {
    std::ofstream t(text);
    for (int i = 0; i < 200; ++i) t << "Paris is the capital of France, and caf\u00e9 is French. ";
  }
  const std::string cmd = std::string(PDQ_BIN_DIR) + "/pdq bench --router " + split.router.address +
                          " --concurrency 1,3 --requests 6 --warmup 1 --input-tokens 40"
                          " --output-tokens 5 --text " +
                          text + " --json " + json + " >" + dir + "/out.txt 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream in(json);
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(j.is_discarded()) << json;
  ASSERT_EQ(j["levels"].size(), 2u);
  EXPECT_EQ(j["levels"][1]["concurrency"], 3);
  // 2 levels x 6 counted requests, each exactly 40 in and 5 out.
  ASSERT_EQ(j["requests"].size(), 12u);
  for (const nlohmann::json& r : j["requests"]) {
    EXPECT_TRUE(r["ok"].get<bool>()) << r.dump();
    EXPECT_EQ(r["prompt_tokens"], 40);
    EXPECT_EQ(r["output_tokens"], 5);
    EXPECT_EQ(r["gaps_s"].size(), 4u);
    EXPECT_GT(r["ttft_s"].get<double>(), 0.0);
  }
  for (const nlohmann::json& l : j["levels"]) {
    EXPECT_EQ(l["requests_ok"], 6);
    EXPECT_GT(l["output_tokens_per_s"].get<double>(), 0.0);
    // Each worker's resources over the level, from its /metrics.
    ASSERT_EQ(l["workers"].size(), 2u) << l.dump();
    for (const nlohmann::json& w : l["workers"]) {
      EXPECT_GT(w["peak_resident_bytes"].get<double>(), 1e6) << w.dump();
      EXPECT_GT(w["cpu_cores_busy"].get<double>(), 0.0) << w.dump();
      const char* util =
          w["role"] == "prefill" ? "prefill_compute_utilization" : "decode_bandwidth_utilization";
      ASSERT_TRUE(w.contains(util)) << w.dump();
      EXPECT_GT(w[util].get<double>(), 0.0);
      EXPECT_LT(w[util].get<double>(), 2.0);  // a fraction of a measured peak
    }
  }

  // An open loop at a Poisson rate, then the alternating pattern's checks.
  const std::string base = std::string(PDQ_BIN_DIR) + "/pdq bench --router " +
                           split.router.address + " --input-tokens 24 --output-tokens 4 --text " +
                           text;
  const std::string rate =
      base + " --rate 4 --requests 6 --warmup 0 --json " + json + " >" + dir + "/rate.txt 2>&1";
  ASSERT_EQ(std::system(rate.c_str()), 0) << rate;
  std::ifstream rate_in(json);
  const nlohmann::json r = nlohmann::json::parse(rate_in, nullptr, false);
  ASSERT_FALSE(r.is_discarded());
  EXPECT_EQ(r["requests"].size(), 6u);
  EXPECT_EQ(r["levels"][0]["rate"], 4.0);
  const std::string alternate =
      base + " --pattern alternate --cycles 2 --high 3 --low 1 >" + dir + "/alternate.txt 2>&1";
  EXPECT_EQ(std::system(alternate.c_str()), 0) << alternate;
  std::ifstream alt_in(dir + "/alternate.txt");
  std::stringstream alt;
  alt << alt_in.rdbuf();
  EXPECT_NE(alt.str().find("cycle 2: every KV block back"), std::string::npos) << alt.str();
  EXPECT_NE(alt.str().find("\nPASS\n"), std::string::npos) << alt.str();

  // pdq status lists both workers, healthy, with their KV blocks.
  const std::string status = std::string(PDQ_BIN_DIR) + "/pdq status --router " +
                             split.router.address + " >" + dir + "/status.txt 2>&1";
  EXPECT_EQ(std::system(status.c_str()), 0) << status;
  std::ifstream status_in(dir + "/status.txt");
  std::stringstream st;
  st << status_in.rdbuf();
  for (const char* want : {"KV cache fp16, 2 live workers", "prefill  fp16   serving",
                           "decode   fp16   serving", "2048/2048", "MiB weights/KV/ws/RSS"}) {
    EXPECT_NE(st.str().find(want), std::string::npos) << want << " in\n" << st.str();
  }
  std::filesystem::remove_all(dir);
  ExpectRecovered(split);
}

// pdq bench --workload conversation: every session's turns all answer, each
// turn's prompt is the previous one with its answer and a new message (so it
// grows by at least the message), and the report has every turn.
TEST_F(ServingTest, PdqBenchConversationResendsTheGrowingConversation) {
  Cluster c;
  const Split split = StartSplit(c);
  ASSERT_TRUE(split.ok());
  char tmpl[] = "/tmp/pdq-bench-conversation-XXXXXX";
  const std::string dir = mkdtemp(tmpl), json = dir + "/bench.json", text = dir + "/text.txt";
  {
    std::ofstream t(text);
    for (int i = 0; i < 200; ++i) {
      t << "Line " << i << ": Paris is the capital of France, and caf\u00e9 is French. ";
    }
  }
  const std::string cmd = std::string(PDQ_BIN_DIR) + "/pdq bench --router " + split.router.address +
                          " --workload conversation --sessions 2 --turns 3 --first-tokens 40"
                          " --turn-tokens 16 --output-tokens 4 --timeout 120 --text " +
                          text + " --json " + json + " >" + dir + "/out.txt 2>&1";
  const int rc = std::system(cmd.c_str());
  std::ifstream out_in(dir + "/out.txt");
  std::stringstream out;
  out << out_in.rdbuf();
  ASSERT_EQ(rc, 0) << cmd << "\n" << out.str();
  EXPECT_NE(out.str().find("2/2 conversations of 3 turns"), std::string::npos) << out.str();
  std::ifstream in(json);
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(j.is_discarded()) << json;
  EXPECT_EQ(j["workload"], "conversation");
  ASSERT_EQ(j["requests"].size(), 6u) << j.dump();
  std::map<int, std::vector<nlohmann::json>> by_session;
  for (const nlohmann::json& r : j["requests"]) {
    EXPECT_TRUE(r["ok"].get<bool>()) << r.dump();
    EXPECT_EQ(r["output_tokens"], 4) << r.dump();
    EXPECT_FALSE(r["output_text"].get<std::string>().empty()) << r.dump();
    EXPECT_GT(r["ttft_s"].get<double>(), 0.0);
    EXPECT_GE(r["cached_tokens"].get<int>(), 0);  // no prefix cache needed
    EXPECT_LE(r["cached_tokens"].get<int>(), r["prompt_tokens"].get<int>());
    by_session[r["session"].get<int>()].push_back(r);
  }
  ASSERT_EQ(by_session.size(), 2u);
  for (const auto& [session, turns] : by_session) {
    ASSERT_EQ(turns.size(), 3u);
    for (int k = 0; k < 3; ++k) EXPECT_EQ(turns[k]["turn"], k + 1) << turns[k].dump();
    // 40 tokens of text, and the BOS where the model's tokenizer adds one.
    EXPECT_GE(turns[0]["prompt_tokens"].get<int>(), 40);
    EXPECT_LE(turns[0]["prompt_tokens"].get<int>(), 42);
    for (int k = 1; k < 3; ++k) {
      // The previous prompt, its 4-token answer and a 16-token message,
      // less a few where tokens merge across the joins.
      EXPECT_GT(turns[k]["prompt_tokens"].get<int>(), turns[k - 1]["prompt_tokens"].get<int>() + 12)
          << "session " << session << " turn " << k + 1;
    }
  }
  const nlohmann::json& summary = j["conversation"];
  EXPECT_EQ(summary["conversations_ok"], 2);
  EXPECT_GT(summary["output_tokens_per_s"].get<double>(), 0.0);
  ASSERT_EQ(summary["per_turn"].size(), 3u);
  for (const nlohmann::json& t : summary["per_turn"]) {
    EXPECT_EQ(t["requests_ok"], 2) << t.dump();
    EXPECT_GT(t["ttft_s"]["p50"].get<double>(), 0.0);
  }
  // Run again on the same server: with --prompt-seed 0 (the first run's
  // messages) the first turns are found in the prefix cache; with another
  // seed the messages start elsewhere in the text, and they are not.
  auto first_turns_cached = [&](int seed) {
    const std::string again = std::string(PDQ_BIN_DIR) + "/pdq bench --router " +
                              split.router.address +
                              " --workload conversation --sessions 2 --turns 3 --first-tokens 40"
                              " --turn-tokens 16 --output-tokens 4 --warmup 0 --timeout 120"
                              " --text " +
                              text + " --prompt-seed " + std::to_string(seed) + " --json " + json +
                              " >" + dir + "/out.txt 2>&1";
    EXPECT_EQ(std::system(again.c_str()), 0) << again;
    std::ifstream in(json);
    const nlohmann::json r = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    int cached = 0;
    if (r.is_discarded()) return -1;
    for (const nlohmann::json& q : r["requests"]) {
      if (q["turn"] == 1) cached += q["cached_tokens"].get<int>();
    }
    EXPECT_EQ(r.value("prompt_seed", 0), seed) << r.dump();
    return cached;
  };
  const int same = first_turns_cached(0), other = first_turns_cached(1);
  EXPECT_GE(same, 2 * 32) << "two 40-token first turns, two full 16-token blocks each";
  EXPECT_LT(other, same);
  EXPECT_GE(other, 0);
  std::filesystem::remove_all(dir);
  ExpectRecovered(split);
}

TEST_F(ServingTest, BadInputIsRefusedWithAMessageAndTheNextRequestSucceeds) {
  Cluster c;
  const Split split = StartSplit(c, "fp16", "fp16");
  ASSERT_TRUE(split.ok());
  v1::Pdq::Stub* const stub = split.stub.get();
  struct Case {
    std::string what;
    v1::GenerateRequest req;
    grpc::StatusCode code;
    std::string message;
  };
  std::vector<Case> cases;
  v1::GenerateRequest r = Chat("hi", 8);
  r.set_text("");
  cases.push_back({"empty prompt", r, grpc::StatusCode::INVALID_ARGUMENT, "empty"});
  r = Chat("hi", 8);
  r.clear_chat();
  cases.push_back({"no prompt", r, grpc::StatusCode::INVALID_ARGUMENT, "prompt is required"});
  r = Chat("hi", 0);
  cases.push_back({"max_tokens 0", r, grpc::StatusCode::INVALID_ARGUMENT, "max_tokens"});
  r = Chat("hi", 1 << 30);
  cases.push_back({"max_tokens beyond the context", r, grpc::StatusCode::INVALID_ARGUMENT,
                   "beyond the context"});
  r = Chat("hi", 8);
  r.mutable_tokens()->add_ids(1);
  r.mutable_tokens()->add_ids(49152);
  cases.push_back(
      {"token outside the vocabulary", r, grpc::StatusCode::INVALID_ARGUMENT, "token id 49152"});
  r = Chat("hi", 8);
  for (int i = 0; i < 9000; ++i) r.mutable_tokens()->add_ids(100);
  cases.push_back({"prompt over the context", r, grpc::StatusCode::INVALID_ARGUMENT, "context"});
  r = Chat("hi", 8);
  r.mutable_chat()->mutable_messages(0)->set_role("wizard");
  cases.push_back({"unknown chat role", r, grpc::StatusCode::INVALID_ARGUMENT, "wizard"});
  r = Chat("hi", 8);
  r.mutable_sampling()->set_top_p(2.0f);
  cases.push_back({"top_p out of range", r, grpc::StatusCode::INVALID_ARGUMENT, "top_p"});
  r = Chat("hi", 8);
  r.set_text(std::string(5 << 20, 'a'));
  cases.push_back({"oversized message", r, grpc::StatusCode::RESOURCE_EXHAUSTED, ""});
  r = Chat("hi", 8);
  r.set_text("caf\xc3 au lait \xff");  // protobuf sends it, logging an error here
  cases.push_back({"invalid UTF-8", r, grpc::StatusCode::INVALID_ARGUMENT, "UTF-8"});
  for (const Case& k : cases) {
    const Answer a = Generate(*stub, k.req);
    EXPECT_EQ(a.status.error_code(), k.code) << k.what << ": " << a.status.error_message();
    EXPECT_NE(a.status.error_message().find(k.message), std::string::npos)
        << k.what << ": " << a.status.error_message();
    const Answer ok = Generate(*stub, Chat(kPrompts[0], 4));
    EXPECT_TRUE(ok.status.ok()) << "after " << k.what << ": " << ok.status.error_message();
  }
  // A worker announcing a role or precision this router does not know.
  auto registry = v1::Registry::NewStub(
      grpc::CreateChannel(split.router.address, grpc::InsecureChannelCredentials()));
  for (const auto& [role, precision, message] :
       {std::tuple{99, (int)v1::PRECISION_FP16, "unknown role 99"},
        std::tuple{(int)v1::ROLE_DECODE, 42, "unknown precision 42"}}) {
    v1::RegisterRequest req;
    v1::WorkerInfo& w = *req.mutable_worker();
    w.set_worker_id("from-the-future");
    w.set_role(static_cast<v1::Role>(role));
    w.set_precision(static_cast<v1::Precision>(precision));
    w.set_address("127.0.0.1:1");
    w.set_kv_address("127.0.0.1:2");
    w.set_vocab_size(49152);
    w.set_max_context(8192);
    grpc::ClientContext ctx;
    v1::RegisterResponse resp;
    const grpc::Status st = registry->Register(&ctx, req, &resp);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
    EXPECT_NE(st.error_message().find(message), std::string::npos) << st.error_message();
  }
  ExpectRecovered(split);
}

// A small worker's flags, in `pool`.
std::vector<std::string> InPool(const char* pool) {
  return {"--kv-tokens", "4096", "--skip-peaks", "--pool", pool};
}

// An A/B rollout: 90% to the pool "control", 10% to "treatment", sticky per
// client id; every request says which pool served it, the router's and the
// workers' metrics count it under that pool, and when an arm loses its last
// worker the other serves its requests (counted as fallbacks).
TEST_F(ServingTest, AnAbSplitSendsEachPoolItsShareAndLabelsTheMetrics) {
  Cluster c;
  const Proc router = c.Router({"--split", "control=90,treatment=10", "--split-sticky"});
  ASSERT_TRUE(router.ok());
  const Proc control = c.Worker(router.address, "both", "fp16", InPool("control"));
  const Proc treatment = c.Worker(router.address, "both", "fp16", InPool("treatment"));
  ASSERT_TRUE(control.ok() && treatment.ok());
  auto stub = Client(router.address);
  ASSERT_TRUE(WaitForWorkers(*stub, 2));

  // 1000 requests without a client id: each pool's share within five
  // standard deviations of its weight (sd 0.0095 at 10%).
  constexpr int kRequests = 1000;
  std::atomic<int> next{0}, failed{0}, to_control{0}, to_treatment{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      auto s = Client(router.address);
      while (next++ < kRequests) {
        v1::GenerateRequest req;
        req.set_text("Hello");
        req.set_max_tokens(1);
        const Answer a = Generate(*s, req, 60);
        if (!a.status.ok()) {
          ++failed;
        } else if (a.summary.pool() == "control") {
          ++to_control;
        } else if (a.summary.pool() == "treatment") {
          ++to_treatment;
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failed.load(), 0);
  EXPECT_EQ(to_control + to_treatment, kRequests);
  EXPECT_NEAR(to_treatment / double(kRequests), 0.10, 5 * std::sqrt(0.1 * 0.9 / kRequests));
  EXPECT_EQ(Metric(router.metrics, "pdq_requests_total{code=\"OK\",pool=\"treatment\"}"),
            to_treatment.load());
  EXPECT_EQ(Metric(router.metrics, "pdq_requests_total{code=\"OK\",pool=\"control\"}"),
            to_control.load());
  EXPECT_EQ(Metric(treatment.metrics, "pdq_requests_total{code=\"OK\",pool=\"treatment\"}"),
            to_treatment.load());
  EXPECT_EQ(Metric(router.metrics, "pdq_ttft_seconds_count{pool=\"treatment\"}"),
            to_treatment.load());

  // Sticky: a client id keeps its pool, the one the simulator's clients of
  // pdq bench --client-ids land in (pdq sim --split-sticky --client-ids).
  // Find one that lands in treatment.
  const policy::TrafficSplit split = *policy::TrafficSplit::Parse("control=90,treatment=10");
  std::string treated;
  for (int id = 0; id < 500 && treated.empty(); ++id) {
    v1::GenerateRequest req;
    req.set_text("Hello");
    req.set_max_tokens(1);
    req.set_client_id(id % 2 == 0 ? BenchClientId(id / 2) : "user-" + std::to_string(id));
    std::string first;
    for (int k = 0; k < 3; ++k) {
      const Answer a = Generate(*stub, req);
      ASSERT_TRUE(a.status.ok()) << a.status.error_message();
      if (k == 0) first = a.summary.pool();
      EXPECT_EQ(a.summary.pool(), first) << req.client_id();
    }
    EXPECT_EQ(first, split.arms()[split.IndexOfClient(req.client_id())].pool) << req.client_id();
    if (first == "treatment") treated = req.client_id();
  }
  ASSERT_FALSE(treated.empty()) << "no client id of 500 landed in a 10% pool";

  // The treatment arm loses its worker: its clients are served by control.
  c.Kill(treatment);
  ASSERT_TRUE(WaitForWorkers(*stub, 1));
  v1::GenerateRequest req;
  req.set_text("Hello");
  req.set_max_tokens(1);
  req.set_client_id(treated);
  const Answer a = Generate(*stub, req);
  ASSERT_TRUE(a.status.ok()) << a.status.error_message();
  EXPECT_EQ(a.summary.pool(), "control");
  EXPECT_GE(Metric(router.metrics, "pdq_split_fallbacks_total{pool=\"treatment\"}"), 1);
}

// An arm with a decode worker but no prefill worker cannot serve a request
// whole: its requests go to a pool that can (counted as fallbacks), never
// to a prefill worker of another arm, and none fails.
TEST_F(ServingTest, AnArmWithoutAPrefillWorkerFallsBackWhole) {
  Cluster c;
  const Proc router = c.Router({"--split", "control=50,treatment=50"});
  ASSERT_TRUE(router.ok());
  const Proc control = c.Worker(router.address, "both", "fp16", InPool("control"));
  const Proc decode = c.Worker(router.address, "decode", "fp16", InPool("treatment"));
  ASSERT_TRUE(control.ok() && decode.ok());
  auto stub = Client(router.address);
  ASSERT_TRUE(WaitForWorkers(*stub, 2));
  constexpr int kRequests = 40;  // all 40 in control by chance: 2^-40
  for (int i = 0; i < kRequests; ++i) {
    v1::GenerateRequest req;
    req.set_text("Hello");
    req.set_max_tokens(2);
    const Answer a = Generate(*stub, req);
    ASSERT_TRUE(a.status.ok()) << a.status.error_message();
    EXPECT_EQ(a.summary.pool(), "control");
  }
  const double fallbacks = Metric(router.metrics, "pdq_split_fallbacks_total{pool=\"treatment\"}");
  EXPECT_GE(fallbacks, 1);
  EXPECT_EQ(Metric(router.metrics, "pdq_requests_total{code=\"OK\",pool=\"control\"}"), kRequests);
  // The treatment decode worker took no request.
  EXPECT_LE(Metric(decode.metrics, "pdq_requests_total{code=\"OK\",pool=\"treatment\"}"), 0);
}

}  // namespace
}  // namespace pdq::testing
