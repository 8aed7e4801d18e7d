// The byte format of the stream-based KV transports (TCP sockets, UCX
// streams) and the checks both sides make on it, so that every backend
// refuses the same things with the same messages.
//
// Little-endian, after the connection is up:
//   sender   hello: 8-byte magic naming the backend, u32 version, KvLayout
//            (40 bytes), u32 token length, token
//   receiver status: u32 code, u32 message length, message
//   sender   frames of 32 bytes (Frame); a layer frame (count = bytes) is
//            followed by the layer's spans, in KvCache::LayerSpans order; the
//            done frame carries the notice and the chained checksum
//   receiver status, the answer to the done frame
#pragma once

#include <bit>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "kvtransfer/transport.h"

namespace pdq::kvtransfer::wire {

static_assert(std::endian::native == std::endian::little, "the wire format is little-endian");

constexpr uint32_t kVersion = 1;
constexpr size_t kMagicBytes = 8;
constexpr size_t kHelloBytes = kMagicBytes + 4 + KvLayout::kSerializedBytes + 4;
constexpr uint32_t kMaxToken = 256;
constexpr uint32_t kMaxMessage = 4096;
constexpr size_t kStatusHeadBytes = 8;

enum FrameType : uint32_t { kLayerFrame = 1, kDoneFrame = 2 };
struct Frame {
  uint32_t type = 0;
  int32_t layer = 0;
  int64_t count = 0;  // a layer's bytes; the notice's tokens
  uint64_t checksum = 0;
  int32_t first_token = -1;
  uint32_t zero = 0;
};
static_assert(sizeof(Frame) == 32);

// What an Outbound's caller posted (PostLayer, PostDone), queued until the
// connection sends it.
struct Posted {
  FrameType type = kLayerFrame;
  int layer = 0;
  std::vector<KvSpan> spans;
  KvNotice notice;
};

// The fixed-size hello followed by the token. `magic` has kMagicBytes.
std::string EncodeHello(std::string_view magic, const KvLayout& layout, std::string_view token);

struct Hello {
  uint32_t token_bytes = 0;  // the token follows the kHelloBytes
  absl::Status layout;       // CheckKvCompatible(mine, the sender's)
};
// Reads the kHelloBytes of a hello. InvalidArgument "not a pdq KV transfer"
// for anything else (the reply to random bytes).
absl::StatusOr<Hello> ParseHello(std::string_view magic, const char* backend, const char* bytes,
                                 const KvLayout& mine);

// A status as the peer reads it: head and message.
std::string EncodeStatus(const absl::Status& status);
// The message bytes that follow a status head; DataLoss for a malformed head.
absl::StatusOr<uint32_t> StatusMessageBytes(const char* head);
absl::Status DecodeStatus(const char* head, std::string message);

// InvalidArgument unless the spec names a token, spans for every layer inside
// `options.regions`, and at least one token.
absl::Status ValidateInboundSpec(const InboundSpec& spec, const TransportOptions& options);

// The receiver's view of one transfer's frames: which layers landed, the
// checksum of what arrived, and whether the done frame matches.
class FrameChecker {
 public:
  FrameChecker(const InboundSpec& spec, const std::vector<KvRegion>& regions)
      : spec_(spec), regions_(regions), landed_(spec.layers.size(), false) {}
  // The spans a layer frame's bytes land in. DataLoss for a layer out of
  // range or sent twice, or a size that is not the layer's.
  absl::StatusOr<const std::vector<KvSpan>*> BeginLayer(const Frame& frame) const;
  // The layer's bytes are in place: chains them into the checksum.
  void Landed(int layer);
  // The notice the done frame carries, once every layer landed and the
  // tokens and checksum match; DataLoss otherwise.
  absl::StatusOr<KvNotice> Done(const Frame& frame) const;

 private:
  const InboundSpec& spec_;
  const std::vector<KvRegion>& regions_;
  std::vector<bool> landed_;
  uint64_t checksum_ = 0;
};

// The sender's frames, chaining the checksum over the spans in send order.
class FrameMaker {
 public:
  explicit FrameMaker(const std::vector<KvRegion>& regions) : regions_(regions) {}
  Frame Layer(int layer, const std::vector<KvSpan>& spans);
  Frame Done(const KvNotice& notice) const;

 private:
  const std::vector<KvRegion>& regions_;
  uint64_t checksum_ = 0;
};

}  // namespace pdq::kvtransfer::wire
