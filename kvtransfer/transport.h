// Moving one request's KV cache from the prefill worker that computed it to
// the decode worker that continues it: the Transport interface every backend
// implements, and the registry that creates one by name. KV bytes go from
// cache memory to cache memory; gRPC carries only control.
//
// The life of one transfer (../shared/DESIGN-serving.md, "KV transfer"):
//   receiver  Expect(spec): where each layer lands, the one-time token
//   sender    Connect(address, token): handshake (layouts compared, token
//             checked), then PostLayer per layer as the prefill writes it,
//             then PostDone with the "KV is complete" notice
//   receiver  spec.done(OK, notice) only after every byte landed and the
//             checksum of what arrived matches the sender's
// Destroying either handle aborts what is in flight; once the destructor
// returns, the transport no longer touches that request's KV memory, so the
// caller may free its blocks.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/kv_cache.h"
#include "engine/kv_layout.h"

namespace pdq::kvtransfer {

// Rides after the last layer.
struct KvNotice {
  int32_t first_token = -1;  // sampled by the prefill
  int64_t tokens = 0;        // prompt tokens whose K/V were sent
  uint64_t checksum = 0;     // Hash64Lanes chained over every span in send order
};

struct TransportOptions {
  // Where this side accepts transfers: "host:port"; port 0 picks a free one.
  std::string listen_address = "127.0.0.1:0";
  KvLayout layout;                // what this side's KV bytes mean
  std::vector<KvRegion> regions;  // the cache's memory (KvCache::MemoryRegions)
  // A peer that sends nothing for this long (handshake included) is dropped.
  absl::Duration io_timeout = absl::Seconds(30);
  // Connections beyond this are closed at once.
  int max_connections = 256;
};

struct InboundSpec {
  std::string token;                        // the sender must present it; one use
  int64_t tokens = 0;                       // prompt tokens the sender will send
  std::vector<std::vector<KvSpan>> layers;  // where each layer lands (KvCache::LayerSpans)
  // Called once, on a transport thread, unless the handle is destroyed
  // first: OK with the notice once every byte landed and the checksum
  // matched; otherwise why not (FailedPrecondition: the layouts differ;
  // DataLoss: checksum or sizes; Unavailable: the sender disconnected;
  // DeadlineExceeded: the sender stalled).
  std::function<void(absl::Status, const KvNotice&)> done;
  // Called once, on a transport thread, when a sender presented the token
  // and the layouts matched, before any layer (optional).
  std::function<void()> connected;
  // A sender connects when its prompt is queued, so its first layer may
  // come long after the handshake: until this time the receiver waits for
  // it without the I/O timeout (which applies again from the first layer
  // on). The default, the infinite past, leaves only the I/O timeout.
  absl::Time first_layer_deadline = absl::InfinitePast();
};

// One request's incoming KV. Destroying it aborts the transfer.
class Inbound {
 public:
  virtual ~Inbound() = default;
};

// One request's outgoing KV. Not thread-safe: one caller (the prefill
// scheduler) posts. Destroying it aborts the transfer.
class Outbound {
 public:
  virtual ~Outbound() = default;
  // Queues one layer's spans (KvCache::LayerSpans, in that order). Never
  // blocks on the network; the spans must stay unchanged until the transfer
  // completes or the handle is destroyed.
  virtual void PostLayer(int layer, std::vector<KvSpan> spans) = 0;
  // Queues the notice after every layer; the transfer completes when the
  // receiver has verified and acknowledged it.
  virtual void PostDone(const KvNotice& notice) = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual std::string name() const = 0;
  // Where senders reach this side ("host:port"), with the port resolved.
  virtual std::string address() const = 0;

  // Receiving side. Safe for concurrent use. InvalidArgument for a spec
  // with no token, no layers or a token already expected.
  virtual absl::StatusOr<std::unique_ptr<Inbound>> Expect(InboundSpec spec) = 0;

  // Sending side. Safe for concurrent use. Returns at once; the connection
  // and handshake run on a transport thread while the caller computes.
  // `done` is called once, on a transport thread, unless the handle is
  // destroyed first: OK once the receiver acknowledged the notice, else why
  // not (Unavailable: unreachable or disconnected; FailedPrecondition: the
  // layouts differ, naming the field; PermissionDenied: the receiver does
  // not expect this token; DataLoss; DeadlineExceeded).
  virtual std::unique_ptr<Outbound> Connect(const std::string& address, const std::string& token,
                                            absl::Time deadline,
                                            std::function<void(absl::Status)> done) = 0;
};

// Creates the backend called `name` ("tcp", "ucx"); InvalidArgument naming
// the known ones for any other name.
absl::StatusOr<std::unique_ptr<Transport>> CreateTransport(const std::string& name,
                                                           const TransportOptions& options);
std::vector<std::string> TransportNames();

// Hash64Lanes chained over the spans, as senders and receivers compute it.
uint64_t ChecksumSpans(const std::vector<KvRegion>& regions, const std::vector<KvSpan>& spans,
                       uint64_t seed);

}  // namespace pdq::kvtransfer
