// Every KV transport backend, between two caches in this process over a real
// connection: a prefill's KV sent layer by layer while it computes decodes
// exactly as in place; mismatched layouts, unknown tokens and random bytes are
// refused; aborting either side mid-transfer fails the other, and once a
// handle is destroyed nothing touches its KV memory.
#include "kvtransfer/transport.h"

#include <sys/socket.h>
#include <unistd.h>

#include <condition_variable>
#include <cstring>
#include <mutex>
#include <random>

#include "engine/context.h"
#include "engine/sampler.h"
#include "gtest/gtest.h"
#include "kvtransfer/tcp/socket.h"
#include "tests/test_models.h"

namespace pdq::kvtransfer {
namespace {

using pdq::testing::LoadOrDie;
using pdq::testing::Tokens;
constexpr absl::Duration kWait = absl::Seconds(20);

// absl::Notification on std::mutex: the distribution's Abseil is not built
// with ThreadSanitizer, which then cannot see its synchronisation and reports
// every read of an Outcome as a race.
class Notification {
 public:
  void Notify() {
    {
      std::lock_guard lock(mu_);
      notified_ = true;
    }
    cv_.notify_all();
  }
  bool HasBeenNotified() {
    std::lock_guard lock(mu_);
    return notified_;
  }
  bool WaitForNotificationWithTimeout(absl::Duration timeout) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout), [&] { return notified_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool notified_ = false;
};

// The outcome of one side of a transfer.
struct Outcome {
  Notification done;
  absl::Status status;
  KvNotice notice;
  bool Wait() { return done.WaitForNotificationWithTimeout(kWait); }
};

// One side: a model, a cache and a transport over the cache's memory.
struct Side {
  pdq::testing::TestModel t;
  std::unique_ptr<KvCache> kv;
  std::unique_ptr<Transport> transport;
};

Side MakeSide(const std::string& backend, const std::string& model, int block_tokens = 16,
              absl::Duration io_timeout = absl::Seconds(10), int max_connections = 256) {
  Side s;
  s.t = LoadOrDie(model);
  if (!s.t) return s;
  auto kv = KvCache::Create({s.t->kv_layout(block_tokens), 64});
  EXPECT_TRUE(kv.ok()) << kv.status();
  s.kv = std::move(*kv);
  TransportOptions o;
  o.layout = s.kv->layout();
  o.regions = s.kv->MemoryRegions();
  o.io_timeout = io_timeout;
  o.max_connections = max_connections;
  auto tr = CreateTransport(backend, o);
  EXPECT_TRUE(tr.ok()) << tr.status();
  if (tr.ok()) s.transport = std::move(*tr);
  return s;
}

// Expects `tokens` tokens into a new sequence of `to`.
std::unique_ptr<Inbound> ExpectInto(Side& to, SeqId seq, int64_t tokens, const std::string& token,
                                    Outcome& out) {
  InboundSpec spec;
  spec.token = token;
  spec.tokens = tokens;
  for (int l = 0; l < to.kv->layout().num_layers; ++l) {
    spec.layers.push_back(*to.kv->LayerSpans(seq, l, tokens));
  }
  spec.done = [&out](absl::Status s, const KvNotice& n) {
    out.status = s;
    out.notice = n;
    out.done.Notify();
  };
  auto in = to.transport->Expect(std::move(spec));
  EXPECT_TRUE(in.ok()) << in.status();
  return in.ok() ? std::move(*in) : nullptr;
}

std::function<void(absl::Status)> Record(Outcome& out) {
  return [&out](absl::Status s) {
    out.status = s;
    out.done.Notify();
  };
}

class TransportTest : public ::testing::TestWithParam<std::string> {};

TEST_P(TransportTest, LayersSentDuringThePrefillDecodeAsInPlace) {
  Side from = MakeSide(GetParam(), "synthetic:tiny@w8a8"),
       to = MakeSide(GetParam(), "synthetic:tiny@w4a16");
  ASSERT_TRUE(from.transport && to.transport);
  const int vocab = from.t->config().vocab_size;
  const auto prompt = Tokens(53, vocab, 7);  // four blocks, the last partly filled
  const SeqId src = from.kv->AddSequence();
  ASSERT_TRUE(from.kv->Reserve(src, (int64_t)prompt.size()).ok());
  auto dst = to.kv->ImportSequence(from.kv->layout(), (int64_t)prompt.size() + 8);
  ASSERT_TRUE(dst.ok()) << dst.status();
  Outcome received, sent;
  auto in = ExpectInto(to, *dst, (int64_t)prompt.size(), "tok-1", received);
  auto out =
      from.transport->Connect(to.transport->address(), "tok-1", absl::Now() + kWait, Record(sent));
  int posted = 0;
  from.t.ctx->SetLayerObserver([&](int layer) {
    out->PostLayer(layer, *from.kv->LayerSpans(src, layer, (int64_t)prompt.size()));
    ++posted;
  });
  Logits logits;
  BatchEntry e{src, prompt, 1};
  ASSERT_TRUE(from.t.ctx->ForwardAll(*from.kv, {&e, 1}, &logits).ok());
  from.t.ctx->SetLayerObserver(nullptr);
  EXPECT_EQ(posted, from.kv->layout().num_layers);
  const int32_t first = Argmax(logits.Row(0, 0), vocab);
  out->PostDone({first, (int64_t)prompt.size(), 0});
  ASSERT_TRUE(received.Wait());
  ASSERT_TRUE(received.status.ok()) << received.status;
  in.reset();  // as a decode worker does at once: the sender still hears OK
  ASSERT_TRUE(sent.Wait());
  ASSERT_TRUE(sent.status.ok()) << sent.status;
  EXPECT_EQ(received.notice.first_token, first);
  EXPECT_EQ(received.notice.tokens, (int64_t)prompt.size());
  ASSERT_TRUE(to.kv->SetLength(*dst, (int64_t)prompt.size()).ok());

  // The next step reads the same K/V on both sides: identical logits.
  for (int l = 0; l < from.kv->layout().num_layers; ++l) {
    auto a = *from.kv->ExportLayer(src, l), b = *to.kv->ExportLayer(*dst, l);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_EQ(0, std::memcmp(from.kv->SpanData(a[i]), to.kv->SpanData(b[i]), a[i].bytes))
          << "layer " << l << " span " << i;
    }
  }
  Logits here, there;
  BatchEntry ea{src, {&first, 1}, 1}, eb{*dst, {&first, 1}, 1};
  ASSERT_TRUE(to.t.ctx->ForwardAll(*from.kv, {&ea, 1}, &here).ok());
  ASSERT_TRUE(to.t.ctx->ForwardAll(*to.kv, {&eb, 1}, &there).ok());
  EXPECT_EQ(0, std::memcmp(here.Row(0, 0), there.Row(0, 0), vocab * sizeof(float)));
}

TEST_P(TransportTest, ALayoutMismatchIsRefusedOnBothSidesNamingTheField) {
  Side from = MakeSide(GetParam(), "synthetic:tiny", 16),
       to = MakeSide(GetParam(), "synthetic:tiny", 32);
  ASSERT_TRUE(from.transport && to.transport);
  const SeqId dst = to.kv->AddSequence();
  ASSERT_TRUE(to.kv->Reserve(dst, 20).ok());
  Outcome received, sent;
  auto in = ExpectInto(to, dst, 20, "tok-2", received);
  auto out =
      from.transport->Connect(to.transport->address(), "tok-2", absl::Now() + kWait, Record(sent));
  ASSERT_TRUE(sent.Wait() && received.Wait());
  for (const absl::Status& s : {sent.status, received.status}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_NE(s.message().find("block_tokens"), std::string::npos) << s;
  }
}

TEST_P(TransportTest, AnUnknownTokenIsRefusedAndATokenIsGoodOnce) {
  Side from = MakeSide(GetParam(), "synthetic:tiny"), to = MakeSide(GetParam(), "synthetic:tiny");
  ASSERT_TRUE(from.transport && to.transport);
  Outcome sent;
  auto out =
      from.transport->Connect(to.transport->address(), "nobody", absl::Now() + kWait, Record(sent));
  ASSERT_TRUE(sent.Wait());
  EXPECT_EQ(sent.status.code(), absl::StatusCode::kPermissionDenied) << sent.status;

  const SeqId dst = to.kv->AddSequence(), src = from.kv->AddSequence();
  ASSERT_TRUE(to.kv->Reserve(dst, 4).ok() && from.kv->Reserve(src, 4).ok());
  Outcome received, first, second;
  auto in = ExpectInto(to, dst, 4, "once", received);
  auto a =
      from.transport->Connect(to.transport->address(), "once", absl::Now() + kWait, Record(first));
  for (int l = 0; l < from.kv->layout().num_layers; ++l) {
    a->PostLayer(l, *from.kv->LayerSpans(src, l, 4));
  }
  a->PostDone({1, 4, 0});
  ASSERT_TRUE(first.Wait() && received.Wait());
  ASSERT_TRUE(first.status.ok()) << first.status;
  // The token was used: a second connection with it is refused.
  auto b =
      from.transport->Connect(to.transport->address(), "once", absl::Now() + kWait, Record(second));
  ASSERT_TRUE(second.Wait());
  EXPECT_EQ(second.status.code(), absl::StatusCode::kPermissionDenied) << second.status;
}

TEST_P(TransportTest, RandomBytesAreRefusedAndTheTransportKeepsWorking) {
  Side from = MakeSide(GetParam(), "synthetic:tiny"), to = MakeSide(GetParam(), "synthetic:tiny");
  ASSERT_TRUE(from.transport && to.transport);
  std::mt19937 rng(5);
  for (int round = 0; round < 20; ++round) {
    auto fd = ConnectTo(to.transport->address(), absl::Now() + kWait);
    ASSERT_TRUE(fd.ok()) << fd.status();
    std::string junk(1 + rng() % 300, '\0');
    for (char& c : junk) c = (char)rng();
    if (round % 2 == 0) std::memcpy(junk.data(), "PDQKVTCP", std::min<size_t>(8, junk.size()));
    (void)WriteFull(fd->get(), junk.data(), junk.size(), absl::Now() + kWait);
    shutdown(fd->get(), SHUT_WR);
    char buf[256];
    // The receiver answers or closes; either way the read ends.
    while (read(fd->get(), buf, sizeof buf) > 0) {
    }
  }
  // A real transfer still goes through.
  const SeqId dst = to.kv->AddSequence();
  ASSERT_TRUE(to.kv->Reserve(dst, 4).ok());
  const SeqId src = from.kv->AddSequence();
  ASSERT_TRUE(from.kv->Reserve(src, 4).ok());
  Outcome received, sent;
  auto in = ExpectInto(to, dst, 4, "after-junk", received);
  auto out = from.transport->Connect(to.transport->address(), "after-junk", absl::Now() + kWait,
                                     Record(sent));
  for (int l = 0; l < from.kv->layout().num_layers; ++l)
    out->PostLayer(l, *from.kv->LayerSpans(src, l, 4));
  out->PostDone({1, 4, 0});
  ASSERT_TRUE(sent.Wait() && received.Wait());
  EXPECT_TRUE(sent.status.ok()) << sent.status;
  EXPECT_TRUE(received.status.ok()) << received.status;
}

TEST_P(TransportTest, AbortingTheReceiverMidTransferFailsTheSender) {
  Side from = MakeSide(GetParam(), "synthetic:tiny"), to = MakeSide(GetParam(), "synthetic:tiny");
  ASSERT_TRUE(from.transport && to.transport);
  const SeqId dst = to.kv->AddSequence(), src = from.kv->AddSequence();
  ASSERT_TRUE(to.kv->Reserve(dst, 40).ok() && from.kv->Reserve(src, 40).ok());
  Outcome received, sent;
  auto in = ExpectInto(to, dst, 40, "abort-receiver", received);
  auto out = from.transport->Connect(to.transport->address(), "abort-receiver", absl::Now() + kWait,
                                     Record(sent));
  out->PostLayer(0, *from.kv->LayerSpans(src, 0, 40));
  in.reset();  // the decode side cancelled; its blocks may be reused now
  for (int l = 1; l < from.kv->layout().num_layers; ++l)
    out->PostLayer(l, *from.kv->LayerSpans(src, l, 40));
  out->PostDone({1, 40, 0});
  ASSERT_TRUE(sent.Wait());
  EXPECT_FALSE(sent.status.ok());
  EXPECT_FALSE(received.done.HasBeenNotified());
}

TEST_P(TransportTest, AStalledSenderTimesOut) {
  Side from = MakeSide(GetParam(), "synthetic:tiny"),
       to = MakeSide(GetParam(), "synthetic:tiny", 16, absl::Milliseconds(300));
  ASSERT_TRUE(from.transport && to.transport);
  const SeqId dst = to.kv->AddSequence();
  ASSERT_TRUE(to.kv->Reserve(dst, 8).ok());
  Outcome received, sent;
  auto in = ExpectInto(to, dst, 8, "stall", received);
  auto out =
      from.transport->Connect(to.transport->address(), "stall", absl::Now() + kWait, Record(sent));
  // Nothing is posted: the receiver gives up after its I/O timeout.
  ASSERT_TRUE(received.Wait());
  EXPECT_EQ(received.status.code(), absl::StatusCode::kDeadlineExceeded) << received.status;
}

// A prefill worker connects when it queues a prompt, so its first layer may
// come long after the handshake: the receiver is told the sender connected
// and, until the spec's first_layer_deadline, waits past its I/O timeout.
TEST_P(TransportTest, AQueuedSenderMayWaitPastTheIoTimeoutBeforeItsFirstLayer) {
  Side from = MakeSide(GetParam(), "synthetic:tiny"),
       to = MakeSide(GetParam(), "synthetic:tiny", 16, absl::Milliseconds(300));
  ASSERT_TRUE(from.transport && to.transport);
  const SeqId src = from.kv->AddSequence(), dst = to.kv->AddSequence();
  ASSERT_TRUE(from.kv->Reserve(src, 8).ok() && to.kv->Reserve(dst, 8).ok());
  Outcome received, sent;
  Notification connected;
  InboundSpec spec;
  spec.token = "queued";
  spec.tokens = 8;
  for (int l = 0; l < to.kv->layout().num_layers; ++l) {
    spec.layers.push_back(*to.kv->LayerSpans(dst, l, 8));
  }
  spec.done = [&received](absl::Status s, const KvNotice& n) {
    received.status = s;
    received.notice = n;
    received.done.Notify();
  };
  spec.connected = [&connected] { connected.Notify(); };
  spec.first_layer_deadline = absl::Now() + kWait;
  absl::StatusOr<std::unique_ptr<Inbound>> in = to.transport->Expect(std::move(spec));
  ASSERT_TRUE(in.ok()) << in.status();
  auto out =
      from.transport->Connect(to.transport->address(), "queued", absl::Now() + kWait, Record(sent));
  ASSERT_TRUE(connected.WaitForNotificationWithTimeout(kWait));
  absl::SleepFor(absl::Milliseconds(1000));  // three I/O timeouts: the prompt is queued
  EXPECT_FALSE(received.done.HasBeenNotified()) << received.status;
  for (int l = 0; l < from.kv->layout().num_layers; ++l) {
    out->PostLayer(l, *from.kv->LayerSpans(src, l, 8));
  }
  out->PostDone({7, 8, 0});
  ASSERT_TRUE(received.Wait());
  EXPECT_TRUE(received.status.ok()) << received.status;
  EXPECT_EQ(received.notice.first_token, 7);
  ASSERT_TRUE(sent.Wait());
  EXPECT_TRUE(sent.status.ok()) << sent.status;
}

TEST_P(TransportTest, ConnectionsBeyondTheLimitAreRefused) {
  Side from = MakeSide(GetParam(), "synthetic:tiny"),
       to = MakeSide(GetParam(), "synthetic:tiny", 16, absl::Seconds(10), 0);
  ASSERT_TRUE(from.transport && to.transport);
  const SeqId dst = to.kv->AddSequence();
  ASSERT_TRUE(to.kv->Reserve(dst, 4).ok());
  Outcome received, sent;
  auto in = ExpectInto(to, dst, 4, "full", received);
  auto out =
      from.transport->Connect(to.transport->address(), "full", absl::Now() + kWait, Record(sent));
  ASSERT_TRUE(sent.Wait());
  EXPECT_EQ(sent.status.code(), absl::StatusCode::kUnavailable) << sent.status;
  EXPECT_FALSE(received.done.HasBeenNotified());
}

INSTANTIATE_TEST_SUITE_P(Backends, TransportTest, ::testing::ValuesIn(TransportNames()),
                         [](const auto& info) { return info.param; });

// A sender that dies after half a layer (the process killed): the receiver
// reports the peer gone. Written against the TCP wire format so the death
// lands mid-layer for certain.
TEST(TcpTransportTest, ASenderDyingMidLayerFailsTheReceiver) {
  Side to = MakeSide("tcp", "synthetic:tiny");
  ASSERT_TRUE(to.transport);
  const SeqId dst = to.kv->AddSequence();
  ASSERT_TRUE(to.kv->Reserve(dst, 40).ok());
  Outcome received;
  auto in = ExpectInto(to, dst, 40, "dies", received);
  auto fd = ConnectTo(to.transport->address(), absl::Now() + kWait);
  ASSERT_TRUE(fd.ok()) << fd.status();
  std::string hello = "PDQKVTCP";
  const uint32_t version = 1, token_len = 4;
  hello.append(reinterpret_cast<const char*>(&version), 4);
  hello += to.kv->layout().Serialize();
  hello.append(reinterpret_cast<const char*>(&token_len), 4);
  hello += "dies";
  ASSERT_TRUE(WriteFull(fd->get(), hello.data(), hello.size(), absl::Now() + kWait).ok());
  uint32_t reply[2];
  ASSERT_TRUE(ReadFull(fd->get(), reply, sizeof reply, absl::Now() + kWait).ok());
  ASSERT_EQ(reply[0], 0u);
  int64_t layer_bytes = 0;
  const std::vector<KvSpan> layer0 = *to.kv->LayerSpans(dst, 0, 40);
  for (const KvSpan& s : layer0) layer_bytes += s.bytes;
  struct {
    uint32_t type = 1;
    int32_t layer = 0;
    int64_t count;
    uint64_t checksum = 0;
    int32_t first_token = 0;
    uint32_t zero = 0;
  } frame;
  frame.count = layer_bytes;
  std::string half(layer_bytes / 2, '\x5a');
  ASSERT_TRUE(WriteFull(fd->get(), &frame, sizeof frame, absl::Now() + kWait).ok());
  ASSERT_TRUE(WriteFull(fd->get(), half.data(), half.size(), absl::Now() + kWait).ok());
  fd->Reset();
  ASSERT_TRUE(received.Wait());
  EXPECT_EQ(received.status.code(), absl::StatusCode::kUnavailable) << received.status;
}

TEST(TransportRegistryTest, UnknownNamesListTheKnownOnes) {
  TransportOptions o;
  auto t = CreateTransport("carrier-pigeon", o);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find("tcp"), std::string::npos) << t.status();
}

