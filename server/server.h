// What every pdq server process shares: a gRPC server with grpc.health.v1 and
// reflection, bounded message sizes and a resolved address; and the signals
// that stop it.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace pdq::server {

struct GrpcServer {
  std::unique_ptr<grpc::Server> server;
  std::string address;  // host:port, the port resolved
  // The plaintext health-only server, when one was asked for.
  std::unique_ptr<grpc::Server> health_server;
  std::string health_address;
  // Sets grpc.health.v1's answer on both.
  void SetServing(bool serving);
  // Stops both, ending calls still running after `grace`.
  void Shutdown(std::chrono::seconds grace);
};

struct GrpcServerOptions {
  std::string listen;  // host:port; port 0 picks a free one
  // TLS or plaintext (security.h); null: plaintext.
  std::shared_ptr<grpc::ServerCredentials> credentials;
  // A second host:port serving only grpc.health.v1, in plaintext, for
  // probes that cannot speak TLS (Kubernetes' gRPC probes); it reveals
  // nothing but whether the process serves. Empty: none.
  std::string health_listen;
};

// Largest request a server accepts; a bigger one gets RESOURCE_EXHAUSTED.
constexpr int kMaxRequestBytes = 4 << 20;

// Starts serving `services` as `options` say, plus the standard health
// service (reporting SERVING) and reflection.
absl::StatusOr<GrpcServer> StartGrpcServer(const GrpcServerOptions& options,
                                           const std::vector<grpc::Service*>& services);

// Writes "address\n" to `path` through a rename, so a reader polling for the
// file never sees it half written.
void WriteAddressFile(const std::string& path, const std::string& address);
// A ready server's address files, each where a path is given: the others
// (/metrics, HTTP) first, then gRPC, since readers (pdq up, the tests) wait
// for the gRPC file and then read the others.
struct AddressFile {
  std::string path, address;
};
void WriteAddressFiles(const std::string& path, const std::string& address,
                       const std::vector<AddressFile>& others);

// Blocks SIGINT and SIGTERM in this thread and every thread it starts
// later, and ignores SIGPIPE (a peer that hangs up mid-response must fail
// that write, not end the process); call first thing in main.
void BlockStopSignals();
// From now until WaitForStopSignal is called, SIGINT or SIGTERM ends the
// process at once (exit status 0) with a log line saying it stopped while
// `doing`: a process still loading or calibrating a model holds no request
// to lose, and an orchestrator expects it gone within seconds, not after
// minutes of calibration. Call after BlockStopSignals, before the slow part.
void ExitOnStopSignalUntilServing(const std::string& doing);
// Ends that: a signal from now on is kept for WaitForStopSignal (the
// process drains). Call before the server can take a request.
void StopSignalsNowServing();
// Waits for SIGINT or SIGTERM (blocked by BlockStopSignals); returns its name.
std::string WaitForStopSignal();

}  // namespace pdq::server
