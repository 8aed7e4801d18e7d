// The served system, as separate processes on this machine: pdq-router,
// pdq-prefill and pdq-decode started on port 0, talked to over gRPC as a
// client would. Greedy answers through router + prefill + decode match the
// monolithic worker token for token; concurrent streams all complete; bad
// input is refused with a message; cancelled requests return every KV block.
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "gtest/gtest.h"
#include "pdq/v1/pdq.grpc.pb.h"
#include "pdq/v1/worker.grpc.pb.h"

namespace pdq {
namespace {

namespace v1 = pdq::v1;
constexpr char kModel[] = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
using Clock = std::chrono::steady_clock;

// Processes started for one test, stopped (SIGTERM, then SIGKILL) at the end.
class Cluster {
 public:
  Cluster() {
    char tmpl[] = "/tmp/pdq-serving-test-XXXXXX";
    dir_ = mkdtemp(tmpl);
  }
  ~Cluster() {
    for (pid_t p : pids_) kill(p, SIGTERM);
    for (pid_t p : pids_) {
      const auto end = Clock::now() + std::chrono::seconds(10);
      int status;
      while (waitpid(p, &status, WNOHANG) == 0) {
        if (Clock::now() > end) {
          ADD_FAILURE() << "process " << p << " did not stop on SIGTERM within 10 s";
          kill(p, SIGKILL);
          waitpid(p, &status, 0);
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
    std::filesystem::remove_all(dir_);
  }

  // Starts a binary of this build with `args` plus --address-file; returns
  // its gRPC address once it serves ("" on failure).
  std::string Start(const std::string& binary, std::vector<std::string> args) {
    const std::string file = dir_ + "/addr" + std::to_string(pids_.size());
    args.insert(args.begin(), std::string(PDQ_BIN_DIR) + "/" + binary);
    args.push_back("--address-file");
    args.push_back(file);
    const pid_t pid = fork();
    if (pid == 0) {
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    pids_.push_back(pid);
    const auto end = Clock::now() + std::chrono::seconds(120);
    while (Clock::now() < end) {
      std::ifstream in(file);
      std::string address;
      if (in && std::getline(in, address) && !address.empty()) return address;
      int status;
      if (waitpid(pid, &status, WNOHANG) == pid) {
        pids_.back() = -pid;
        ADD_FAILURE() << binary << " exited before serving";
        return "";
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ADD_FAILURE() << binary << " did not start within 120 s";
    return "";
  }

  std::string Router() { return Start("pdq-router", {"--model", kModel, "--heartbeat-ms", "200"}); }
  std::string Worker(const std::string& router, const std::string& role,
                     const std::string& precision, std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {"--role",    role,   "--precision", precision,
                                     "--model",   kModel, "--router",    router,
                                     "--threads", "1",    "--kv-tokens", "32768"};
    args.insert(args.end(), extra.begin(), extra.end());
    return Start(role == "prefill" ? "pdq-prefill" : "pdq-decode", args);
  }

 private:
  std::string dir_;
  std::vector<pid_t> pids_;
};

std::unique_ptr<v1::Pdq::Stub> Client(const std::string& address) {
  return v1::Pdq::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
}

// Waits until `n` workers are registered with the router.
bool WaitForWorkers(v1::Pdq::Stub& stub, int n) {
  const auto end = Clock::now() + std::chrono::seconds(60);
  while (Clock::now() < end) {
    grpc::ClientContext ctx;
    v1::ModelInfo info;
    if (stub.GetModelInfo(&ctx, {}, &info).ok() && info.live_workers() == n) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

struct Answer {
  grpc::Status status;
  std::vector<int32_t> tokens;
  std::string text;
  v1::GenerateSummary summary;
};

Answer Generate(v1::Pdq::Stub& stub, const v1::GenerateRequest& req, int timeout_s = 120) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(timeout_s));
  auto reader = stub.Generate(&ctx, req);
  Answer a;
  v1::GenerateResponse m;
  while (reader->Read(&m)) {
    if (m.has_delta()) {
      a.tokens.insert(a.tokens.end(), m.delta().token_ids().begin(), m.delta().token_ids().end());
      a.text += m.delta().text();
    } else {
      a.summary = m.summary();
    }
  }
  a.status = reader->Finish();
  return a;
}

v1::GenerateRequest Chat(const std::string& text, int max_tokens) {
  v1::GenerateRequest r;
  v1::ChatMessage* m = r.mutable_chat()->add_messages();
  m->set_role("user");
  m->set_content(text);
  r.set_max_tokens(max_tokens);
  return r;
}

const std::vector<std::string> kPrompts = {
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three prime numbers and explain why they are prime.",
};

class ServingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(kModel)) GTEST_SKIP() << kModel << " not found (make model)";
  }
};

// The disaggregated deployment answers exactly as the monolithic one.
void ExpectSameAnswers(const std::string& prefill_precision, const std::string& decode_precision) {
  Cluster c;
  const std::string split = c.Router(), mono = c.Router();
  ASSERT_FALSE(split.empty() || mono.empty());
  ASSERT_FALSE(c.Worker(split, "prefill", prefill_precision).empty());
  ASSERT_FALSE(c.Worker(split, "decode", decode_precision).empty());
  ASSERT_FALSE(
      c.Worker(mono, "both", decode_precision, {"--prefill-precision", prefill_precision}).empty());
  auto a = Client(split), b = Client(mono);
  ASSERT_TRUE(WaitForWorkers(*a, 2) && WaitForWorkers(*b, 1));
  for (const std::string& p : kPrompts) {
    const Answer x = Generate(*a, Chat(p, 24)), y = Generate(*b, Chat(p, 24));
    ASSERT_TRUE(x.status.ok()) << x.status.error_message();
    ASSERT_TRUE(y.status.ok()) << y.status.error_message();
    EXPECT_FALSE(x.tokens.empty());
    EXPECT_EQ(x.tokens, y.tokens) << p << "\nsplit: " << x.text << "\nmonolithic: " << y.text;
    EXPECT_EQ(x.text, y.text);
    EXPECT_EQ(x.summary.finish_reason(), y.summary.finish_reason());
    EXPECT_EQ(x.summary.output_tokens(), (int)x.tokens.size());
    EXPECT_GT(x.summary.ttft_seconds(), 0.0);
  }
}

TEST_F(ServingTest, Fp16PrefillAndDecodeMatchTheMonolithicWorker) {
  ExpectSameAnswers("fp16", "fp16");
}

TEST_F(ServingTest, W8a8PrefillAndW4a16DecodeMatchOneProcessDoingBoth) {
  ExpectSameAnswers("w8a8", "w4a16");
}

// W4A16 decode is batch-invariant (forward_test), so every one of 64
// concurrent streams gets exactly its answer alone.
TEST_F(ServingTest, SixtyFourConcurrentStreamsAllComplete) {
  Cluster c;
  const std::string router = c.Router();
  ASSERT_FALSE(router.empty());
  ASSERT_FALSE(c.Worker(router, "prefill", "w8a8").empty());
  ASSERT_FALSE(c.Worker(router, "decode", "w4a16").empty());
  auto stub = Client(router);
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

v1::WorkerLoad Load(const std::string& worker) {
  auto stub =
      v1::DecodeWorker::NewStub(grpc::CreateChannel(worker, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  v1::WorkerLoad load;
  EXPECT_TRUE(stub->GetLoad(&ctx, {}, &load).ok());
  return load;
}

// Every KV block of the worker comes back (bounded wait: the worker frees
// them on its own thread after it sees the cancellation).
void ExpectAllBlocksFree(const std::string& worker, const std::string& what) {
  const auto end = Clock::now() + std::chrono::seconds(20);
  v1::WorkerLoad l = Load(worker);
  while (l.kv_blocks_free() != l.kv_blocks_total() && Clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    l = Load(worker);
  }
  EXPECT_EQ(l.kv_blocks_free(), l.kv_blocks_total()) << what;
  EXPECT_EQ(l.active_sequences(), 0) << what;
}

TEST_F(ServingTest, CancelledRequestsReturnEveryKvBlock) {
  Cluster c;
  const std::string router = c.Router();
  ASSERT_FALSE(router.empty());
  const std::string prefill = c.Worker(router, "prefill", "fp16");
  const std::string decode = c.Worker(router, "decode", "fp16");
  ASSERT_FALSE(prefill.empty() || decode.empty());
  auto stub = Client(router);
  ASSERT_TRUE(WaitForWorkers(*stub, 2));
  std::string long_text;
  for (int i = 0; i < 50; ++i) long_text += "The quick brown fox jumps over the lazy dog. ";
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
  ExpectAllBlocksFree(prefill, "prefill worker");
  ExpectAllBlocksFree(decode, "decode worker");
  const Answer after = Generate(*stub, Chat(kPrompts[1], 8));
  EXPECT_TRUE(after.status.ok()) << after.status.error_message();
}

TEST_F(ServingTest, BadInputIsRefusedWithAMessageAndTheNextRequestSucceeds) {
  Cluster c;
  const std::string router = c.Router();
  ASSERT_FALSE(router.empty());
  const std::string prefill = c.Worker(router, "prefill", "fp16");
  const std::string decode = c.Worker(router, "decode", "fp16");
  auto stub = Client(router);
  ASSERT_TRUE(WaitForWorkers(*stub, 2));
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
  for (const Case& k : cases) {
    const Answer a = Generate(*stub, k.req);
    EXPECT_EQ(a.status.error_code(), k.code) << k.what << ": " << a.status.error_message();
    EXPECT_NE(a.status.error_message().find(k.message), std::string::npos)
        << k.what << ": " << a.status.error_message();
    const Answer ok = Generate(*stub, Chat(kPrompts[0], 4));
    EXPECT_TRUE(ok.status.ok()) << "after " << k.what << ": " << ok.status.error_message();
  }
  ExpectAllBlocksFree(prefill, "prefill worker");
  ExpectAllBlocksFree(decode, "decode worker");
}

}  // namespace
}  // namespace pdq
