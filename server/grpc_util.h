// Small conversions at the gRPC boundary: statuses (codes map one to one),
// deadlines, and messages of the methods served raw.
//
// The public methods take their request as bytes and parse it here, because
// gRPC answers a request that protobuf refuses (a string field that is not
// UTF-8, say) with a bare UNIMPLEMENTED; parsed here, the client learns
// what is wrong.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "google/protobuf/message.h"

namespace pdq::server {

inline grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

inline absl::Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

// The call's deadline; InfiniteFuture when it has none.
inline absl::Time DeadlineOf(const grpc::ServerContextBase& ctx) {
  const auto d = ctx.deadline();
  if (d >= std::chrono::system_clock::time_point::max() - std::chrono::hours(24 * 365)) {
    return absl::InfiniteFuture();
  }
  return absl::FromChrono(d);
}

// The trailers the router sends with a refusal (RESOURCE_EXHAUSTED): its
// reason (router/admission.h RefusalName: "kv_full", ...) and when to try
// again, in milliseconds.
inline constexpr char kRefusalTrailer[] = "pdq-refusal";
inline constexpr char kRetryAfterTrailer[] = "retry-after-ms";

// The trailer `key` the server sent with a call's end; empty when none.
inline std::string Trailer(const grpc::ClientContext& ctx, std::string_view key) {
  const auto& trailers = ctx.GetServerTrailingMetadata();
  auto it = trailers.find(grpc::string_ref(key.data(), key.size()));
  return it == trailers.end() ? "" : std::string(it->second.data(), it->second.size());
}

// Parses a raw request into `out`; INVALID_ARGUMENT naming the type when
// it is not one.
grpc::Status ParseRequest(const grpc::ByteBuffer& in, google::protobuf::Message* out);
// Serializes a message for a raw method.
grpc::ByteBuffer ToByteBuffer(const google::protobuf::Message& m);

}  // namespace pdq::server
