// An HTTP server (cpp-httplib) on its own thread, for /metrics and the
// router's OpenAI-compatible API: routes are added to http() before Start.
// HTTPS when given a certificate and key.
#pragma once

#include <httplib.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"

namespace pdq::server {

class HttpServer {
 public:
  HttpServer() : http_(std::make_unique<httplib::Server>()) {}
  // HTTPS with the PEM certificate chain and key at these paths (Start
  // fails, naming them, when they cannot be used).
  HttpServer(const std::string& cert_path, const std::string& key_path);
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;
  ~HttpServer();  // stops serving and joins the threads

  httplib::Server& http() { return *http_; }
  // Binds `listen` ("host:port", port 0: a free one) with SO_REUSEADDR only
  // (httplib's default adds SO_REUSEPORT, which would let a second process
  // bind the same port and take half the connections) and serves on
  // `threads` threads; `what` names the server in errors.
  absl::Status Start(const std::string& listen, int threads, const std::string& what);
  const std::string& address() const { return address_; }  // the port resolved

 private:
  std::unique_ptr<httplib::Server> http_;
  std::string tls_error_;  // why the certificate could not be used
  std::string address_;
  std::atomic<bool> loop_ended_{false};
  std::thread thread_;
};

}  // namespace pdq::server
