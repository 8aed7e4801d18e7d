// What the multi-process serving tests share: a Cluster of pdq-router,
// pdq-prefill and pdq-decode processes of this build (each on port 0,
// found through its --address-file), a client, and the checks they repeat.
#pragma once

#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "pdq/v1/pdq.grpc.pb.h"
#include "pdq/v1/worker.grpc.pb.h"

namespace pdq::testing {

namespace v1 = pdq::v1;
inline constexpr char kModel[] = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
using Clock = std::chrono::steady_clock;

// One started process.
struct Proc {
  std::string address;  // gRPC host:port; "" when it failed to start
  std::string metrics;  // /metrics host:port
  pid_t pid = 0;
  bool ok() const { return !address.empty(); }
};

// Processes started for one test, stopped (SIGTERM, then SIGKILL) at the end.
class Cluster {
 public:
  Cluster() {
    char tmpl[] = "/tmp/pdq-serving-test-XXXXXX";
    dir_ = mkdtemp(tmpl);
  }
  ~Cluster() {
    for (pid_t p : pids_) {
      if (p > 0) kill(p, SIGTERM);
    }
    for (pid_t p : pids_) {
      if (p <= 0) continue;
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

  // Starts a binary of this build with `args` plus its address files;
  // returns once it serves. `prefix` runs it through another command
  // (ip netns exec NAME).
  Proc Start(const std::string& binary, std::vector<std::string> args,
             const std::vector<std::string>& prefix = {}) {
    const std::string n = std::to_string(pids_.size());
    const std::string file = dir_ + "/addr" + n, metrics_file = dir_ + "/metrics" + n;
    args.insert(args.begin(), std::string(PDQ_BIN_DIR) + "/" + binary);
    args.insert(args.begin(), prefix.begin(), prefix.end());
    for (const std::string& a : {std::string("--address-file"), file,
                                 std::string("--metrics-address-file"), metrics_file}) {
      args.push_back(a);
    }
    std::vector<char*> argv;  // built before fork: the child only execs
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const pid_t parent = getpid();
    const pid_t pid = fork();
    if (pid == 0) {
      // SIGTERM when the test binary dies (killed by a timeout, a crash),
      // so no worker outlives it holding ports and cores. Start runs on the
      // test's own thread, which lives as long as the cluster.
      prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (getppid() != parent) _exit(127);  // it died before the line above
      execvp(argv[0], argv.data());
      _exit(127);
    }
    pids_.push_back(pid);
    // A W8A8 worker calibrates at start when the statistics are not cached
    // yet: over two minutes on one thread of a slow, busy 2-core machine.
    constexpr int kStartSeconds = 300;
    const auto end = Clock::now() + std::chrono::seconds(kStartSeconds);
    while (Clock::now() < end) {
      std::ifstream in(file), min(metrics_file);
      Proc p;
      p.pid = pid;
      if (in && std::getline(in, p.address) && !p.address.empty() && min &&
          std::getline(min, p.metrics)) {
        return p;
      }
      int status;
      if (waitpid(pid, &status, WNOHANG) == pid) {
        pids_.back() = -pid;
        ADD_FAILURE() << binary << " exited before serving";
        return {};
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ADD_FAILURE() << binary << " did not start within " << kStartSeconds << " s";
    return {};
  }

  Proc Router(const std::vector<std::string>& extra = {},
              const std::vector<std::string>& prefix = {}) {
    // A short drain keeps every test's teardown within its 10 s bound even
    // when a request is still in flight (a later --drain-seconds wins).
    std::vector<std::string> args = {"--model",         kModel, "--heartbeat-ms", "200",
                                     "--drain-seconds", "3"};
    args.insert(args.end(), extra.begin(), extra.end());
    return Start("pdq-router", args, prefix);
  }
  Proc Worker(const std::string& router, const std::string& role, const std::string& precision,
              std::vector<std::string> extra = {}, const std::vector<std::string>& prefix = {}) {
    std::vector<std::string> args = {
        "--role",    role, "--precision", precision, "--model",         kModel, "--router", router,
        "--threads", "1",  "--kv-tokens", "32768",   "--drain-seconds", "3"};
    args.insert(args.end(), extra.begin(), extra.end());
    return Start(role == "prefill" ? "pdq-prefill" : "pdq-decode", args, prefix);
  }

  // kill -9, reaped at once.
  void Kill(const Proc& p) {
    ::kill(p.pid, SIGKILL);
    int status;
    waitpid(p.pid, &status, 0);
    for (pid_t& q : pids_) {
      if (q == p.pid) q = -q;
    }
  }

 private:
  std::string dir_;
  std::vector<pid_t> pids_;
};

// A loopback port nothing listens on now (for a flag that needs a fixed one).
inline int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

inline std::unique_ptr<v1::Pdq::Stub> Client(const std::string& address) {
  return v1::Pdq::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
}

// Waits until `n` workers are registered with the router.
inline bool WaitForWorkers(v1::Pdq::Stub& stub, int n) {
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
  double seconds = 0;  // from the call to its status
};

// Reads a stream to its end onto what `a` already holds: its tokens, text,
// summary and status.
inline Answer ReadToEnd(grpc::ClientReader<v1::GenerateResponse>& reader, Answer a) {
  v1::GenerateResponse m;
  while (reader.Read(&m)) {
    if (m.has_delta()) {
      a.tokens.insert(a.tokens.end(), m.delta().token_ids().begin(), m.delta().token_ids().end());
      a.text += m.delta().text();
    } else {
      a.summary = m.summary();
    }
  }
  a.status = reader.Finish();
  return a;
}

inline Answer Generate(v1::Pdq::Stub& stub, const v1::GenerateRequest& req, int timeout_s = 120) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(timeout_s));
  const auto start = Clock::now();
  auto reader = stub.Generate(&ctx, req);
  Answer a = ReadToEnd(*reader, {});
  a.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return a;
}

inline v1::GenerateRequest Chat(const std::string& text, int max_tokens) {
  v1::GenerateRequest r;
  v1::ChatMessage* m = r.mutable_chat()->add_messages();
  m->set_role("user");
  m->set_content(text);
  r.set_max_tokens(max_tokens);
  return r;
}

// About `words` words of plain English, for prompts whose prefill takes a
// while.
inline std::string LongText(int words) {
  std::string t;
  for (int i = 0; i < words / 9; ++i) t += "The quick brown fox jumps over the lazy dog. ";
  return t;
}

inline const std::vector<std::string> kPrompts = {
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three prime numbers and explain why they are prime.",
};

inline v1::WorkerLoad Load(const std::string& worker) {
  auto stub =
      v1::DecodeWorker::NewStub(grpc::CreateChannel(worker, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::WorkerLoad load;
  EXPECT_TRUE(stub->GetLoad(&ctx, {}, &load).ok()) << "GetLoad from " << worker;
  return load;
}

// Every KV block of the worker comes back (bounded wait: the worker frees
// them on its own thread after it sees the cancellation).
inline void ExpectAllBlocksFree(const std::string& worker, const std::string& what) {
  const auto end = Clock::now() + std::chrono::seconds(20);
  v1::WorkerLoad l = Load(worker);
  while ((l.kv_blocks_free() != l.kv_blocks_total() || l.active_sequences() != 0) &&
         Clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    l = Load(worker);
  }
  EXPECT_EQ(l.kv_blocks_free(), l.kv_blocks_total()) << what;
  EXPECT_EQ(l.active_sequences(), 0) << what;
}

// A router with one prefill and one decode worker, both registered.
struct Split {
  Proc router, prefill, decode;
  std::unique_ptr<v1::Pdq::Stub> stub;  // to the router
  bool ok() const { return router.ok() && prefill.ok() && decode.ok() && stub != nullptr; }
};
inline Split StartSplit(Cluster& c, const std::string& prefill_precision = "fp16",
                        const std::string& decode_precision = "fp16",
                        const std::vector<std::string>& prefill_args = {},
                        const std::vector<std::string>& decode_args = {},
                        const std::vector<std::string>& router_args = {}) {
  Split s;
  s.router = c.Router(router_args);
  if (!s.router.ok()) return s;
  s.prefill = c.Worker(s.router.address, "prefill", prefill_precision, prefill_args);
  s.decode = c.Worker(s.router.address, "decode", decode_precision, decode_args);
  if (!s.prefill.ok() || !s.decode.ok()) return s;
  auto stub = Client(s.router.address);
  if (WaitForWorkers(*stub, 2)) s.stub = std::move(stub);
  return s;
}

// After a test's damage: both workers hold no KV and the next request is
// answered.
inline void ExpectRecovered(const Split& s) {
  ExpectAllBlocksFree(s.prefill.address, "prefill worker");
  ExpectAllBlocksFree(s.decode.address, "decode worker");
  const Answer after = Generate(*s.stub, Chat(kPrompts[1], 8));
  EXPECT_TRUE(after.status.ok()) << "the next request: " << after.status.error_message();
}

// Two routers `a` and `b` serving the same prefill and decode workers: a
// long stream through each, then `a` killed. The stream through `a` fails
// within 10 s; the one through `b` completes whole; `b` keeps both workers
// and gives the greedy answers it gave before; every block comes back.
void ExpectOneRouterLostLeavesTheOther(Cluster& c, const Proc& a, const Proc& b,
                                       const Proc& prefill, const Proc& decode);

// One sample of a process's /metrics: the value of the series written
// exactly so ("pdq_requests_total{code=\"OK\"}"); -1 when absent or the
// process does not answer.
double Metric(const std::string& metrics_address, const std::string& series);

// The series once it equals `want`, or after 20 s what it is then: for
// counts a worker updates after the client has its answer (a prefill
// worker counts a request once its KV is acknowledged; a decode worker
// frees blocks after it sends the last token).
double MetricSoon(const std::string& metrics_address, const std::string& series, double want);

}  // namespace pdq::testing
