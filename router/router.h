// pdq-router as a library: the public pdq.v1.Pdq service and the Registry
// workers register with. It tokenizes and validates (linking the tokenizer,
// not the kernels), reserves KV on a decode worker, starts the prefill and the
// decode stream together, retries a prefill that failed before any token was
// sent once elsewhere, and relays tokens to the client. A test can start one
// in-process on port 0.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "policy/route.h"
#include "router/admission.h"
#include "server/security.h"

namespace pdq::router {

struct RouterOptions {
  std::string listen = "127.0.0.1:0";
  std::string model;  // GGUF file whose tokenizer and chat template the router uses
  absl::Duration heartbeat_interval = absl::Milliseconds(500);
  // A worker that misses this many heartbeats leaves rotation.
  int missed_heartbeats_allowed = 3;
  // The OpenAI-compatible HTTP API (router/openai_http.h): host:port, port 0
  // picks a free one; empty serves none.
  std::string http_listen;
  int http_max_connections = 128;
  // TLS (server/security.h): the router's certificate and key, and the CA
  // workers' certificates are checked against. All empty: plaintext. With
  // them the public port and the HTTP API use TLS, only workers presenting a
  // certificate may use the Registry, and the router presents its own to
  // the workers.
  server::TlsFiles tls;
  // The name workers' certificates must carry; empty: the host each worker
  // registers with (its pod IP on Kubernetes, which a certificate rarely
  // names).
  std::string worker_tls_name;
  // Keys clients must present on pdq.v1.Pdq and the HTTP API; empty: none.
  std::string api_key_file;
  // A plaintext host:port serving only grpc.health.v1 (for probes that
  // cannot speak TLS); empty: none.
  std::string health_listen;
  // An A/B rollout (policy/traffic_split.h): "POOL=WEIGHT,..." sends that
  // share of requests to the workers started with --pool POOL, and labels
  // the request metrics by pool. Empty: every worker serves every request.
  std::string split;
  // With a split, requests carrying a client_id always go to the same pool.
  bool split_sticky = false;
  // When a decode worker's prefix cache holds part of a prompt and all but
  // at most this many tokens, it prefills them itself and no prefill worker
  // is involved (conditional disaggregation); 0: always a prefill worker.
  int local_prefill_tokens = 256;
  // Cache-aware routing (policy/route.h): how many prompt tokens
  // one request a worker is busy with is worth.
  double cache_load_tokens = policy::kDefaultLoadTokens;
  // Streams the router sends one worker that decodes, at most (admission
  // refuses more with batch_full; routing avoids full workers): 0, each
  // worker's own decode batch (its --max-batch, which it registers with); a
  // positive count; -1, no bound (streams past the batch take turns).
  int max_streams_per_worker = 0;
  // Admission control: bounded waiting, predicted TTFT, rate limits.
  AdmissionOptions admission;
};

class Router {
 public:
  static absl::StatusOr<std::unique_ptr<Router>> Start(const RouterOptions& options);
  // Stops accepting calls; those in flight are cancelled after a grace period.
  virtual ~Router() = default;
  virtual const std::string& address() const = 0;
  // The OpenAI-compatible HTTP API's host:port; empty when not served.
  virtual const std::string& http_address() const = 0;
  // The health-only port's host:port; empty when not served.
  virtual const std::string& health_address() const = 0;
  // Workers in rotation (registered and heartbeating).
  virtual int live_workers() const = 0;
  // Reports NOT_SERVING on grpc.health.v1 (so load balancers stop sending)
  // while still serving, and waits up to `timeout` until no request is in
  // flight. Returns whether that happened in time.
  virtual bool Drain(absl::Duration timeout) = 0;
};

int RouterMain(int argc, char** argv);

}  // namespace pdq::router