// The checksum a receiver verifies: any flipped byte of any span, at any
// offset (lanes, tail), changes it, and so does the order of the spans.
TEST(ChecksumTest, AnyFlippedByteOrSwappedSpanChangesIt) {
  std::vector<std::byte> memory(1000);
  for (size_t i = 0; i < memory.size(); ++i) memory[i] = std::byte(i * 7 + 3);
  const std::vector<KvRegion> regions = {{memory.data(), (int64_t)memory.size()}};
  const std::vector<KvSpan> spans = {{0, 0, 517}, {0, 600, 77}};
  const uint64_t sum = ChecksumSpans(regions, spans, 1);
  EXPECT_EQ(ChecksumSpans(regions, spans, 1), sum);
  EXPECT_NE(ChecksumSpans(regions, spans, 2), sum);
  EXPECT_NE(ChecksumSpans(regions, {spans[1], spans[0]}, 1), sum);
  for (const KvSpan& sp : spans) {
    for (int64_t at = sp.offset; at < sp.offset + sp.bytes; ++at) {
      memory[at] ^= std::byte(0x10);
      EXPECT_NE(ChecksumSpans(regions, spans, 1), sum) << "byte " << at;
      memory[at] ^= std::byte(0x10);
    }
  }
}

}  // namespace
}  // namespace pdq::kvtransfer
