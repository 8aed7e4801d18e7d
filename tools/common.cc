// Shared plumbing of the pdq subcommands: errors, parsing, connections.
#include <cstdio>
#include <cstdlib>

#include "tools/commands.h"

namespace pdq {

int Fail(const std::string& command, const absl::Status& status) {
  std::fprintf(stderr, "pdq %s: error: %s\n", command.c_str(),
               std::string(status.message()).c_str());
  return 1;
}

int ParseOrExit(FlagParser& flags, int argc, char** argv) {
  return ParseOrExit(flags, argc, argv, 2, std::string("pdq ") + argv[1]);
}

void ConnectionFlags::Register(FlagParser& flags) {
  if (const char* k = std::getenv("PDQ_API_KEY")) api_key = k;
  flags.String("tls-ca", &tls.ca,
               "PEM CA bundle: talk TLS and check the server's certificate against it (default: "
               "plaintext)");
  flags.String("tls-cert", &tls.cert,
               "PEM certificate chain to present (with --tls-key), where the server asks for one");
  flags.String("tls-key", &tls.key, "PEM private key of --tls-cert");
  flags.String("tls-server-name", &server_name,
               "the name the server's certificate must carry (default: the host dialed)");
  flags.String("api-key", &api_key,
               "sent as 'authorization: Bearer KEY' with every call (default: $PDQ_API_KEY)");
}

absl::StatusOr<server::Dialing> ConnectionFlags::Dialing() const {
  if (!server::IsKeyText(api_key)) {
    return absl::InvalidArgumentError(
        "--api-key (or PDQ_API_KEY) must be printable ASCII without spaces");
  }
  absl::StatusOr<std::optional<server::TlsPem>> pem = server::LoadClientTls(tls);
  if (!pem.ok()) return pem.status();
  return server::Dialing{std::move(*pem), server_name, api_key};
}

std::vector<int32_t> BenchTokens(int64_t n, int vocab, uint64_t salt) {
  std::vector<int32_t> ids(n);
  uint64_t x = 88172645463325252ull ^ salt;
  for (int64_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    ids[i] = (int32_t)(x % (uint64_t)vocab);
  }
  return ids;
}

}  // namespace pdq
