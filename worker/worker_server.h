// A worker process as a library: the DecodeWorker and PrefillWorker gRPC
// services over a Scheduler, health and reflection, and registration with a
// router (heartbeats carry the load). `pdq-prefill` and `pdq-decode` are thin
// mains over WorkerMain; a test can start one in-process on port 0.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "pdq/v1/worker.grpc.pb.h"
#include "server/security.h"
#include "server/server.h"
#include "worker/scheduler.h"

namespace pdq::worker {

struct WorkerServerOptions {
  std::string listen = "127.0.0.1:0";  // gRPC
  // The routers to register with (worker/router_targets.h: a comma-separated
  // list of host:port and dns:///NAME:PORT); empty: do not register.
  std::string router;
  // The host the router and peers should use for this worker; empty: the
  // host of `listen`.
  std::string advertise_host;
  std::string worker_id;  // empty: generated
  Role role = Role::kBoth;
  pdq::v1::Precision precision = pdq::v1::PRECISION_FP16;
  std::string model_name;
  int vocab_size = 0;
  int max_context = 0;
  std::string metrics_address;  // host:port of /metrics, as peers reach it
  // Mutual TLS (server/security.h): callers must present a certificate
  // signed by tls->ca, and this worker presents tls->cert to the router,
  // whose certificate must name `router_tls_name` (empty: the host of
  // `router`). nullopt: plaintext.
  std::optional<server::TlsPem> tls;
  std::string router_tls_name;
  // A plaintext host:port serving only grpc.health.v1; empty: none.
  std::string health_listen;
  // The pool this worker joins (policy/traffic_split.h); its request
  // metrics carry it as a label. Empty: none.
  std::string pool;
  // On Drain, a decode worker asks its routers to move its streams to other
  // decode workers (live migration) rather than finish them here.
  bool migrate_on_drain = true;
};

class WorkerServer {
 public:
  // `scheduler` and `transport` (null for role both) must outlive it.
  static absl::StatusOr<std::unique_ptr<WorkerServer>> Start(const WorkerServerOptions& options,
                                                             Scheduler* scheduler,
                                                             kvtransfer::Transport* transport);
  // Leaves rotation (deregisters from the routers, asking them to move its
  // streams elsewhere when options.migrate_on_drain; health NOT_SERVING) and
  // waits up to `timeout` until this worker holds no request: nothing queued
  // and every KV block free, so the streams it serves finish and the
  // reservations it holds are used. Returns whether it drained in time.
  bool Drain(absl::Duration timeout);
  // Deregisters, stops accepting calls, cancels those in flight and waits.
  ~WorkerServer();
  const std::string& address() const { return address_; }
  const std::string& health_address() const { return grpc_.health_address; }

 private:
  class DecodeService;
  class PrefillService;
  WorkerServer() = default;
  // Keeps one RegisterWith loop per router (looking dns:/// names up again).
  void RegistrationLoop();
  // Registers with one router and heartbeats until stopping_ or `gone`,
  // then deregisters.
  void RegisterWith(const std::string& address, const std::string& tls_name,
                    const std::atomic<bool>& gone);
  void StopRegistration();
  // Publishes the scheduler's load as /metrics gauges (cleared on destruction).
  void ExportLoad();
  pdq::v1::WorkerInfo Info() const;

  WorkerServerOptions options_;
  Scheduler* scheduler_ = nullptr;
  kvtransfer::Transport* transport_ = nullptr;
  std::unique_ptr<DecodeService> decode_;
  std::unique_ptr<PrefillService> prefill_;
  server::GrpcServer grpc_;
  std::string address_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;  // guarded by mu_
  std::atomic<bool> migrate_on_deregister_{false};
  std::thread registration_;
  // How often dns:/// router names are looked up again.
  static constexpr absl::Duration kRouterLookupInterval = absl::Seconds(5);
};

// The whole process: flags, model loading, KV cache, transport, scheduler,
// server; runs until SIGINT or SIGTERM. `program` is "pdq-prefill" or
// "pdq-decode", whose default role is `default_role`.
int WorkerMain(int argc, char** argv, const char* program, Role default_role);

}  // namespace pdq::worker
