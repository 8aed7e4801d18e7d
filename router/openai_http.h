// The router's OpenAI-compatible HTTP API: POST /v1/completions and
// /v1/chat/completions (Server-Sent Events when "stream" is true, with the
// usage block), GET /v1/models, errors in OpenAI's shape and HTTP status.
// Each request is translated to pdq.v1 and served by the router's own Pdq
// service over an in-process channel, so validation, retries, cancellation,
// metrics and request-id logs are exactly the gRPC API's.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace pdq::router {

struct OpenAiHttpOptions {
  std::string listen;  // host:port; port 0 picks a free one
  // HTTPS with this PEM certificate chain and key; empty: HTTP. Requests
  // carry their API key as "Authorization: Bearer KEY", checked by the Pdq
  // service they are sent to.
  std::string tls_cert_path, tls_key_path;
  // The id clients name the model by (GET /v1/models); the name the workers
  // report is accepted too. Empty: that name.
  std::string model_id;
  // Connections served at once (one thread each); more wait in the accept
  // queue.
  int max_connections = 128;
  // A chat request without max_tokens gets the rest of the context, at most
  // this (the decode worker reserves KV for prompt + max_tokens up front).
  int default_chat_max_tokens = 1024;
  // The deadline of each generation.
  absl::Duration request_timeout = absl::Minutes(10);
  // While a streamed answer waits for its first token (the prefill), an SSE
  // comment goes out this often, so a client that left is noticed and its
  // request cancelled.
  absl::Duration keepalive = absl::Seconds(1);
};

class OpenAiHttpServer {
 public:
  virtual ~OpenAiHttpServer() = default;
  virtual const std::string& address() const = 0;  // host:port, the port resolved
};

// Serves the API on options.listen, sending every request to `pdq` (a
// channel to a pdq.v1.Pdq service).
absl::StatusOr<std::unique_ptr<OpenAiHttpServer>> ServeOpenAiHttp(
    const OpenAiHttpOptions& options, std::shared_ptr<grpc::Channel> pdq);

}  // namespace pdq::router
