// A server stream of pdq.v1.GenerateResponse, shared by the decode worker and
// the router: one outstanding write at a time (the next starts from
// OnWriteDone), deltas queued behind a write coalesce into one message,
// Finish happens once however cancellation and the writer race, and the
// reactor deletes itself in OnDone while the producer keeps a handle that
// outlives it. The methods it serves are raw (server/grpc_util.h): each
// message is serialized as it is written.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "pdq/v1/pdq.pb.h"

namespace pdq::server {

class ResponseStream {
 public:
  using Reactor = grpc::ServerWriteReactor<grpc::ByteBuffer>;
  // A reactor to return from the handler, and the producer's handle to it.
  // `on_change` runs (on a gRPC thread, must not block) when the client
  // cancels or takes a message.
  static std::pair<Reactor*, std::shared_ptr<ResponseStream>> Create(
      std::function<void()> on_change);

  // Queues token ids and text; merged into a queued delta when one waits.
  void SendDelta(const std::vector<int32_t>& ids, const std::string& text);
  void Send(pdq::v1::GenerateResponse message);
  // Ends the stream after what is queued (an error status drops the queue).
  // Later calls do nothing.
  void Finish(const grpc::Status& status);

  // Tokens queued or in flight, not yet taken by the client.
  int64_t unsent_tokens() const { return unsent_.load(); }
  // The client cancelled, the deadline passed or a write failed.
  bool cancelled() const { return cancelled_.load(); }

 private:
  class Impl;
  friend class Impl;
  void Pump(std::unique_lock<std::mutex>& lock);

  std::mutex mu_;
  Impl* reactor_ = nullptr;  // null after OnDone
  std::deque<pdq::v1::GenerateResponse> queue_;
  grpc::ByteBuffer in_flight_;
  int64_t in_flight_tokens_ = 0;
  bool writing_ = false;
  bool finish_requested_ = false;
  bool finished_ = false;
  grpc::Status final_;
  std::function<void()> on_change_;
  std::atomic<int64_t> unsent_{0};
  std::atomic<bool> cancelled_{false};
};

}  // namespace pdq::server
