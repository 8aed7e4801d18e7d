#include "kvtransfer/wire.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace pdq::kvtransfer::wire {

std::string EncodeHello(std::string_view magic, const KvLayout& layout, std::string_view token) {
  std::string hello(magic.substr(0, kMagicBytes));
  hello.resize(kMagicBytes, '\0');
  hello.append(reinterpret_cast<const char*>(&kVersion), 4);
  hello += layout.Serialize();
  const uint32_t token_bytes = (uint32_t)token.size();
  hello.append(reinterpret_cast<const char*>(&token_bytes), 4);
  hello += token;
  return hello;
}

absl::StatusOr<Hello> ParseHello(std::string_view magic, const char* backend, const char* bytes,
                                 const KvLayout& mine) {
  uint32_t version;
  Hello hello;
  std::memcpy(&version, bytes + kMagicBytes, 4);
  std::memcpy(&hello.token_bytes, bytes + kMagicBytes + 4 + KvLayout::kSerializedBytes, 4);
  if (std::string_view(bytes, kMagicBytes) != magic || version != kVersion ||
      hello.token_bytes == 0 || hello.token_bytes > kMaxToken) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a pdq KV transfer (", backend, ", version ", kVersion, ")"));
  }
  absl::StatusOr<KvLayout> theirs =
      KvLayout::Deserialize(std::string_view(bytes + kMagicBytes + 4, KvLayout::kSerializedBytes));
  hello.layout = theirs.ok() ? CheckKvCompatible(mine, *theirs) : theirs.status();
  return hello;
}

std::string EncodeStatus(const absl::Status& status) {
  const absl::string_view message = status.message().substr(0, kMaxMessage);
  const uint32_t head[2] = {(uint32_t)status.code(), (uint32_t)message.size()};
  std::string bytes(reinterpret_cast<const char*>(head), sizeof head);
  bytes.append(message.data(), message.size());
  return bytes;
}

absl::StatusOr<uint32_t> StatusMessageBytes(const char* head) {
  uint32_t h[2];
  std::memcpy(h, head, sizeof h);
  if (h[0] > (uint32_t)absl::StatusCode::kUnauthenticated || h[1] > kMaxMessage) {
    return absl::DataLossError("malformed reply from the KV peer");
  }
  return h[1];
}

absl::Status DecodeStatus(const char* head, std::string message) {
  uint32_t code;
  std::memcpy(&code, head, 4);
  return absl::Status((absl::StatusCode)code, message);
}

absl::Status ValidateInboundSpec(const InboundSpec& spec, const TransportOptions& options) {
  if (spec.token.empty() || spec.token.size() > kMaxToken) {
    return absl::InvalidArgumentError(
        absl::StrCat("a KV transfer token must have 1 to ", kMaxToken, " bytes"));
  }
  if ((int)spec.layers.size() != options.layout.num_layers || spec.tokens <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("a KV transfer needs spans for all ",
                                                   options.layout.num_layers,
                                                   " layers and at least one token"));
  }
  for (const auto& layer : spec.layers) {
    for (const KvSpan& s : layer) {
      if (s.region < 0 || s.region >= (int)options.regions.size() || s.offset < 0 || s.bytes < 0 ||
          s.offset + s.bytes > options.regions[s.region].bytes) {
        return absl::InvalidArgumentError("a KV span lies outside the registered regions");
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<const std::vector<KvSpan>*> FrameChecker::BeginLayer(const Frame& frame) const {
  if (frame.layer < 0 || frame.layer >= (int)spec_.layers.size() || landed_[frame.layer]) {
    return absl::DataLossError(absl::StrCat("KV layer ", frame.layer, " unexpected"));
  }
  const std::vector<KvSpan>& spans = spec_.layers[frame.layer];
  int64_t bytes = 0;
  for (const KvSpan& s : spans) bytes += s.bytes;
  if (frame.count != bytes) {
    return absl::DataLossError(absl::StrCat("KV layer ", frame.layer, " has ", frame.count,
                                            " bytes; ", bytes, " expected"));
  }
  return &spans;
}

void FrameChecker::Landed(int layer) {
  checksum_ = ChecksumSpans(regions_, spec_.layers[layer], checksum_);
  landed_[layer] = true;
}

absl::StatusOr<KvNotice> FrameChecker::Done(const Frame& frame) const {
  for (size_t l = 0; l < landed_.size(); ++l) {
    if (!landed_[l])
      return absl::DataLossError(absl::StrCat("KV done before layer ", l, " arrived"));
  }
  if (frame.count != spec_.tokens) {
    return absl::DataLossError(absl::StrCat("the sender sent ", frame.count, " tokens of KV; ",
                                            spec_.tokens, " expected"));
  }
  if (frame.checksum != checksum_) return absl::DataLossError("KV checksum mismatch");
  return KvNotice{frame.first_token, frame.count, checksum_};
}

Frame FrameMaker::Layer(int layer, const std::vector<KvSpan>& spans) {
  Frame f;
  f.type = kLayerFrame;
  f.layer = layer;
  for (const KvSpan& s : spans) f.count += s.bytes;
  checksum_ = ChecksumSpans(regions_, spans, checksum_);
  return f;
}

Frame FrameMaker::Done(const KvNotice& notice) const {
  Frame f;
  f.type = kDoneFrame;
  f.count = notice.tokens;
  f.checksum = checksum_;
  f.first_token = notice.first_token;
  return f;
}

}  // namespace pdq::kvtransfer::wire
