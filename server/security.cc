#include "server/security.h"

#include <grpcpp/support/client_interceptor.h>

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace pdq::server {
namespace {

absl::StatusOr<std::string> ReadPem(const std::string& flag, const std::string& path,
                                    const char* marker) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("--", flag, ": cannot read ", path));
  std::stringstream s;
  s << in.rdbuf();
  std::string text = s.str();
  if (!absl::StrContains(text, marker)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, ": ", path, " is not a PEM file (no '", marker, "')"));
  }
  return text;
}

absl::StatusOr<TlsPem> ReadAll(const TlsFiles& f) {
  TlsPem pem;
  if (!f.ca.empty()) {
    absl::StatusOr<std::string> ca = ReadPem("tls-ca", f.ca, "-----BEGIN CERTIFICATE-----");
    if (!ca.ok()) return ca.status();
    pem.ca = std::move(*ca);
  }
  if (!f.cert.empty()) {
    absl::StatusOr<std::string> cert = ReadPem("tls-cert", f.cert, "-----BEGIN CERTIFICATE-----");
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = ReadPem("tls-key", f.key, "PRIVATE KEY-----");
    if (!key.ok()) return key.status();
    pem.cert = std::move(*cert);
    pem.key = std::move(*key);
  }
  return pem;
}

// Equal strings, in time that depends only on the lengths.
bool SameKey(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= (unsigned char)(a[i] ^ b[i]);
  return diff == 0;
}

// Sends "authorization: Bearer KEY" with every call of a channel.
class ApiKeyInterceptor : public grpc::experimental::Interceptor {
 public:
  explicit ApiKeyInterceptor(const std::string& header) : header_(header) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->insert({"authorization", header_});
    }
    methods->Proceed();
  }

 private:
  const std::string header_;
};

class ApiKeyInterceptorFactory : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit ApiKeyInterceptorFactory(const std::string& key) : header_("Bearer " + key) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo*) override {
    return new ApiKeyInterceptor(header_);
  }

 private:
  const std::string header_;
};

}  // namespace

absl::StatusOr<std::optional<TlsPem>> LoadServerTls(const TlsFiles& f) {
  const int given = !f.cert.empty() + !f.key.empty() + !f.ca.empty();
  if (given == 0) return std::nullopt;
  if (given != 3) {
    return absl::InvalidArgumentError(
        "--tls-cert, --tls-key and --tls-ca go together: the certificate and key are this "
        "process's identity, the CA is what its peers' certificates are checked against");
  }
  absl::StatusOr<TlsPem> pem = ReadAll(f);
  if (!pem.ok()) return pem.status();
  return std::optional<TlsPem>(std::move(*pem));
}

absl::StatusOr<std::optional<TlsPem>> LoadClientTls(const TlsFiles& f) {
  if (f.cert.empty() != f.key.empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key go together");
  }
  if (f.ca.empty()) {
    if (!f.cert.empty()) {
      return absl::InvalidArgumentError(
          "--tls-cert needs --tls-ca: the CA the server's certificate is checked against");
    }
    return std::nullopt;
  }
  absl::StatusOr<TlsPem> pem = ReadAll(f);
  if (!pem.ok()) return pem.status();
  return std::optional<TlsPem>(std::move(*pem));
}

std::shared_ptr<grpc::ServerCredentials> ServerCredentials(const std::optional<TlsPem>& tls,
                                                           ClientCerts mode) {
  if (!tls) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions o(
      mode == ClientCerts::kRequired ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                                     : GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
  o.pem_root_certs = tls->ca;
  o.pem_key_cert_pairs.push_back({tls->key, tls->cert});
  return grpc::SslServerCredentials(o);
}

std::shared_ptr<grpc::Channel> Dial(const std::string& address, const Dialing& how) {
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  grpc::ChannelArguments args;
  if (how.tls) {
    grpc::SslCredentialsOptions o;
    o.pem_root_certs = how.tls->ca;
    o.pem_private_key = how.tls->key;
    o.pem_cert_chain = how.tls->cert;
    credentials = grpc::SslCredentials(o);
    if (!how.server_name.empty()) args.SetSslTargetNameOverride(how.server_name);
  }
  if (how.api_key.empty()) return grpc::CreateCustomChannel(address, credentials, args);
  // An interceptor rather than call credentials, which gRPC sends only over
  // TLS: a key on loopback in plaintext is the user's choice.
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(std::make_unique<ApiKeyInterceptorFactory>(how.api_key));
  return grpc::experimental::CreateCustomChannelWithInterceptors(address, credentials, args,
                                                                 std::move(interceptors));
}

bool PeerHasCertificate(const grpc::ServerContextBase& ctx) {
  const std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context();
  return auth != nullptr && auth->IsPeerAuthenticated();
}

bool IsKeyText(absl::string_view s) {
  for (char c : s) {
    if (c <= ' ' || c >= 127) return false;
  }
  return true;
}

absl::StatusOr<ApiKeys> ApiKeys::FromLines(absl::string_view text, const std::string& what) {
  ApiKeys out;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    if (!IsKeyText(line) || line.size() < 16 || line.size() > 256) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " line ", line_number,
                       ": a key has 16 to 256 printable ASCII characters without spaces"));
    }
    out.keys_.emplace_back(line);
  }
  if (out.keys_.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " holds no key"));
  }
  return out;
}

absl::StatusOr<ApiKeys> ApiKeys::Load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("--api-key-file: cannot read ", path));
  std::stringstream s;
  s << in.rdbuf();
  return FromLines(s.str(), absl::StrCat("--api-key-file ", path));
}

absl::Status ApiKeys::Check(absl::string_view authorization) const {
  if (keys_.empty()) return absl::OkStatus();
  if (authorization.empty()) {
    return absl::UnauthenticatedError(
        "an API key is required: send 'authorization: Bearer KEY' (pdq commands: --api-key or "
        "PDQ_API_KEY)");
  }
  absl::string_view key = authorization;
  if (!absl::ConsumePrefix(&key, "Bearer ") && !absl::ConsumePrefix(&key, "bearer ")) {
    return absl::UnauthenticatedError("the authorization is not of the form 'Bearer KEY'");
  }
  key = absl::StripAsciiWhitespace(key);
  bool accepted = false;
  for (const std::string& k : keys_) accepted |= SameKey(k, key);  // no early exit
  if (!accepted) return absl::UnauthenticatedError("the API key is not valid");
  return absl::OkStatus();
}

absl::Status ApiKeys::Check(const grpc::ServerContextBase& ctx) const {
  if (keys_.empty()) return absl::OkStatus();
  const auto& md = ctx.client_metadata();
  auto it = md.find("authorization");
  if (it == md.end()) return Check(absl::string_view());
  return Check(absl::string_view(it->second.data(), it->second.size()));
}

}  // namespace pdq::server
