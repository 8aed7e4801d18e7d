#include "server/server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <unistd.h>

#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace pdq::server {

namespace {

// The port of "host:port", or an error naming the flag's value.
absl::StatusOr<std::string> HostOf(const std::string& listen) {
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("listen address '", listen, "' has no port (want host:port)"));
  }
  return listen.substr(0, colon);
}

absl::StatusOr<std::pair<std::unique_ptr<grpc::Server>, std::string>> Build(
    const std::string& listen, std::shared_ptr<grpc::ServerCredentials> credentials,
    const std::vector<grpc::Service*>& services) {
  absl::StatusOr<std::string> host = HostOf(listen);
  if (!host.ok()) return host.status();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(listen, std::move(credentials), &port);
  builder.SetMaxReceiveMessageSize(kMaxRequestBytes);
  for (grpc::Service* s : services) builder.RegisterService(s);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", listen, " (address in use or not local?)"));
  }
  server->GetHealthCheckService()->SetServingStatus(true);
  return std::make_pair(std::move(server), absl::StrCat(*host, ":", port));
}

}  // namespace

absl::StatusOr<GrpcServer> StartGrpcServer(const GrpcServerOptions& options,
                                           const std::vector<grpc::Service*>& services) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  GrpcServer out;
  auto main = Build(options.listen,
                    options.credentials ? options.credentials : grpc::InsecureServerCredentials(),
                    services);
  if (!main.ok()) return main.status();
  std::tie(out.server, out.address) = std::move(*main);
  if (!options.health_listen.empty()) {
    auto health = Build(options.health_listen, grpc::InsecureServerCredentials(), {});
    if (!health.ok()) {
      out.server->Shutdown();
      return absl::Status(health.status().code(),
                          absl::StrCat("--health-listen: ", health.status().message()));
    }
    std::tie(out.health_server, out.health_address) = std::move(*health);
  }
  return out;
}

void GrpcServer::SetServing(bool serving) {
  if (server) server->GetHealthCheckService()->SetServingStatus(serving);
  if (health_server) health_server->GetHealthCheckService()->SetServingStatus(serving);
}

void GrpcServer::Shutdown(std::chrono::seconds grace) {
  if (health_server) health_server->Shutdown(std::chrono::system_clock::now());
  if (server) server->Shutdown(std::chrono::system_clock::now() + grace);
}

void WriteAddressFile(const std::string& path, const std::string& address) {
  const std::string tmp = path + ".tmp";
  std::ofstream(tmp) << address << "\n";
  std::rename(tmp.c_str(), path.c_str());
}

void WriteAddressFiles(const std::string& path, const std::string& address,
                       const std::vector<AddressFile>& others) {
  for (const AddressFile& f : others) {
    if (!f.path.empty()) WriteAddressFile(f.path, f.address);
  }
  if (!path.empty()) WriteAddressFile(path, address);
}

void BlockStopSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);
}

namespace {

int AwaitStopSignal() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  int sig = 0;
  while (sigwait(&set, &sig) != 0) {
  }
  return sig;
}

const char* SignalName(int sig) { return sig == SIGINT ? "SIGINT" : "SIGTERM"; }

// The start-up watcher's state; leaked, since its thread outlives main.
struct StopWatch {
  std::mutex mu;
  std::condition_variable cv;
  std::string doing;     // what start-up is doing, for the log line
  bool serving = false;  // StopSignalsNowServing or WaitForStopSignal was called
  int signal = 0;        // the signal received once serving
};
StopWatch* watch = nullptr;

}  // namespace

void ExitOnStopSignalUntilServing(const std::string& doing) {
  if (watch != nullptr) return;
  watch = new StopWatch;
  watch->doing = doing;
  // One thread owns sigwait from here on; WaitForStopSignal takes its
  // signal. Until then a signal ends the process: _exit, because the main
  // thread is mid-load and nothing it holds may be torn down under it.
  std::thread([] {
    for (;;) {
      const int sig = AwaitStopSignal();
      std::unique_lock<std::mutex> lock(watch->mu);
      if (!watch->serving) {
        LogLine(absl::StrCat(SignalName(sig), " while ", watch->doing, ": stopped before serving"));
        std::fflush(nullptr);
        _exit(0);
      }
      if (watch->signal == 0) watch->signal = sig;
      watch->cv.notify_all();
    }
  }).detach();
}

void StopSignalsNowServing() {
  if (watch == nullptr) return;
  std::lock_guard<std::mutex> lock(watch->mu);
  watch->serving = true;
}

std::string WaitForStopSignal() {
  if (watch == nullptr) return SignalName(AwaitStopSignal());
  std::unique_lock<std::mutex> lock(watch->mu);
  watch->serving = true;
  watch->cv.wait(lock, [] { return watch->signal != 0; });
  return SignalName(watch->signal);
}

}  // namespace pdq::server
