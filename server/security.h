// Who may talk to whom. On a cluster the workers' ports are reachable by
// other tenants, so pdq can run with:
// - mutual TLS between the router and the workers: every process holds a
//   certificate signed by one CA; workers accept only peers presenting one
//   (the router, and nothing else calls them), and the router's Registry
//   accepts only workers presenting one;
// - TLS on the router's public port and HTTP API, where clients verify the
//   router's certificate and prove themselves with an API key
//   ("authorization: Bearer KEY"), not a certificate;
// - the KV data port, which already accepts only connections carrying a
//   transfer token the router handed out (kvtransfer/transport.h).
// With no certificate files everything is plaintext, as on loopback.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pdq::server {

// PEM file paths: this process's certificate chain and key (its identity)
// and the CA bundle peers are checked against.
struct TlsFiles {
  std::string cert, key, ca;
};

// Their contents.
struct TlsPem {
  std::string cert, key, ca;
};

// A server (router, worker) needs all three files or none: nullopt means
// plaintext. Errors name the flag and the file.
absl::StatusOr<std::optional<TlsPem>> LoadServerTls(const TlsFiles& files);
// A client needs the CA to use TLS (cert and key are optional, together):
// nullopt when no file is given.
absl::StatusOr<std::optional<TlsPem>> LoadClientTls(const TlsFiles& files);

enum class ClientCerts {
  kVerifiedIfPresented,  // the router: clients prove themselves with keys
  kRequired,             // workers: only the router calls them
};
std::shared_ptr<grpc::ServerCredentials> ServerCredentials(const std::optional<TlsPem>& tls,
                                                           ClientCerts mode);

// How to reach a server: plaintext without `tls`; with it, the server's
// certificate must be signed by tls->ca and name `server_name` (empty: the
// host dialed), and tls->cert, when present, is this client's identity.
// `api_key`, when set, goes with every call as "authorization: Bearer KEY".
struct Dialing {
  std::optional<TlsPem> tls;
  std::string server_name;
  std::string api_key;
};
std::shared_ptr<grpc::Channel> Dial(const std::string& address, const Dialing& how);

// Whether the caller presented a certificate the server verified.
bool PeerHasCertificate(const grpc::ServerContextBase& ctx);

// Printable ASCII without spaces: what an API key may hold.
bool IsKeyText(absl::string_view s);

// The keys the router accepts on its public API. Empty: no check.
class ApiKeys {
 public:
  ApiKeys() = default;
  // One key per line; blank lines and lines starting with '#' are skipped.
  // A key has 16 to 256 printable ASCII characters without spaces.
  static absl::StatusOr<ApiKeys> Load(const std::string& path);
  static absl::StatusOr<ApiKeys> FromLines(absl::string_view text, const std::string& what);

  bool required() const { return !keys_.empty(); }
  // OK, or UNAUTHENTICATED saying what is missing or wrong. `authorization`
  // is the header's value ("Bearer KEY"); compared in constant time.
  absl::Status Check(absl::string_view authorization) const;
  // Check on a call's "authorization" metadata.
  absl::Status Check(const grpc::ServerContextBase& ctx) const;

 private:
  std::vector<std::string> keys_;
};

}  // namespace pdq::server
