#include "server/http_server.h"

#include <sys/socket.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace pdq::server {

HttpServer::HttpServer(const std::string& cert_path, const std::string& key_path) {
  auto https = std::make_unique<httplib::SSLServer>(cert_path.c_str(), key_path.c_str());
  if (!https->is_valid()) {
    tls_error_ = absl::StrCat("cannot use the certificate ", cert_path, " with the key ", key_path,
                              " for HTTPS");
  }
  http_ = std::move(https);
}

HttpServer::~HttpServer() {
  http_->stop();
  if (thread_.joinable()) thread_.join();
}

absl::Status HttpServer::Start(const std::string& listen, int threads, const std::string& what) {
  const size_t colon = listen.rfind(':');
  int port = -1;
  if (colon == std::string::npos || !absl::SimpleAtoi(listen.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " address '", listen, "' is not host:port"));
  }
  if (!tls_error_.empty()) return absl::InvalidArgumentError(absl::StrCat(what, ": ", tls_error_));
  const std::string host = listen.substr(0, colon);
  http_->set_socket_options([](int sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  http_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  const bool bound =
      port == 0 ? (port = http_->bind_to_any_port(host)) > 0 : http_->bind_to_port(host, port);
  if (!bound) {
    return absl::UnavailableError(absl::StrCat("cannot listen for ", what, " on ", listen,
                                               " (address in use or not local?)"));
  }
  address_ = absl::StrCat(host, ":", port);
  thread_ = std::thread([this] {
    http_->listen_after_bind();
    loop_ended_ = true;
  });
  // stop() before the loop runs would be lost; wait until it runs.
  // (A loop that ends at once, failing, must not leave this spinning.)
  while (!http_->is_running() && !loop_ended_) std::this_thread::yield();
  if (loop_ended_) {
    return absl::UnavailableError(absl::StrCat("serving ", what, " on ", address_, " failed"));
  }
  return absl::OkStatus();
}

}  // namespace pdq::server
