// Live migration of decoding streams between decode workers, as separate
// processes: the router suspends a stream on its decode worker, reserves
// room on another, has the first send the KV there and splices the client's
// stream onto the second. The client sees a pause and nothing else: the
// same greedy tokens as a stream never moved, the right usage counts, and
// every KV block back in its pool. Where the move cannot happen (nowhere to
// go, a target that dies first) the stream decodes on where it was.
#include <signal.h>

#include "serving_cluster.h"

namespace pdq::testing {
namespace {

class MigrationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(kModel)) GTEST_SKIP() << kModel << " not found (make model)";
  }
};

v1::GenerateRequest Request(int max_tokens) {
  v1::GenerateRequest r = Chat(kPrompts[2], max_tokens);
  r.set_ignore_eos(true);
  return r;
}

// The worker id the router knows the worker at `address` by.
std::string WorkerId(v1::Pdq::Stub& stub, const std::string& address) {
  grpc::ClientContext ctx;
  v1::ModelInfo info;
  EXPECT_TRUE(stub.GetModelInfo(&ctx, {}, &info).ok());
  for (const v1::WorkerStatus& w : info.workers()) {
    if (w.address() == address) return w.worker_id();
  }
  ADD_FAILURE() << "no worker at " << address;
  return "";
}

// Asks the router (an operator's call) to move the streams on a worker.
int MigrateStreams(const std::string& router, const std::string& worker_id) {
  auto stub =
      v1::Registry::NewStub(grpc::CreateChannel(router, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::MigrateStreamsRequest req;
  req.set_worker_id(worker_id);
  v1::MigrateStreamsResponse resp;
  const grpc::Status s = stub->MigrateStreams(&ctx, req, &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return resp.migrating();
}

// A stream opened and read until it has at least `tokens` tokens.
struct OpenStream {
  grpc::ClientContext ctx;
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader;
  Answer got;
  OpenStream(v1::Pdq::Stub& stub, const v1::GenerateRequest& req, size_t tokens) {
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(180));
    reader = stub.Generate(&ctx, req);
    ReadUntil(tokens);
  }
  void ReadUntil(size_t tokens) {
    v1::GenerateResponse m;
    while (got.tokens.size() < tokens && reader->Read(&m)) {
      got.tokens.insert(got.tokens.end(), m.delta().token_ids().begin(),
                        m.delta().token_ids().end());
      got.text += m.delta().text();
    }
  }
  Answer Finish() { return ReadToEnd(*reader, std::move(got)); }
};

// A router, a prefill worker and two decode workers at the given
// precisions; `decode_args` for both decode workers.
struct TwoDecoders {
  Proc router, prefill, d1, d2;
  std::unique_ptr<v1::Pdq::Stub> stub;
  bool Start(Cluster& c, const std::string& prefill_precision,
             const std::string& decode_precision, const std::vector<std::string>& decode_args = {}) {
    router = c.Router();
    if (!router.ok()) return false;
    prefill = c.Worker(router.address, "prefill", prefill_precision);
    d1 = c.Worker(router.address, "decode", decode_precision, decode_args);
    d2 = c.Worker(router.address, "decode", decode_precision, decode_args);
    if (!prefill.ok() || !d1.ok() || !d2.ok()) return false;
    stub = Client(router.address);
    return WaitForWorkers(*stub, 3);
  }
  // The decode worker serving the one stream in flight.
  const Proc& Busy() const { return Load(d1.address).active_sequences() > 0 ? d1 : d2; }
};

// Moved mid-stream by an operator's call, a greedy stream gives the tokens
// it gives unmoved, and both decode workers end with every block free.
void ExpectMigratedEqualsUnmigrated(const std::string& prefill_precision,
                                    const std::string& decode_precision) {
  Cluster c;
  TwoDecoders t;
  ASSERT_TRUE(t.Start(c, prefill_precision, decode_precision));
  // Long enough that the stream still decodes through both moves and the
  // checks after each (nothing holds it back while the test is not reading:
  // on a loaded machine those checks can take a second).
  constexpr int kTokens = 320;
  const Answer want = Generate(*t.stub, Request(kTokens));
  ASSERT_TRUE(want.status.ok()) << want.status.error_message();
  ASSERT_EQ(want.tokens.size(), (size_t)kTokens);

  for (int moves : {1, 2}) {
    SCOPED_TRACE(std::to_string(moves) + " moves");
    OpenStream stream(*t.stub, Request(kTokens), 0);
    for (int move = 0; move < moves; ++move) {
      // Some tokens in, the stream moves to the other decode worker.
      stream.ReadUntil(10u * (move + 1));
      const Proc& busy = t.Busy();
      const Proc& other = &busy == &t.d1 ? t.d2 : t.d1;
      ASSERT_EQ(MigrateStreams(t.router.address, WorkerId(*t.stub, busy.address)), 1);
      // The source lets go: its blocks all come back; the target decodes.
      ExpectAllBlocksFree(busy.address, "the decode worker moved from");
      const auto end = Clock::now() + std::chrono::seconds(10);
      while (Load(other.address).active_sequences() != 1 && Clock::now() < end) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      EXPECT_EQ(Load(other.address).active_sequences(), 1);
    }
    const Answer got = stream.Finish();
    ASSERT_TRUE(got.status.ok()) << got.status.error_message();
    EXPECT_EQ(got.tokens, want.tokens);
    EXPECT_EQ(got.summary.output_tokens(), kTokens);
    EXPECT_EQ(got.summary.prompt_tokens(), want.summary.prompt_tokens());
    EXPECT_EQ(got.summary.finish_reason(), want.summary.finish_reason());
    ExpectAllBlocksFree(t.d1.address, "decode worker 1");
    ExpectAllBlocksFree(t.d2.address, "decode worker 2");
  }
  EXPECT_EQ(Metric(t.router.metrics, "pdq_migrations_total{outcome=\"moved\"}"), 3);
}

TEST_F(MigrationTest, AMovedFp16StreamAnswersTokenForTokenAsAnUnmovedOne) {
  ExpectMigratedEqualsUnmigrated("fp16", "fp16");
}

TEST_F(MigrationTest, AMovedW8a8W4a16StreamAnswersTokenForTokenAsAnUnmovedOne) {
  ExpectMigratedEqualsUnmigrated("w8a8", "w4a16");
}

// Sampled (temperature, top-p, seed) the moved stream continues the same
// random sequence: the target picks up the sampler where the source was.
TEST_F(MigrationTest, AMovedSampledStreamContinuesItsRandomSequence) {
  Cluster c;
  TwoDecoders t;
  ASSERT_TRUE(t.Start(c, "fp16", "fp16"));
  v1::GenerateRequest r = Request(96);
  r.mutable_sampling()->set_temperature(0.9f);
  r.mutable_sampling()->set_top_p(0.95f);
  r.mutable_sampling()->set_seed(1234);
  const Answer want = Generate(*t.stub, r);
  ASSERT_TRUE(want.status.ok()) << want.status.error_message();
  OpenStream stream(*t.stub, r, 30);
  ASSERT_EQ(MigrateStreams(t.router.address, WorkerId(*t.stub, t.Busy().address)), 1);
  const Answer got = stream.Finish();
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_EQ(got.text, want.text);
}

// Moving a stream takes the key the router gave it: a caller that only
// knows (or guesses) the request id cannot suspend the stream or have its
// KV sent anywhere, and the stream goes on untouched.
TEST_F(MigrationTest, MovingAStreamWithoutItsKeyIsRefused) {
  Cluster c;
  const Split s = StartSplit(c);
  ASSERT_TRUE(s.ok());
  const Answer want = Generate(*s.stub, Request(80));
  ASSERT_TRUE(want.status.ok());
  v1::GenerateRequest r = Request(80);
  r.set_request_id("key-test");
  OpenStream stream(*s.stub, r, 5);
  auto worker = v1::DecodeWorker::NewStub(
      grpc::CreateChannel(s.decode.address, grpc::InsecureChannelCredentials()));
  for (const std::string& key : {std::string(), std::string(16, 'x')}) {
    grpc::ClientContext ctx;
    v1::SuspendRequest q;
    q.set_request_id("key-test");
    q.set_stream_key(key);
    v1::SuspendResponse a;
    EXPECT_EQ(worker->Suspend(&ctx, q, &a).error_code(), grpc::StatusCode::PERMISSION_DENIED);
    grpc::ClientContext ctx2;
    v1::SendKvRequest k;
    k.set_request_id("key-test");
    k.set_stream_key(key);
    k.set_kv_transport("tcp");
    k.set_kv_address("127.0.0.1:1");
    v1::SendKvResponse b;
    EXPECT_EQ(worker->SendKv(&ctx2, k, &b).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  }
  const Answer got = stream.Finish();
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_EQ(got.tokens, want.tokens);
  ExpectRecovered(s);
}

// With no other decode worker the stream stays and finishes where it is.
TEST_F(MigrationTest, AStreamWithNowhereToGoDecodesOnWhereItIs) {
  Cluster c;
  const Split s = StartSplit(c);
  ASSERT_TRUE(s.ok());
  const Answer want = Generate(*s.stub, Request(120));
  ASSERT_TRUE(want.status.ok());
  OpenStream stream(*s.stub, Request(120), 10);
  EXPECT_EQ(MigrateStreams(s.router.address, WorkerId(*s.stub, s.decode.address)), 1);
  const Answer got = stream.Finish();
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_EQ(Metric(s.router.metrics, "pdq_migrations_total{outcome=\"stayed\"}"), 1);
  ExpectRecovered(s);
}

// The target dies while the move is under way (stopped, then killed, after
// the router picked it): the stream decodes on at the source, whole.
TEST_F(MigrationTest, ATargetThatDiesMidMoveLeavesTheStreamWhereItWas) {
  Cluster c;
  TwoDecoders t;
  ASSERT_TRUE(t.Start(c, "fp16", "fp16"));
  const Answer want = Generate(*t.stub, Request(120));
  ASSERT_TRUE(want.status.ok());
  OpenStream stream(*t.stub, Request(120), 10);
  const Proc& busy = t.Busy();
  const Proc& target = &busy == &t.d1 ? t.d2 : t.d1;
  ASSERT_EQ(::kill(target.pid, SIGSTOP), 0);  // its Reserve hangs...
  EXPECT_EQ(MigrateStreams(t.router.address, WorkerId(*t.stub, busy.address)), 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  c.Kill(target);  // ...and fails
  const Answer got = stream.Finish();
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_EQ(Metric(t.router.metrics, "pdq_migrations_total{outcome=\"stayed\"}"), 1);
  ExpectAllBlocksFree(busy.address, "the decode worker that kept the stream");
  ExpectAllBlocksFree(t.prefill.address, "the prefill worker");
}

// SIGTERM of a decode worker under load, with a drain far shorter than
// its streams: its streams move to the other decode worker and every one
// completes whole; the worker exits at once, cleanly.
TEST_F(MigrationTest, SigtermOfADecodeWorkerUnderLoadEndsNoStream) {
  Cluster c;
  TwoDecoders t;
  ASSERT_TRUE(t.Start(c, "fp16", "fp16", {"--drain-seconds", "20"}));
  constexpr int kStreams = 4, kTokens = 200;
  // All decoding, some on each worker.
  std::vector<std::unique_ptr<OpenStream>> streams;
  for (int i = 0; i < kStreams; ++i) {
    streams.push_back(std::make_unique<OpenStream>(*t.stub, Request(kTokens), 1));
  }
  const Proc& victim =
      Load(t.d1.address).active_sequences() >= Load(t.d2.address).active_sequences() ? t.d1
                                                                                     : t.d2;
  const Proc& other = &victim == &t.d1 ? t.d2 : t.d1;
  ASSERT_GT(Load(victim.address).active_sequences(), 0);
  const auto term = Clock::now();
  ASSERT_EQ(::kill(victim.pid, SIGTERM), 0);
  // It exits once its streams moved: well within its 20 s drain.
  int status = -1;
  while (waitpid(victim.pid, &status, WNOHANG) == 0 &&
         Clock::now() - term < std::chrono::seconds(30)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const double exit_s = std::chrono::duration<double>(Clock::now() - term).count();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  EXPECT_LT(exit_s, 15.0) << "the drain waited for the streams instead of moving them";
  for (auto& s : streams) {
    const Answer a = s->Finish();
    EXPECT_TRUE(a.status.ok()) << a.status.error_message();
    EXPECT_EQ((int)a.tokens.size(), kTokens);
    EXPECT_EQ(a.summary.output_tokens(), kTokens);
  }
  EXPECT_GE(Metric(t.router.metrics, "pdq_migrations_total{outcome=\"moved\"}"), 1);
  ExpectAllBlocksFree(other.address, "the decode worker left");
  ExpectAllBlocksFree(t.prefill.address, "the prefill worker");
}

}  // namespace
}  // namespace pdq::testing
