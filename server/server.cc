#include "server/server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>

#include <csignal>
#include <cstdio>
#include <fstream>

#include "absl/strings/str_cat.h"

namespace pdq::server {

absl::StatusOr<GrpcServer> StartGrpcServer(const std::string& listen,
                                           const std::vector<grpc::Service*>& services) {
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("listen address '", listen, "' has no port (want host:port)"));
  }
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &port);
  builder.SetMaxReceiveMessageSize(kMaxRequestBytes);
  for (grpc::Service* s : services) builder.RegisterService(s);
  GrpcServer out;
  out.server = builder.BuildAndStart();
  if (out.server == nullptr || port == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", listen, " (address in use or not local?)"));
  }
  out.server->GetHealthCheckService()->SetServingStatus(true);
  out.address = absl::StrCat(listen.substr(0, colon), ":", port);
  return out;
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

std::string WaitForStopSignal() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  int sig = 0;
  while (sigwait(&set, &sig) != 0) {
  }
  return sig == SIGINT ? "SIGINT" : "SIGTERM";
}

}  // namespace pdq::server
