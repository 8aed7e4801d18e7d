// Which routers a worker registers with. `--router` is a comma-separated
// list; each entry is a router's host:port, or `dns:///NAME:PORT`, a name
// looked up again and again whose every address is a router (a Kubernetes
// headless Service over the router pods). Every router then knows every
// worker, so any number of router replicas serve the same pools.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace pdq::worker {

struct RouterEntry {
  std::string host;  // a name or address (IPv6 without brackets)
  std::string port;
  bool dns = false;  // dns:///: every address of `host` is a router
};

// The entries of a --router list; InvalidArgument naming the bad entry.
absl::StatusOr<std::vector<RouterEntry>> ParseRouterList(const std::string& list);

// One router to register with: where to dial and the name its TLS
// certificate must carry (the entry's host, also when dialed by address).
struct RouterTarget {
  std::string address;  // host:port ([v6]:port)
  std::string tls_name;
  bool operator==(const RouterTarget&) const = default;
};

// Looks a name up: its addresses (IPv4 dotted, IPv6 without brackets), or
// an error. SystemResolve uses getaddrinfo.
using Resolver = std::function<absl::StatusOr<std::vector<std::string>>(const std::string& host)>;
absl::StatusOr<std::vector<std::string>> SystemResolve(const std::string& host);

// The targets of `entries` now, in entry order, without repeats. A dns:///
// entry that cannot be looked up keeps the addresses it had in `previous`
// (a lookup that fails for a moment does not drop registered routers); its
// error is appended to `errors`.
std::vector<RouterTarget> ResolveRouterTargets(const std::vector<RouterEntry>& entries,
                                               const Resolver& resolve,
                                               const std::vector<RouterTarget>& previous,
                                               std::vector<std::string>* errors);

}  // namespace pdq::worker
