// The served system when things go wrong, as separate processes: a worker
// killed with SIGKILL mid-request (a decode worker's streams computed again
// elsewhere), a deadline shorter than the prefill, a thousand requests
// cancelled around their KV transfer, random bytes on a worker's KV port,
// SIGTERM while a worker calibrates. Each time the client gets a clear
// status within a stated bound, every KV block returns to its pool, and the
// router keeps serving with the workers that are left.
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <atomic>
#include <random>

#include "kvtransfer/transport.h"
#include "serving_cluster.h"

namespace pdq::testing {
namespace {

// How long a client may wait for its status once a worker is killed. gRPC
// sees the broken connection at once (the kernel resets it); the bound is
// for a loaded CI machine.
constexpr double kFailureBoundSeconds = 10;

class ServingFaultsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(kModel)) GTEST_SKIP() << kModel << " not found (make model)";
  }
};

// Waits until `pred(load)` holds for the worker; false after 60 s.
template <typename Pred>
bool WaitForLoad(const std::string& worker, Pred pred) {
  const auto end = Clock::now() + std::chrono::seconds(60);
  while (Clock::now() < end) {
    if (pred(Load(worker))) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

v1::GenerateRequest Long(int words, int max_tokens) {
  v1::GenerateRequest r;
  r.set_text(LongText(words));
  r.set_max_tokens(max_tokens);
  r.set_ignore_eos(true);
  return r;
}

TEST_F(ServingFaultsTest, KillingThePrefillWorkerMidRequestFailsFastAndFreesTheReservation) {
  Cluster c;
  const Split split = StartSplit(c, "fp16", "fp16", {"--prefill-budget", "64"}, {});
  ASSERT_TRUE(split.ok());
  const Proc &prefill = split.prefill, &decode = split.decode;
  v1::Pdq::Stub* const stub = split.stub.get();

  // A prompt in many chunks, so the kill lands while the prefill computes
  // and the decode worker holds a reservation.
  Answer a;
  std::thread call([&] { a = Generate(*stub, Long(900, 8)); });
  ASSERT_TRUE(WaitForLoad(decode.address, [](const v1::WorkerLoad& l) {
    return l.kv_blocks_free() < l.kv_blocks_total();
  }));
  c.Kill(prefill);
  const auto killed = Clock::now();
  call.join();
  const double waited = std::chrono::duration<double>(Clock::now() - killed).count();
  EXPECT_EQ(a.status.error_code(), grpc::StatusCode::UNAVAILABLE) << a.status.error_message();
  EXPECT_LT(waited, kFailureBoundSeconds);
  ExpectAllBlocksFree(decode.address, "decode worker after its prefill peer died");

  // A new prefill worker joins, and the router serves with it (the dead one
  // leaves rotation when its heartbeats lapse).
  ASSERT_TRUE(c.Worker(split.router.address, "prefill", "fp16").ok());
  ASSERT_TRUE(WaitForWorkers(*stub, 2));
  const Answer after = Generate(*stub, Chat(kPrompts[0], 8));
  EXPECT_TRUE(after.status.ok()) << after.status.error_message();
}

// A router, a prefill worker and two decode workers (each with
// `decode_args`), and one greedy stream of `max_tokens` that has begun:
// `busy` is the decode worker serving it, `idle` the other.
struct StreamOnTwoDecoders {
  Proc router, prefill, d1, d2;
  const Proc* busy = nullptr;
  const Proc* idle = nullptr;
  std::unique_ptr<v1::Pdq::Stub> stub;
  grpc::ClientContext ctx;
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader;
  int tokens = 0;                     // read so far
  std::vector<int32_t> first_tokens;  // those tokens

  // False (with the failure recorded) when the cluster or the stream did
  // not start.
  bool Start(Cluster& c, const std::vector<std::string>& decode_args, int max_tokens) {
    router = c.Router();
    if (!router.ok()) return false;
    prefill = c.Worker(router.address, "prefill", "fp16");
    d1 = c.Worker(router.address, "decode", "fp16", decode_args);
    d2 = c.Worker(router.address, "decode", "fp16", decode_args);
    if (!prefill.ok() || !d1.ok() || !d2.ok()) return false;
    stub = Client(router.address);
    if (!WaitForWorkers(*stub, 3)) {
      ADD_FAILURE() << "the workers did not register";
      return false;
    }
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    v1::GenerateRequest r = Chat(kPrompts[2], max_tokens);
    r.set_ignore_eos(true);
    reader = stub->Generate(&ctx, r);
    v1::GenerateResponse m;
    while (tokens < 4 && reader->Read(&m)) {
      tokens += m.delta().token_ids_size();
      first_tokens.insert(first_tokens.end(), m.delta().token_ids().begin(),
                          m.delta().token_ids().end());
    }
    if (tokens != 4) {
      ADD_FAILURE() << "the stream ended early";
      return false;
    }
    const bool first = Load(d1.address).active_sequences() > 0;
    busy = first ? &d1 : &d2;
    idle = first ? &d2 : &d1;
    return true;
  }
};

// A decode worker killed mid-stream: the router computes the stream again
// on the other decode worker from the prompt and the tokens sent, and the
// client gets the whole answer (a pause, not an error); the killed worker's
// peers hold nothing. FP16 here, where the recomputed KV is the decode's
// own to the last bit, so the answer is the unbroken one token for token.
TEST_F(ServingFaultsTest, KillingTheDecodeWorkerMidStreamRecomputesTheStreamElsewhere) {
  Cluster c;
  StreamOnTwoDecoders t;
  ASSERT_TRUE(t.Start(c, {}, 240));
  auto& reader = t.reader;
  auto& stub = t.stub;
  const Proc& prefill = t.prefill;
  v1::GenerateResponse m;
  std::vector<int32_t> got = t.first_tokens;
  // The one decoding this stream dies.
  const Proc& victim = *t.busy;
  const Proc& survivor = *t.idle;
  c.Kill(victim);
  bool got_summary = false;
  v1::GenerateSummary summary;
  while (reader->Read(&m)) {
    got.insert(got.end(), m.delta().token_ids().begin(), m.delta().token_ids().end());
    if (m.has_summary()) {
      got_summary = true;
      summary = m.summary();
    }
  }
  const grpc::Status s = reader->Finish();
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(got_summary);
  EXPECT_EQ(got.size(), 240u);
  EXPECT_EQ(summary.output_tokens(), 240);
  // The answer a stream never interrupted gives.
  v1::GenerateRequest again = Chat(kPrompts[2], 240);
  again.set_ignore_eos(true);
  const Answer want = Generate(*stub, again);
  ASSERT_TRUE(want.status.ok()) << want.status.error_message();
  EXPECT_EQ(got, want.tokens);
  EXPECT_EQ(summary.prompt_tokens(), want.summary.prompt_tokens());
  EXPECT_EQ(Metric(t.router.metrics, "pdq_recomputes_total"), 1);
  ExpectAllBlocksFree(prefill.address, "prefill worker after its decode peer died");
  ExpectAllBlocksFree(survivor.address, "the surviving decode worker");
}

// With no other decode worker to compute it again, a stream whose decode
// worker dies ends in UNAVAILABLE within the bound: never an OK with a
// truncated answer.
TEST_F(ServingFaultsTest, KillingTheOnlyDecodeWorkerMidStreamIsNeverATruncatedOk) {
  Cluster c;
  const Split sp = StartSplit(c);
  ASSERT_TRUE(sp.ok());
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
  auto reader = sp.stub->Generate(&ctx, Long(20, 400));
  v1::GenerateResponse m;
  ASSERT_TRUE(reader->Read(&m));
  c.Kill(sp.decode);
  const auto killed = Clock::now();
  bool got_summary = false;
  while (reader->Read(&m)) got_summary |= m.has_summary();
  const grpc::Status s = reader->Finish();
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - killed).count(), kFailureBoundSeconds);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  EXPECT_FALSE(got_summary);
  ExpectAllBlocksFree(sp.prefill.address, "prefill worker after its decode peer died");
}

