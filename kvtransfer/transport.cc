// The backend registry: the one place that knows every KV transport.
#include "kvtransfer/transport.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/hash.h"
#include "kvtransfer/tcp/tcp_transport.h"
#include "kvtransfer/ucx/ucx_transport.h"

namespace pdq::kvtransfer {
namespace {

struct Backend {
  const char* name;
  absl::StatusOr<std::unique_ptr<Transport>> (*create)(const TransportOptions&);
};
constexpr Backend kBackends[] = {
    {"tcp", &TcpTransport::Create},
    {"ucx", &UcxTransport::Create},
};

}  // namespace

std::vector<std::string> TransportNames() {
  std::vector<std::string> names;
  for (const Backend& b : kBackends) names.emplace_back(b.name);
  return names;
}

absl::StatusOr<std::unique_ptr<Transport>> CreateTransport(const std::string& name,
                                                           const TransportOptions& options) {
  for (const Backend& b : kBackends) {
    if (name == b.name) return b.create(options);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown KV transport '", name, "' (known: ", absl::StrJoin(TransportNames(), ", "), ")"));
}

uint64_t ChecksumSpans(const std::vector<KvRegion>& regions, const std::vector<KvSpan>& spans,
                       uint64_t seed) {
  for (const KvSpan& s : spans) {
    seed = Hash64Lanes(regions[s.region].data + s.offset, s.bytes, seed);
  }
  return seed;
}

}  // namespace pdq::kvtransfer