// SIGTERM is a drain, not a kill: the decode worker asked to stop
// mid-stream leaves rotation (new requests go to the other one), finishes
// the stream it serves, and only then exits, with status 0.
TEST_F(ServingFaultsTest, SigtermDrainsADecodeWorkerWithoutFailingItsStream) {
  Cluster c;
  StreamOnTwoDecoders t;
  ASSERT_TRUE(t.Start(c, {"--drain-seconds", "60"}, 300));
  auto& reader = t.reader;
  auto& stub = t.stub;
  const Proc& prefill = t.prefill;
  v1::GenerateResponse m;
  int tokens = t.tokens;
  const Proc& draining = *t.busy;
  const Proc& other = *t.idle;
  ASSERT_EQ(::kill(draining.pid, SIGTERM), 0);
  // It leaves rotation at once: requests meanwhile are served by the other.
  ASSERT_TRUE(WaitForWorkers(*stub, 2));
  for (int i = 0; i < 2; ++i) {
    const Answer a = Generate(*stub, Chat(kPrompts[i], 8));
    EXPECT_TRUE(a.status.ok()) << a.status.error_message();
  }
  bool got_summary = false;
  while (reader->Read(&m)) {
    tokens += m.delta().token_ids_size();
    got_summary |= m.has_summary();
  }
  const grpc::Status s = reader->Finish();
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(got_summary);
  EXPECT_EQ(tokens, 300);
  // Then it exits by itself, cleanly.
  int status = -1;
  const auto end = Clock::now() + std::chrono::seconds(20);
  while (waitpid(draining.pid, &status, WNOHANG) == 0 && Clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  ExpectAllBlocksFree(other.address, "the decode worker left");
  ExpectAllBlocksFree(prefill.address, "the prefill worker");
}

// A worker told to stop while it calibrates (W8A8, statistics not cached:
// a minute or more here) stops within seconds, says why, and exits 0; it
// does not finish calibrating first (orchestrators SIGKILL after 30 s).
TEST_F(ServingFaultsTest, SigtermWhileCalibratingStopsTheWorkerAtOnce) {
  char tmpl[] = "/tmp/pdq-calib-stop-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  const std::string log = dir + "/stderr";
  const pid_t pid = fork();
  if (pid == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 2);
    setenv("PDQ_CACHE_DIR", "none", 1);  // calibrate, whatever is cached
    const std::string bin = std::string(PDQ_BIN_DIR) + "/pdq-prefill";
    execl(bin.c_str(), bin.c_str(), "--model", kModel, "--precision", "w8a8", "--threads", "1",
          "--skip-peaks", "--kv-tokens", "1024", static_cast<char*>(nullptr));
    _exit(127);
  }
  ASSERT_GT(pid, 0);
  auto read_log = [&] {
    std::ifstream in(log);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  // Signal once the first calibration window is reported.
  const auto end = Clock::now() + std::chrono::seconds(120);
  int status = 0;
  bool exited = false;
  while (read_log().find("calibrating on") == std::string::npos && Clock::now() < end) {
    if (waitpid(pid, &status, WNOHANG) == pid) {
      exited = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_FALSE(exited) << "exited before calibrating: " << read_log();
  ASSERT_NE(read_log().find("calibrating on"), std::string::npos) << read_log();
  ASSERT_EQ(::kill(pid, SIGTERM), 0);
  const auto signalled = Clock::now();
  while (!exited && Clock::now() - signalled < std::chrono::seconds(10)) {
    exited = waitpid(pid, &status, WNOHANG) == pid;
    if (!exited) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (!exited) {
    ::kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
  }
  const std::string text = read_log();
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(exited) << "still running 10 s after SIGTERM: " << text;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status << ": " << text;
  EXPECT_NE(text.find("SIGTERM while loading the model: stopped before serving"), std::string::npos)
      << text;
  EXPECT_EQ(text.find("serving on"), std::string::npos) << text;
}

// A prompt that waits in the prefill worker's queue longer than the decode
// reservation's lease still completes: the prefill worker connects for the
// KV when it queues the prompt, and from then on the connection, not the
// lease, tells the decode worker whether the KV is coming. (pdq eval found
// 2048-token prompts failing at concurrency 4 with the 30 s lease.)
TEST_F(ServingFaultsTest, APromptQueuedLongerThanTheLeaseStillCompletes) {
  Cluster c;
  const Proc router = c.Router();
  ASSERT_TRUE(router.ok());
  // Small prefill steps: the prompts run one after another.
  const Proc prefill = c.Worker(router.address, "prefill", "fp16", {"--prefill-budget", "128"});
  const Proc decode = c.Worker(router.address, "decode", "fp16", {"--lease-seconds", "1"});
  ASSERT_TRUE(prefill.ok() && decode.ok());
  auto stub = Client(router.address);
  ASSERT_TRUE(WaitForWorkers(*stub, 2));
  std::vector<Answer> answers(3);
  std::vector<std::thread> clients;
  for (int i = 0; i < 3; ++i) {
    // Each its own cache salt: a prompt from the prefix cache would not wait.
    clients.emplace_back([&, i] {
      v1::GenerateRequest r = Chat(LongText(400), 4);
      r.set_cache_salt("lease-" + std::to_string(i));
      answers[i] = Generate(*stub, r);
    });
  }
  for (std::thread& t : clients) t.join();
  double longest = 0;
  for (const Answer& a : answers) {
    EXPECT_TRUE(a.status.ok()) << a.status.error_message();
    longest = std::max(longest, a.seconds);
  }
  ExpectAllBlocksFree(decode.address, "the decode worker");
  // On a machine fast enough that no prompt waited past the lease, the
  // answers above showed nothing about it: say so rather than pass.
  if (longest < 1.5) GTEST_SKIP() << "no prompt waited past the 1 s lease on this machine";
}

TEST_F(ServingFaultsTest, ADeadlineShorterThanThePrefillIsDeadlineExceededAndFreesTheKv) {
  Cluster c;
  // The same prompt twice: without the prefix cache the second computes
  // as long as the first.
  // The router takes requests predicted to miss their deadline here, so
  // the workers' handling of one is what is tested (admission_serving_test
  // has the refusal).
  const Split split =
      StartSplit(c, "fp16", "fp16", {"--prefill-budget", "64", "--prefix-cache", "off"},
                 {"--prefix-cache", "off"}, {"--admit-past-deadline"});
  ASSERT_TRUE(split.ok());
  v1::Pdq::Stub* const stub = split.stub.get();

  // The quicker of two, so a prefill slowed once by a loaded machine does
  // not set a deadline the next one meets.
  double ttft = 1e9;
  for (int i = 0; i < 2; ++i) {
    const Answer alone = Generate(*stub, Long(900, 2));
    ASSERT_TRUE(alone.status.ok()) << alone.status.error_message();
    ttft = std::min(ttft, alone.summary.ttft_seconds());
  }
  ASSERT_GT(ttft, 0.1) << "the prefill is too fast to test a deadline";

  grpc::ClientContext ctx;
  const double budget = ttft / 8;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::microseconds(int64_t(budget * 1e6)));
  auto reader = stub->Generate(&ctx, Long(900, 8));
  v1::GenerateResponse m;
  bool got_token = false;
  while (reader->Read(&m)) got_token |= m.delta().token_ids_size() > 0;
  const grpc::Status s = reader->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << s.error_message();
  EXPECT_FALSE(got_token);
  ExpectRecovered(split);
}

// Cancels at random points from before the prefill starts to after the
// first token, many of them while the KV is on its way (it streams out
// layer by layer as the prefill computes); four clients at a time.
TEST_F(ServingFaultsTest, AThousandCancelsAroundTheKvTransferReturnEveryBlock) {
  Cluster c;
  const Split split = StartSplit(c, "fp16", "fp16");
  ASSERT_TRUE(split.ok());
  const Proc &prefill = split.prefill, &decode = split.decode;
  v1::Pdq::Stub* const stub = split.stub.get();
  // Every request its own cache salt: the same words again would be
  // prefilled from the decode worker's prefix cache, with no prefill call
  // and no KV transfer to cancel around.
  v1::GenerateRequest req = Long(60, 4);
  std::atomic<int> salts{0};
  auto salted = [&] {
    v1::GenerateRequest r = req;
    r.set_cache_salt("cancel-" + std::to_string(salts++));
    return r;
  };
  const Answer alone = Generate(*stub, salted());
  ASSERT_TRUE(alone.status.ok()) << alone.status.error_message();
  // The quicker of two, so one slowed by a loaded machine does not widen
  // the window past the answers' ends.
  const Answer again = Generate(*stub, salted());
  ASSERT_TRUE(again.status.ok()) << again.status.error_message();
  const double ttft = std::min(alone.summary.ttft_seconds(), again.summary.ttft_seconds());

  constexpr int kClients = 4, kCancels = 1000;
  std::atomic<int> next{0}, cancelled{0}, completed{0}, other{0};
  std::vector<std::thread> clients;
  for (int t = 0; t < kClients; ++t) {
    clients.emplace_back([&, t] {
      std::mt19937 rng(t);
      std::uniform_real_distribution<double> when(0, 2.5 * ttft);
      while (next++ < kCancels) {
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
        auto reader = stub->Generate(&ctx, salted());
        std::this_thread::sleep_for(std::chrono::microseconds(int64_t(when(rng) * 1e6)));
        ctx.TryCancel();
        v1::GenerateResponse m;
        while (reader->Read(&m)) {
        }
        const grpc::Status s = reader->Finish();
        if (s.error_code() == grpc::StatusCode::CANCELLED) {
          ++cancelled;
        } else if (s.ok()) {
          ++completed;
        } else {
          ++other;
          ADD_FAILURE() << "status " << s.error_code() << ": " << s.error_message();
        }
      }
    });
  }
  for (std::thread& t : clients) t.join();
  EXPECT_EQ(cancelled + completed + other, kCancels);
  EXPECT_GT(cancelled, kCancels / 4) << completed << " completed before their cancel";
  // Where the cancels landed, for the log (timing decides; not asserted).
  std::printf(
      "%d cancelled, %d completed first; prefill calls cancelled: %.0f; KV transfers "
      "acknowledged: %.0f\n",
      cancelled.load(), completed.load(),
      Metric(prefill.metrics, "pdq_requests_total{code=\"CANCELLED\"}"),
      Metric(prefill.metrics, "pdq_kv_transfer_seconds_count"));
  ExpectAllBlocksFree(prefill.address, "prefill worker");
  ExpectAllBlocksFree(decode.address, "decode worker");
  const Answer after = Generate(*stub, salted());
  ASSERT_TRUE(after.status.ok()) << after.status.error_message();
  EXPECT_EQ(after.tokens, alone.tokens);
}

// A client that cancels as the summary arrives: its cancel races the
// stream's status, often after the router finished the call and let go of
// its workers (a short answer whose prompt the decode worker mostly had
// cached, so no prefill call was open). The router crashed on that once
// (releasing a reservation through a worker it no longer held); now the
// cancel finds nothing to stop, and every block comes back.
TEST_F(ServingFaultsTest, ACancelRacingTheFinishedStreamIsHarmless) {
  Cluster c;
  const Split split = StartSplit(c, "fp16", "fp16");
  ASSERT_TRUE(split.ok());
  v1::Pdq::Stub* const stub = split.stub.get();
  const v1::GenerateRequest req = Long(20, 2);
  constexpr int kClients = 4, kRequests = 300;
  std::atomic<int> next{0}, done{0}, other{0};
  std::vector<std::thread> clients;
  for (int t = 0; t < kClients; ++t) {
    clients.emplace_back([&] {
      while (next++ < kRequests) {
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
        auto reader = stub->Generate(&ctx, req);
        v1::GenerateResponse m;
        while (reader->Read(&m)) {
          if (m.has_summary()) ctx.TryCancel();
        }
        const grpc::Status s = reader->Finish();
        if (s.ok() || s.error_code() == grpc::StatusCode::CANCELLED) {
          ++done;
        } else {
          ++other;
          ADD_FAILURE() << "status " << s.error_code() << ": " << s.error_message();
        }
      }
    });
  }
  for (std::thread& t : clients) t.join();
  EXPECT_EQ(done.load(), kRequests);
  EXPECT_EQ(other.load(), 0);
  ExpectAllBlocksFree(split.prefill.address, "prefill worker");
  ExpectAllBlocksFree(split.decode.address, "decode worker");
  const Answer after = Generate(*stub, req);
  EXPECT_TRUE(after.status.ok()) << after.status.error_message();
}

// Sends `bytes` to 127.0.0.1:port and closes.
void SendBytes(int port, const std::string& bytes) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
    (void)!send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  close(fd);
}

TEST_F(ServingFaultsTest, RandomBytesOnAWorkersKvPortAreRefusedWithoutHarm) {
  for (const std::string& transport : kvtransfer::TransportNames()) {
    SCOPED_TRACE("KV over " + transport);
    Cluster c;
    const Proc router = c.Router();
    ASSERT_TRUE(router.ok());
    const int port = FreePort();
    const Proc prefill = c.Worker(router.address, "prefill", "fp16", {"--kv-transport", transport});
    const Proc decode =
        c.Worker(router.address, "decode", "fp16",
                 {"--kv-transport", transport, "--kv-listen", "127.0.0.1:" + std::to_string(port)});
    ASSERT_TRUE(prefill.ok() && decode.ok());
    auto stub = Client(router.address);
    ASSERT_TRUE(WaitForWorkers(*stub, 2));
    std::mt19937 rng(7);
    for (int i = 0; i < 30; ++i) {
      std::string junk(1 + rng() % 4096, '\0');
      for (char& ch : junk) ch = char(rng());
      if (i % 3 == 0) junk.replace(0, std::min<size_t>(8, junk.size()), "PDQKVTCP");
      SendBytes(port, junk);
    }
    const Answer after = Generate(*stub, Chat(kPrompts[0], 8));
    EXPECT_TRUE(after.status.ok()) << after.status.error_message();
    ExpectAllBlocksFree(decode.address, "decode worker");
  }
}

// Two routers serve the same workers (each worker registers and heartbeats
// with both: --router A,B); killing one leaves the other's streams and
// registrations (serving_cluster.h).
TEST_F(ServingFaultsTest, KillingOneOfTwoRoutersLeavesTheOthersStreamsAndWorkers) {
  Cluster c;
  const Proc a = c.Router(), b = c.Router();
  ASSERT_TRUE(a.ok() && b.ok());
  const std::string both = a.address + "," + b.address;
  const Proc prefill = c.Worker(both, "prefill", "fp16");
  const Proc decode = c.Worker(both, "decode", "fp16");
  ASSERT_TRUE(prefill.ok() && decode.ok());
  ExpectOneRouterLostLeavesTheOther(c, a, b, prefill, decode);
}

}  // namespace
}  // namespace pdq::testing
